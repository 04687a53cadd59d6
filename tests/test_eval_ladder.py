"""docs/results/ladder.json records: a backtest's held-out rows joined with the run's training cost."""

import json
from pathlib import Path

import pytest

from r1trade.cli import main
from r1trade.errors import UsageError
from r1trade.eval.ladder import add_record, ladder_record, summarise, training_cost


def _row(accuracy: float | None, ret: float) -> dict:
    return {"Return [%]": ret, "Direction Accuracy [%]": accuracy, "Sharpe Ratio": 0.1}


def _fixture(tmp_path: Path) -> tuple[Path, Path]:
    report = tmp_path / "report"
    report.mkdir()
    (report / "metrics.json").write_text(json.dumps({
        "decisions": {"count": 240, "every": 4},
        "strategies": {
            "agent (step-3)": {**_row(78.75, 12.5), "Info Calls [%]": 92.5, "Tool Calls: get_changes [%]": 90.0,
                               "Action Mix: Forced Hold [%]": 2.5,
                               "Direction Accuracy, decision 1 [%]": 80.0,
                               "Direction Accuracy, decision 2 [%]": 77.5},
            "base model": {**_row(50.0, -1.25), "Direction Accuracy, decision 1 [%]": 50.0,
                           "Action Mix: Forced Hold [%]": 30.0},
            "oracle": _row(80.0, 20.0),
            "buy_and_hold": _row(None, 3.0),
        },
    }))
    run = tmp_path / "run"
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    updates = [  # update 3 logged twice (the run was resumed before its checkpoint): the last line counts
        {"update": 1, "rollout_seconds": 60, "score_seconds": 30, "update_seconds": 90},
        {"update": 2, "rollout_seconds": 50, "score_seconds": 20, "update_seconds": 50},
        {"update": 3, "rollout_seconds": 999, "score_seconds": 0, "update_seconds": 0},
        {"update": 3, "rollout_seconds": 40, "score_seconds": 20, "update_seconds": 60},
        {"update": 4, "rollout_seconds": 40, "score_seconds": 20, "update_seconds": 60},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(u) + "\n" for u in updates))
    return report, run / "checkpoints" / "step-3"


def test_a_record_joins_held_out_rows_with_the_training_cost(tmp_path: Path) -> None:
    report, checkpoint = _fixture(tmp_path)
    assert training_cost(checkpoint) == (3, 420.0)  # 180 + 120 + 120 seconds; update 4 came after step-3
    record = ladder_record(report, checkpoint, level="planted_edge", variant="rloo", model="SmolLM2 + LoRA",
                           command="r1trade backtest ...")
    assert record == {
        "level": "planted_edge", "variant": "rloo", "model": "SmolLM2 + LoRA", "heldout_decisions": 240,
        "direction_accuracy": 0.7875, "return_pct": 12.5, "warmstart_direction_accuracy": 0.5,
        "warmstart_return_pct": -1.25, "oracle_return_pct": 20.0, "buy_and_hold_return_pct": 3.0,
        "info_call_rate": 0.925, "warmstart_info_call_rate": None,  # the warm start's row has no Info Calls
        "signal_call_rate": 0.9, "warmstart_signal_call_rate": None,
        "forced_hold_rate": 0.025, "warmstart_forced_hold_rate": 0.3,
        "direction_accuracy_by_decision": [0.8, 0.775], "seed": None,  # 2-decision windows: 80 % then 77.5 %
        "mandate_penalty": None, "warmstart_mandate_penalty": None, "vol_target_rule_penalty": None,
        "best_constant_penalty": None, "vol_forecast_penalty": None, "realised_volatility_pct": None,
        "size_volatility_correlation": None, "target_volatility_pct": None, "updates": 3, "train_minutes": 7.0, "command": "r1trade backtest ...",
    }


def test_a_policy_that_never_called_get_changes_has_a_signal_rate_of_0(tmp_path: Path) -> None:
    report, checkpoint = _fixture(tmp_path)
    document = json.loads((report / "metrics.json").read_text())
    agent = document["strategies"]["agent (step-3)"]
    agent["Tool Calls: get_changes [%]"] = 0.0  # offered and never called: the report says 0
    agent["Tool Calls: get_indicators [%]"] = 92.5
    (report / "metrics.json").write_text(json.dumps(document))
    record = ladder_record(report, checkpoint, level="tool_gated", variant="v", model="m", command="c")
    assert record["signal_call_rate"] == 0.0
    assert record["warmstart_signal_call_rate"] is None  # its row has no information rows at all


def test_a_mandate_record_holds_the_penalties_of_the_agent_its_warm_start_and_the_baselines(
    tmp_path: Path, capsys
) -> None:
    report, checkpoint = _fixture(tmp_path)
    document = json.loads((report / "metrics.json").read_text())
    rows = document["strategies"]
    penalty = lambda value, volatility=None: {"Mandate Penalty": value, "Realised Volatility [%]": volatility,
                                              "Target Volatility [%]": 40.0}
    rows["agent (step-3)"].update({**penalty(0.25, 41.5), "Size-Volatility Rank Correlation": -0.4})
    rows["base model"].update(penalty(0.75))
    rows["vol_target"] = {**_row(None, 5.0), **penalty(0.2)}
    rows["best_constant"] = {**_row(None, 4.0), **penalty(0.45)}
    rows["vol_forecast"] = {**_row(None, 4.5), **penalty(0.3)}
    (report / "metrics.json").write_text(json.dumps(document))
    record = ladder_record(report, checkpoint, level="vol_target", variant="v", model="m", command="c", seed=1)
    fields = ("level", "mandate_penalty", "warmstart_mandate_penalty", "vol_target_rule_penalty",
              "best_constant_penalty", "vol_forecast_penalty", "realised_volatility_pct", "target_volatility_pct",
              "size_volatility_correlation")
    assert {k: record[k] for k in fields} == {
        "level": "vol_target", "mandate_penalty": 0.25, "warmstart_mandate_penalty": 0.75,
        "vol_target_rule_penalty": 0.2, "best_constant_penalty": 0.45, "vol_forecast_penalty": 0.3,
        "realised_volatility_pct": 41.5, "target_volatility_pct": 40.0, "size_volatility_correlation": -0.4,
    }
    path = tmp_path / "ladder.json"
    add_record(path, record)
    add_record(path, {**record, "seed": 2, "mandate_penalty": 0.35})
    older = {key: value for key, value in record.items()
             if key not in ("vol_forecast_penalty", "size_volatility_correlation")}
    add_record(path, {**older, "seed": 3, "mandate_penalty": 0.3})  # a record from before vol_forecast
    assert main(["ladder-summary", "--level", "vol_target", "--ladder", str(path)]) == 0
    out = capsys.readouterr().out
    # penalties 0.25, 0.35 and 0.3: mean 0.300, sd 0.05; vol_forecast's 0.3 over the two records that hold it
    assert "| Mandate Penalty |" in out and "0.300 ± 0.050 [0.250, 0.350]" in out and "0.450" in out
    assert "| vol_forecast's |" in out
    assert "| Realised Volatility [%] | size-volatility ρ | Return [%] |" in out
    assert "| -0.400 ± 0.000 [-0.400, -0.400] |" in out  # as it is, over the two records that hold it


def test_records_replace_their_level_and_variant_and_keep_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "results" / "ladder.json"
    base = {"level": "planted_edge", "variant": "a", "updates": 1}
    add_record(path, base)
    add_record(path, {**base, "variant": "b"})
    records = add_record(path, {**base, "updates": 2})
    assert [(r["variant"], r["updates"]) for r in records] == [("b", 1), ("a", 2)]
    assert json.loads(path.read_text()) == records


def test_seeds_of_one_variant_are_kept_apart_and_summarised_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "ladder.json"
    for seed, accuracy, ret in ((0, 0.60, 10.0), (1, 0.70, 30.0), (2, 0.65, -10.0), (2, 0.80, 20.0)):
        add_record(path, {"level": "tool_gated", "variant": "ablation/full", "seed": seed,
                          "direction_accuracy": accuracy, "return_pct": ret, "info_call_rate": 1.0,
                          "signal_call_rate": None})
    add_record(path, {"level": "tool_gated", "variant": "other", "seed": None, "direction_accuracy": 0.5})
    add_record(path, {"level": "btc", "variant": "ablation/full", "seed": 0, "direction_accuracy": 0.5})
    records = json.loads(path.read_text())
    assert len(records) == 5  # the second seed-2 record replaced the first
    (row,) = summarise(records, level="tool_gated", prefix="ablation/")
    assert row["variant"] == "ablation/full" and row["seeds"] == [0, 1, 2]
    # accuracies 0.60, 0.70, 0.80: mean 0.70, sample sd sqrt((0.01 + 0 + 0.01) / 2) = 0.1
    assert row["direction_accuracy"] == pytest.approx({"mean": 0.7, "sd": 0.1, "min": 0.6, "max": 0.8, "n": 3})
    # returns 10, 30, 20: mean 20, sd sqrt((100 + 100 + 0) / 2) = 10
    assert row["return_pct"] == pytest.approx({"mean": 20.0, "sd": 10.0, "min": 10.0, "max": 30.0, "n": 3})
    assert row["info_call_rate"] == {"mean": 1.0, "sd": 0.0, "min": 1.0, "max": 1.0, "n": 3}
    assert row["signal_call_rate"] is None
    assert row["forced_hold_rate"] is None  # records written before the field existed


def test_the_summary_command_prints_mean_spread_and_range(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ladder.json"
    for seed, accuracy in ((0, 0.6), (1, 0.8)):
        add_record(path, {"level": "tool_gated", "variant": "ablation/grpo", "seed": seed,
                          "direction_accuracy": accuracy, "return_pct": 5.0})
    assert main(["ladder-summary", "--level", "tool_gated", "--ladder", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ablation/grpo" in out and "70.0 ± 14.1 [60.0, 80.0]" in out  # sd of 60, 80: 10·√2
    assert "| Forced Holds [%] |" in out and "| — |" in out  # a column these records lack
    assert main(["ladder-summary", "--level", "btc", "--ladder", str(path)]) != 0
    assert "has no btc records" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    ('{"level": "btc"}', "is not a JSON list"),
    ("[1, 2]", "record 1 is not a ladder record"),
    ('[{"level": "tool_gated", "variant": 7}]', "record 1 is not a ladder record"),
    ('[{"level": "tool_gated", "variant": "a", "direction_accuracy": "high"}]', "'direction_accuracy' that is not"),
])
def test_a_damaged_ladder_is_a_one_line_error(tmp_path: Path, capsys, content: str, message: str) -> None:
    path = tmp_path / "ladder.json"
    path.write_text(content)
    assert main(["ladder-summary", "--level", "tool_gated", "--ladder", str(path)]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert path.read_text() == content  # read, never rewritten


def test_bad_inputs_are_one_line_errors(tmp_path: Path, capsys) -> None:
    report, checkpoint = _fixture(tmp_path)
    with pytest.raises(UsageError, match="no row 'warm'"):
        ladder_record(report, checkpoint, level="btc", variant="v", model="m", command="c", warmstart="warm")
    with pytest.raises(UsageError, match="not a checkpoint directory"):
        training_cost(tmp_path)
    with pytest.raises(UsageError, match="lacks updates"):
        training_cost(checkpoint.parent / "step-9")
    args = ["ladder-record", "--report", str(report), "--checkpoint", str(checkpoint), "--level", "bitcoin",
            "--variant", "v", "--command", "c", "--model", "m", "--ladder", str(tmp_path / "l.json")]
    assert main(args) != 0
    assert "--level must be one of planted_edge, btc, tool_gated, multi_decision" in capsys.readouterr().err


def test_the_command_writes_the_ladder(tmp_path: Path, capsys) -> None:
    report, checkpoint = _fixture(tmp_path)
    ladder = tmp_path / "a[/b]" / "ladder.json"  # a folder name that reads as Rich markup is printed as it is
    ladder.parent.mkdir(parents=True)
    args = ["ladder-record", "--report", str(report), "--checkpoint", str(checkpoint), "--level", "planted_edge",
            "--variant", "rloo", "--command", "r1trade backtest", "--model", "m", "--ladder", str(ladder)]
    assert main([*args, "--seed", "2"]) == 0, capsys.readouterr().err
    assert "".join(f"{ladder}: 1 records".split()) in "".join(capsys.readouterr().out.split())
    (record,) = json.loads(ladder.read_text())
    assert record["direction_accuracy"] == 0.7875 and record["updates"] == 3 and record["seed"] == 2


def _damage_report(report: Path, change) -> None:
    document = json.loads((report / "metrics.json").read_text())
    (report / "metrics.json").write_text(json.dumps(change(document)))


@pytest.mark.parametrize("damage, message", [
    (lambda document: list(document), "metrics.json is not a backtest report's metrics: a JSON list"),
    (lambda document: {k: v for k, v in document.items() if k != "decisions"}, "has no 'decisions' count"),
    (lambda document: {**document, "decisions": {"count": "240"}}, "has no 'decisions' count"),
    (lambda document: {**document, "strategies": []}, "has no 'strategies' object of rows"),
    (lambda document: {**document, "strategies": {**document["strategies"], "buy_and_hold": {"Sharpe Ratio": 1}}},
     "row 'buy_and_hold' has no 'Return [%]'"),
    (lambda document: {**document, "strategies": {**document["strategies"], "oracle": _row(80.0, "20")}},
     "row 'oracle' holds a 'Return [%]' that is not a number: '20'"),
])
def test_a_report_that_is_not_a_backtest_report_is_one_line_and_the_ladder_is_kept(
    tmp_path: Path, capsys, damage, message: str
) -> None:
    report, checkpoint = _fixture(tmp_path)
    _damage_report(report, damage)
    ladder = tmp_path / "ladder.json"
    add_record(ladder, {"level": "btc", "variant": "kept"})
    before = ladder.read_bytes()
    args = ["ladder-record", "--report", str(report), "--checkpoint", str(checkpoint), "--level", "btc",
            "--variant", "v", "--command", "c", "--model", "m", "--ladder", str(ladder)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert ladder.read_bytes() == before


@pytest.mark.parametrize("ladder_bytes, message", [
    (bytes(range(256)) * 4, "is not valid JSON: it is not UTF-8 text"),
    (b"\x00" * 64, "is not valid JSON: Expecting value"),  # UTF-8, but NUL bytes
])
def test_a_binary_ladder_file_is_one_line_and_left_as_it_was(
    tmp_path: Path, capsys, ladder_bytes: bytes, message: str
) -> None:
    report, checkpoint = _fixture(tmp_path)
    ladder = tmp_path / "ladder.json"
    ladder.write_bytes(ladder_bytes)
    args = ["ladder-record", "--report", str(report), "--checkpoint", str(checkpoint), "--level", "btc",
            "--variant", "v", "--command", "c", "--model", "m", "--ladder", str(ladder)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert ladder.read_bytes() == ladder_bytes
    assert main(["ladder-summary", "--level", "btc", "--ladder", str(ladder)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("seconds", ['"a minute"', "null", "Infinity"])
def test_a_training_log_whose_times_are_not_numbers_is_one_line(tmp_path: Path, seconds: str) -> None:
    _, checkpoint = _fixture(tmp_path)
    log = checkpoint.parent.parent / "metrics.jsonl"
    lines = log.read_text().splitlines()
    lines[1] = f'{{"update": 2, "rollout_seconds": {seconds}, "score_seconds": 20, "update_seconds": 50}}'
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match="the record of update 2 holds an update or a time in seconds that is not"):
        training_cost(checkpoint)


def test_the_commands_help_names_every_ladder_level_and_only_those() -> None:
    # the help text is written out so that `r1trade --help` need not import the ladder; it must not drift from it
    from r1trade.cli.ladder_commands import LEVEL_HELP
    from r1trade.eval.ladder import LEVELS

    named = LEVEL_HELP.replace(" or ", ", ").split(", ")
    assert named == list(LEVELS)
