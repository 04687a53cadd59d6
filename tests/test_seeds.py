"""`r1trade seeds`: the spread over seeds worked by hand (mean, sd, worst, IQM), the seed list, a report's
figures, and end to end: a finished seed skipped untouched, a seed stopped mid-training resumed from its
checkpoint (not restarted), the warm start stage, restarts (only the run best on validation tested), ladder
records, and one-line refusals."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from r1trade.backtest import step_selection
from r1trade.cli import main
from r1trade.config import load_config
from r1trade.errors import ConfigError, UsageError
from r1trade.eval.seed_spread import SeedSpread, interquartile_mean, seed_spread, spread_by_figure
from r1trade.rl.checkpoint_paths import STATE_FILE
from r1trade.rl.trainer import Trainer
from r1trade.seeds import (
    FIGURES,
    GAIN,
    borrowed_warm_start,
    kept_candidate,
    parse_seeds,
    seed_figures,
    wants_another_run,
    wants_warmstart,
)

TINY = ["train.updates=2", "train.checkpoint_every=1", "train.epochs=1", "train.algorithm=reinforce_pp",
        "env.episode_decisions=1", "env.max_tool_calls=1", "rollout.num_envs=1", "rollout.max_new_tokens=8",
        "model.cpu_kernels=off", "backtest.max_decisions=2", "backtest.agent_windows=1",
        "backtest.bootstrap_resamples=100"]
"""Two one-turn updates with a checkpoint after each, and two-decision backtests: seconds per stage."""
TINY_WARMSTART = ["warmstart.max_steps=2", "warmstart.episodes=1", "warmstart.policy=random",
                  "warmstart.orders=plain", "warmstart.actions=[long,short]", "warmstart.restate=none",
                  "rollout.max_new_tokens=80", "train.updates=1"]
"""Two SFT steps on one episode of the shortest demonstrations (the tiny tokenizer spells their turns in up to
77 tokens), then one update."""


def settings(*items: str) -> list[str]:
    return [part for item in items for part in ("--set", item)]


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def mtimes(folder: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()}


# --------------------------------------------------------------------------- the spread, by hand


def test_five_seeds_by_hand() -> None:
    spread = seed_spread({0: 50.0, 1: 62.0, 2: 40.0, 3: 90.0, 4: 58.0})
    # mean 300 / 5 = 60; deviations -10, 2, -20, 30, -2: squares 100 + 4 + 400 + 900 + 4 = 1408;
    # 1408 / (5 - 1) = 352
    # IQM: floor(5 / 4) = 1 dropped from each end of 40 50 58 62 90: (50 + 58 + 62) / 3 = 56.67
    assert spread == SeedSpread(n=5, mean=60.0, sd=pytest.approx(math.sqrt(352)), worst=40.0, worst_seed=2,
                                iqm=pytest.approx(170 / 3))


def test_four_and_eight_seeds_iqm_by_hand() -> None:
    # 1 2 3 10: one dropped from each end, (2 + 3) / 2; mean 4, squares 9 + 4 + 1 + 36 = 50, sd sqrt(50 / 3)
    four = seed_spread({0: 1.0, 1: 2.0, 2: 3.0, 3: 10.0})
    assert four is not None and (four.iqm, four.mean) == (2.5, 4.0)
    assert four.sd == pytest.approx(math.sqrt(50 / 3))
    # 1 .. 8: two dropped from each end, (3 + 4 + 5 + 6) / 4
    assert interquartile_mean([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]) == 4.5


def test_two_seeds_and_one_by_hand() -> None:
    # mean (0.5 - 1.5) / 2 = -0.5; deviations ±1: sd sqrt(2 / 1); under four seeds no IQM
    assert seed_spread({3: 0.5, 7: -1.5}) == SeedSpread(
        n=2, mean=-0.5, sd=pytest.approx(math.sqrt(2)), worst=-1.5, worst_seed=7, iqm=None
    )
    assert seed_spread({5: 12.0}) == SeedSpread(n=1, mean=12.0, sd=None, worst=12.0, worst_seed=5, iqm=None)
    assert seed_spread({}) is None


def test_the_worst_seed_of_equals_is_the_first() -> None:
    spread = seed_spread({4: 1.0, 2: 1.0, 9: 3.0})
    assert spread is not None and (spread.worst, spread.worst_seed) == (1.0, 2)


def test_a_missing_figure_leaves_out_that_seed_only() -> None:
    per_seed = {0: {"a": 10.0, "b": None}, 1: {"a": 20.0, "b": 4.0}, 2: {"a": math.nan, "b": 6.0}}
    spreads = spread_by_figure(per_seed, ["a", "b", "c"])
    assert spreads["a"] is not None and (spreads["a"].n, spreads["a"].mean) == (2, 15.0)
    b = spreads["b"]
    assert b is not None and (b.n, b.mean, b.worst_seed) == (2, 5.0, 1)
    assert spreads["c"] is None


# --------------------------------------------------------------------------- seeds, warm start, figures


def test_seed_lists() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,2,5") == [0, 2, 5]
    assert parse_seeds(" 7 - 8 , 3") == [7, 8, 3]
    assert parse_seeds("3") == [3]
    for bad in ("", "4-2", "a", "-1", "1,1", "0-2,2", "0-100", "4294967296"):
        with pytest.raises(UsageError, match="bad --seeds"):
            parse_seeds(bad)


def test_the_warm_start_follows_the_config_unless_asked() -> None:
    assert not wants_warmstart(load_config("smoke"), None)  # smoke.yaml has no warmstart section
    assert wants_warmstart(load_config("demo_tools"), None)
    assert wants_warmstart(load_config("smoke", ["warmstart.max_steps=2"]), None)
    assert wants_warmstart(load_config("smoke"), True)
    assert not wants_warmstart(load_config("demo_tools"), False)


def test_figures_of_a_report() -> None:
    document = {"strategies": {
        "agent (step-20)": {"Direction Accuracy [%]": 61.5, "Return [%]": -2.25, "Info Calls [%]": 80.0,
                            "Tool Calls: get_changes [%]": 75.0},
        "base model": {"Direction Accuracy [%]": 45.0, "Return [%]": -9.0},
        "buy_and_hold": {"Direction Accuracy [%]": 51.0, "Return [%]": 7.0},
    }}
    # the gain is over the model RL started from: 61.5 - 45.0 = 16.5 points
    assert seed_figures(document) == {
        "Direction Accuracy [%]": 61.5, GAIN: 16.5, "Return [%]": -2.25, "Info Calls [%]": 80.0,
        "Tool Calls: get_changes [%]": 75.0, "Mandate Penalty": None, "Realised Volatility [%]": None,
    }
    mandate = {"strategies": {"agent (step-10)": {"Mandate Penalty": 0.25, "Realised Volatility [%]": 38.5},
                              "base model": {"Mandate Penalty": 0.6}}}
    assert {k: v for k, v in seed_figures(mandate).items() if v is not None} == {
        "Mandate Penalty": 0.25, "Realised Volatility [%]": 38.5,
    }
    plain = {"strategies": {"agent (step-2)": {"Direction Accuracy [%]": 50.0, "Return [%]": 1.0},
                            "base model": {"Direction Accuracy [%]": None, "Return [%]": 0.5}}}
    figures = seed_figures(plain)
    assert figures[GAIN] is None and figures["Info Calls [%]"] is None and set(figures) == set(FIGURES)
    with pytest.raises(UsageError, match="expected one agent and 'base model'"):
        seed_figures({"strategies": {"agent (step-2)": {}}})


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_finished_seed_is_skipped_and_a_stopped_one_resumed(capsys, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "tiny-seeds"
    command = ["seeds", "--config", "smoke", "--out", str(out), *settings(*TINY)]
    assert main([*command, "--seeds", "0"]) == 0
    seed_0 = out / "seed-0"
    assert (seed_0 / "run" / "checkpoints" / "step-2" / STATE_FILE).is_file()
    assert (seed_0 / "run" / "selected_step.json").is_file() and (seed_0 / "test" / "metrics.json").is_file()
    assert not (seed_0 / "warmstart").exists()  # smoke.yaml has no warmstart section
    assert [r["seed"] for r in json.loads((out / "seeds.json").read_text())["seeds"]] == [0]
    finished = mtimes(seed_0)

    # seed 1 is stopped during its second update (Ctrl-C): the trainer writes the checkpoint of step 1
    original = Trainer.update

    def stopped_in_update_2(self: Trainer) -> dict:
        if self.state.step == 1:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Trainer, "update", stopped_in_update_2)
    capsys.readouterr()
    ladder = out / "ladder.json"
    assert main([*command, "--seeds", "0-1", "--ladder", str(ladder), "--level", "planted_edge"]) == 130
    monkeypatch.undo()
    # seed 0's record was added once it was tested, so seed 1's stop did not lose it
    assert [r["seed"] for r in json.loads(ladder.read_text())] == [0]
    shown = capsys.readouterr()
    assert "seed 0: ladder record written" in shown.out
    assert "training stopped at " in shown.err and "continue with: the same r1trade seeds command" in shown.err
    seed_1 = out / "seed-1" / "run"
    assert [p.name for p in (seed_1 / "checkpoints").iterdir()] == ["step-1"]
    assert not (seed_1 / "selected_step.json").exists()
    assert mtimes(seed_0) == finished
    step_1 = (seed_1 / "checkpoints" / "step-1" / STATE_FILE).stat()

    # the same command again, in a fresh process: seed 0 untouched, seed 1 continued from step 1
    again = [sys.executable, "-m", "r1trade.cli", *command, "--seeds", "0-1", "--ladder", str(ladder),
             "--level", "planted_edge"]
    done = subprocess.run(again, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "seed 0: training finished (step-2), skipped" in done.stdout
    assert "seed 0: test backtest finished" in done.stdout
    assert "seed 1: training resumed from step-1" in done.stdout
    assert mtimes(seed_0) == finished
    assert (seed_1 / "checkpoints" / "step-1" / STATE_FILE).stat().st_mtime_ns == step_1.st_mtime_ns  # kept
    assert (seed_1 / "checkpoints" / "step-2" / STATE_FILE).is_file()
    updates = [json.loads(line)["update"] for line in (seed_1 / "metrics.jsonl").read_text().splitlines()]
    assert updates == [1, 2]

    # the summary: each seed's figures from its test report, their mean, sd, worst; no IQM under four seeds
    summary = json.loads((out / "seeds.json").read_text())
    assert [r["seed"] for r in summary["seeds"]] == [0, 1] and summary["tested_on"] == "test"
    accuracy = {}
    for row in summary["seeds"]:
        report = json.loads((out / f"seed-{row['seed']}" / "test" / "metrics.json").read_text())
        agent = report["strategies"][f"agent (step-{row['step']})"]
        accuracy[row["seed"]] = agent["Direction Accuracy [%]"]
        assert row["figures"]["Direction Accuracy [%]"] == accuracy[row["seed"]]
        assert row["figures"][GAIN] == pytest.approx(
            agent["Direction Accuracy [%]"] - report["strategies"]["base model"]["Direction Accuracy [%]"]
        )
        selected = json.loads((out / f"seed-{row['seed']}" / "run" / "selected_step.json").read_text())
        assert selected["split"] == "validation" and selected["step"] == row["step"]
    a, b = accuracy[0], accuracy[1]
    spread = summary["summary"]["Direction Accuracy [%]"]
    assert spread["mean"] == pytest.approx((a + b) / 2)
    assert spread["sd"] == pytest.approx(abs(a - b) / math.sqrt(2))  # two values: |a - b| / sqrt(2)
    assert spread["worst"] == min(a, b) and spread["iqm"] is None
    assert "IQM" in done.stdout and "seeds.json" in done.stdout

    # a ladder record per seed, its variant the folder's name
    records = json.loads(ladder.read_text())
    assert [(r["seed"], r["variant"], r["level"]) for r in records] == [
        (0, "tiny-seeds", "planted_edge"), (1, "tiny-seeds", "planted_edge")
    ]
    assert records[0]["direction_accuracy"] == pytest.approx(a / 100)
    assert [r["updates"] for r in records] == [row["step"] for row in summary["seeds"]]  # the chosen steps

    # A later call for seed 1 alone keeps seed 0 in the summary; a seed folder of another config (seed 0's work
    # copied as seed 7) is named and left out.
    shutil.copytree(seed_0, out / "seed-7")
    capsys.readouterr()
    assert main([*command, "--seeds", "1"]) == 0
    shown = capsys.readouterr().out
    assert "seed 7: left out of seeds.json: it ran another config" in shown
    later = json.loads((out / "seeds.json").read_text())
    assert later["seeds"] == summary["seeds"] and later["summary"] == summary["summary"]
    shutil.rmtree(out / "seed-7")
    # a damaged report of an earlier seed leaves that seed out, not the call's own summary
    report_0 = seed_0 / "test" / "metrics.json"
    intact = report_0.read_bytes()
    report_0.write_text("{not json")
    assert main([*command, "--seeds", "1"]) == 0
    assert "seed 0: left out of seeds.json" in capsys.readouterr().out
    assert [r["seed"] for r in json.loads((out / "seeds.json").read_text())["seeds"]] == [1]
    report_0.write_bytes(intact)
    assert main([*command, "--seeds", "1"]) == 0
    finished = mtimes(seed_0)

    # another config in the same folder is refused before anything runs
    capsys.readouterr()
    assert main([*command, "--seeds", "0", "--set", "train.learning_rate=0.01"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another config" in err and one_line(err)
    assert mtimes(seed_0) == finished


def test_a_run_of_another_budget_is_kept_for_a_smaller_one_and_resumed_for_a_larger(
    capsys, tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "budget"
    command = ["seeds", "--config", "smoke", "--seeds", "0", "--out", str(out), *settings(*TINY)]
    assert main(command) == 0  # two updates, both steps measured on validation
    run = out / "seed-0" / "run"
    trained = mtimes(run / "checkpoints") | {run / "metrics.jsonl": (run / "metrics.jsonl").stat().st_mtime_ns}
    measured: list[str] = []
    figure = step_selection._figure
    monkeypatch.setattr(step_selection, "_figure",
                        lambda config, checkpoint, metric: measured.append(checkpoint.name) or figure(
                            config, checkpoint, metric))

    # a budget of one update: the run's first step is that run, nothing trained or measured again
    capsys.readouterr()
    assert main([*command, "--set", "train.updates=1"]) == 0
    shown = capsys.readouterr().out
    assert "was trained further (step-2): its first 1 updates are this run" in shown
    assert "training finished (step-1), skipped" in shown
    assert measured == []
    assert mtimes(run / "checkpoints") | {run / "metrics.jsonl": (run / "metrics.jsonl").stat().st_mtime_ns} == trained
    selected = json.loads((run / "selected_step.json").read_text())
    assert (selected["up_to"], selected["step"], [row["step"] for row in selected["figures"]]) == (1, 1, [1])
    report = json.loads((out / "seed-0" / "test" / "metrics.json").read_text())
    assert "agent (step-1)" in report["strategies"]
    assert json.loads((out / "seeds.json").read_text())["seeds"][0]["step"] == 1

    # a budget of three: resumed from step 2; step 1, which the last selection measured, is not measured again
    assert main([*command, "--set", "train.updates=3"]) == 0
    assert "training resumed from step-2" in capsys.readouterr().out
    assert measured == ["step-2", "step-3"]
    assert [json.loads(line)["update"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert load_config(run / "config.yaml").train.updates == 3

    # a budget the run kept no checkpoint of is refused in one line
    shutil.rmtree(run / "checkpoints" / "step-2")
    assert main([*command, "--set", "train.updates=2"]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoint of step 2" in err and one_line(err), err


def test_a_warm_started_seed(capsys, tmp_path: Path) -> None:
    out = tmp_path / "warm"
    command = ["seeds", "--config", "smoke", "--seeds", "3", "--warmstart", "--out", str(out),
               *settings(*TINY, *TINY_WARMSTART)]
    assert main(command) == 0
    model = out / "seed-3" / "warmstart" / "model"
    assert (out / "seed-3" / "warmstart" / "warmstart.json").is_file() and (model / "config.json").is_file()
    trained = load_config(out / "seed-3" / "run" / "config.yaml")
    assert (trained.seed, trained.model.tiny_seed, trained.model.name_or_path) == (3, 3, str(model))
    report = json.loads((out / "seed-3" / "test" / "metrics.json").read_text())
    assert report["notes"]["base model"].startswith(f"RL started from: {model}")
    finished = mtimes(out / "seed-3")
    capsys.readouterr()
    assert main(command) == 0
    shown = capsys.readouterr().out
    assert "seed 3: warm start finished" in shown and "training finished (step-1), skipped" in shown
    assert mtimes(out / "seed-3") == finished

    # a run saved before a config key existed (its config.yaml lacks the key) is the same config, not another
    saved = out / "seed-3" / "run" / "config.yaml"
    saved.write_text("".join(line for line in saved.read_text().splitlines(keepends=True)
                             if "micro_batch_order" not in line))
    assert main(command) == 0
    assert "training finished (step-1), skipped" in capsys.readouterr().out
    finished = mtimes(out / "seed-3")

    # A variant of the RL borrows that warm start: its run starts from the same model, and no warm start runs.
    variant = tmp_path / "variant"
    assert main(["seeds", "--config", "smoke", "--seeds", "3", "--warmstart", "--out", str(variant),
                 "--warmstart-from", str(out), *settings(*TINY, *TINY_WARMSTART, "train.learning_rate=2e-4")]) == 0
    assert "starting from the warm start in" in capsys.readouterr().out
    borrowed = load_config(variant / "seed-3" / "run" / "config.yaml")
    assert (borrowed.model.name_or_path, borrowed.train.learning_rate) == (str(model), 2e-4)
    assert not (variant / "seed-3" / "warmstart").exists()
    assert [entry["seed"] for entry in json.loads((variant / "seeds.json").read_text())["seeds"]] == [3]
    assert mtimes(out / "seed-3") == finished

    # One that changes what the warm start read (the env) is refused before anything runs.
    other = tmp_path / "other"
    code = main(["seeds", "--config", "smoke", "--seeds", "3", "--warmstart", "--out", str(other),
                 "--warmstart-from", str(out), *settings(*TINY, *TINY_WARMSTART, "env.fee_bps=5")])
    err = capsys.readouterr().err
    assert code == 2 and "ran another config" in err and one_line(err), err
    assert not other.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "2-1"], "bad --seeds '2-1'"),
        (["--ladder", "x.json"], "--ladder and --level go together"),
        (["--ladder", "x.json", "--level", "moon"], "--level must be one of"),
        (["--set", "train.walk_forward=2"], "trains one agent per walk-forward fold"),
        (["--set", "train.nope=1"], "unknown key 'train.nope'"),
        (["--warmstart", "--warmstart-from", "nowhere"], "holds no finished warm start"),
        (["--no-warmstart", "--warmstart-from", "nowhere"], "--warmstart-from needs a warm start"),
    ],
)
def test_bad_input_is_one_line_and_runs_nothing(
    capsys, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "none"
    code = main(["seeds", "--config", "smoke", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and one_line(err), err
    assert not out.exists()


def test_a_penalty_s_worst_seed_is_its_highest() -> None:
    """Mandate penalties 0.30, 0.50, 0.20 over seeds 0-2: mean 1.0 / 3, worst 0.50 at seed 1 (lower is better);
    the same numbers as an accuracy have their worst at seed 2."""
    values = {0: 0.30, 1: 0.50, 2: 0.20}
    penalty = seed_spread(values, lower_is_better=True)
    assert penalty is not None and (penalty.worst, penalty.worst_seed) == (0.50, 1)
    assert penalty.mean == pytest.approx(1.0 / 3)
    spreads = spread_by_figure({s: {"Mandate Penalty": v, "Return [%]": v} for s, v in values.items()},
                               ["Mandate Penalty", "Return [%]"], lower_is_better={"Mandate Penalty"})
    assert spreads["Mandate Penalty"].worst_seed == 1 and spreads["Return [%]"].worst_seed == 2


def test_a_damaged_borrowed_warm_start_config_is_one_line_and_runs_nothing(capsys, tmp_path: Path) -> None:
    warm = tmp_path / "other" / "seed-0" / "warmstart"
    warm.mkdir(parents=True)
    (warm / "warmstart.json").write_text("{}")
    (warm / "config.yaml").write_text("data: [unclosed\n")
    out = tmp_path / "out"
    code = main(["seeds", "--config", "smoke", "--seeds", "0", "--warmstart", "--out", str(out),
                 "--warmstart-from", str(tmp_path / "other")])
    err = capsys.readouterr().err
    assert code == 2 and "--warmstart-from:" in err and "config.yaml" in err and one_line(err), err
    assert not out.exists()


def test_a_warm_start_is_borrowed_across_sampling_and_reward_settings_but_not_across_its_turn_length(tmp_path: Path) -> None:
    warm = tmp_path / "seed-0" / "warmstart"
    load_config("smoke").save(warm)
    (warm / "warmstart.json").write_text("{}")
    sampled_otherwise = load_config("smoke", ["rollout.num_envs=96", "rollout.temperature=0.5", "train.epochs=3"])
    assert borrowed_warm_start(warm, sampled_otherwise) == warm / "model"
    rewarded_otherwise = load_config("smoke", ["rewards.info_call=0", "rewards.format_penalty=0"])
    assert borrowed_warm_start(warm, rewarded_otherwise) == warm / "model"
    shorter_turns = load_config("smoke", ["rollout.max_new_tokens=7"])
    with pytest.raises(UsageError, match="ran another config"):
        borrowed_warm_start(warm, shorter_turns)


def test_a_warm_start_saved_with_a_retired_rl_key_is_still_borrowed_but_not_one_with_a_retired_warm_start_key(
    tmp_path: Path,
) -> None:
    warm = tmp_path / "seed-0" / "warmstart"
    load_config("smoke").save(warm)
    (warm / "warmstart.json").write_text("{}")
    saved = (warm / "config.yaml").read_text()
    (warm / "config.yaml").write_text(saved.replace("train:\n", "train:\n  look_kl_coef: 0.3\n", 1))
    assert borrowed_warm_start(warm, load_config("smoke")) == warm / "model"  # RL's keys are not the warm start's
    with pytest.raises(ConfigError, match="'train.look_kl_coef' was retired"):
        load_config(warm / "config.yaml")  # as a run it did what r1trade no longer does
    (warm / "config.yaml").write_text(saved.replace("warmstart:\n", "warmstart:\n  changes_in_view: 0.5\n", 1))
    with pytest.raises(UsageError, match="'warmstart.changes_in_view' was retired"):
        borrowed_warm_start(warm, load_config("smoke"))


# --------------------------------------------------------------------------- restarts


def test_the_kept_run_is_the_best_on_validation_the_earliest_of_equals() -> None:
    """Accuracies 52.4 (the config as written) and 73.6 (its restart): the restart. Penalties 0.40, 0.35, 0.35:
    the first 0.35, lower being better. A run whose figure is missing (NaN) is never kept over one with a figure."""
    assert kept_candidate([52.4, 73.6], "Direction Accuracy [%]") == 1
    assert kept_candidate([73.6, 73.6], "Direction Accuracy [%]") == 0
    assert kept_candidate([0.40, 0.35, 0.35], "Mandate Penalty") == 1
    assert kept_candidate([math.nan, 50.0], "Direction Accuracy [%]") == 1


@pytest.mark.parametrize(
    ("restarts", "message"),
    [
        ("[[seed=3]]", "a restart may not set 'seed'"),
        ("[[model.tiny_seed=1]]", "a restart may not set 'model.tiny_seed'"),
        ("[[seeds.restarts=none]]", "a restart may not set 'seeds.restarts'"),
        ("[[train.learning_rate]]", "expected section.key=value"),
        ("[[a=1], [b=1], [c=1], [d=1], [e=1]]", "seeds.restarts"),
    ],
)
def test_a_bad_restart_is_one_line_and_runs_nothing(capsys, tmp_path: Path, restarts: str, message: str) -> None:
    out = tmp_path / "none"
    code = main(["seeds", "--config", "smoke", "--out", str(out), "--set", f"seeds.restarts={restarts}"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and one_line(err), err
    assert not out.exists()


def test_a_restart_runs_beside_the_config_and_only_the_run_best_on_validation_is_tested(
    capsys, tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "restarts"
    command = ["seeds", "--config", "smoke", "--seeds", "0", "--out", str(out), *settings(*TINY)]
    assert main(command) == 0  # first without restarts: the config's own run, tested, and kept.json says so
    seed_0 = out / "seed-0"
    first = mtimes(seed_0 / "run")
    alone = json.loads((seed_0 / "kept.json").read_text())
    assert (alone["candidate"], alone["run"], len(alone["validation"])) == (0, str(seed_0 / "run"), 1)

    # Then with a restart (another learning rate). Its test is stopped (Ctrl-C) once both runs chose their steps,
    # so the test report in place is still the one of the config's own run.
    restart = "seeds.restarts=[[train.learning_rate=0.01]]"
    with_restart = [*command, "--set", restart]
    import r1trade.seeds

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(r1trade.seeds, "run_backtest", stopped)
    assert main(with_restart) == 130
    monkeypatch.undo()
    assert mtimes(seed_0 / "run") == first  # the config's own run is the same config: kept, not rerun
    rerun = load_config(seed_0 / "restart-1" / "run" / "config.yaml")
    assert rerun.train.learning_rate == 0.01 and rerun.seeds.restarts == [] and rerun.seed == 0
    assert json.loads((seed_0 / "kept.json").read_text()) == alone  # the stopped test wrote no note

    capsys.readouterr()
    assert main(with_restart) == 0  # again: both runs skipped, the kept one tested (the note was of one run)
    shown = capsys.readouterr().out
    assert shown.count("training finished (step-2), skipped") == 2 and "backtesting step-" in shown
    chosen = [json.loads((run / "selected_step.json").read_text()) for run in (seed_0 / "run",
                                                                                seed_0 / "restart-1" / "run")]
    values = [selection["value"] for selection in chosen]
    kept = 1 if values[1] > values[0] else 0
    noted = json.loads((seed_0 / "kept.json").read_text())
    assert (noted["candidate"], noted["checkpoint"], noted["validation"]) == (kept, chosen[kept]["checkpoint"],
                                                                              values)
    report = json.loads((seed_0 / "test" / "metrics.json").read_text())
    agent = f"agent (step-{chosen[kept]['step']})"
    assert report["notes"][agent].startswith(f"checkpoint {chosen[kept]['checkpoint']} ")
    summary = json.loads((out / "seeds.json").read_text())
    assert summary["restarts"] == [["train.learning_rate=0.01"]]
    row = summary["seeds"][0]
    assert (row["kept"], row["validation"], row["checkpoint"]) == (kept, values, chosen[kept]["checkpoint"])
    assert row["figures"]["Direction Accuracy [%]"] == report["strategies"][agent]["Direction Accuracy [%]"]
    assert "restart K" in shown  # the table's column of the run tested

    finished = mtimes(seed_0)
    assert main(with_restart) == 0  # finished: nothing runs
    assert "test backtest finished" in capsys.readouterr().out
    assert mtimes(seed_0) == finished

    (seed_0 / "kept.json").write_text("{not json")  # a damaged note: the kept run is tested again
    assert main(with_restart) == 0
    assert "backtesting step-" in capsys.readouterr().out
    assert json.loads((seed_0 / "kept.json").read_text())["candidate"] == kept

    assert main(command) == 0  # the config alone again: its run is kept, the report of both runs' is not taken
    assert "backtesting step-" in capsys.readouterr().out
    assert json.loads((seed_0 / "kept.json").read_text())["validation"] == values[:1]


def test_a_restart_runs_only_while_no_run_reached_restart_until_on_validation() -> None:
    """Accuracies: 52.4 has not reached 60, 73.6 has; penalties (lower is better): 0.40 has not reached 0.35,
    0.35 has. Without restart_until every restart runs; a run without a figure (NaN) has reached nothing."""
    accuracy, penalty = "Direction Accuracy [%]", "Mandate Penalty"
    assert wants_another_run([], 60.0, accuracy)
    assert wants_another_run([52.4], 60.0, accuracy) and not wants_another_run([73.6], 60.0, accuracy)
    assert wants_another_run([52.4, 50.5], 60.0, accuracy) and not wants_another_run([52.4, 60.0], 60.0, accuracy)
    assert wants_another_run([0.40], 0.35, penalty) and not wants_another_run([0.35], 0.35, penalty)
    assert wants_another_run([73.6], None, accuracy) and wants_another_run([None], 60.0, accuracy)


def test_restart_until_skips_the_restart_of_a_run_that_reached_it_and_runs_it_for_one_that_did_not(
    capsys, tmp_path: Path
) -> None:
    """The tiny smoke run scores 0 % on validation: restart_until 0 is reached, so the restart never runs;
    restart_until 1 is not, so it runs, beside the config's run, which is kept rather than run again."""
    out = tmp_path / "until"
    restart = ["--set", "seeds.restarts=[[train.learning_rate=0.01]]"]
    command = ["seeds", "--config", "smoke", "--seeds", "0", "--out", str(out), *settings(*TINY), *restart]
    assert main([*command, "--set", "seeds.restart_until=0"]) == 0
    seed_0 = out / "seed-0"
    assert not (seed_0 / "restart-1").exists()
    assert json.loads((seed_0 / "kept.json").read_text())["validation"] == [0.0]
    summary = json.loads((out / "seeds.json").read_text())
    assert (summary["restart_until"], summary["seeds"][0]["validation"]) == (0.0, [0.0])
    first = mtimes(seed_0 / "run")
    capsys.readouterr()

    assert main([*command, "--set", "seeds.restart_until=1"]) == 0
    assert "restart 1: train.learning_rate=0.01" in capsys.readouterr().out
    assert mtimes(seed_0 / "run") == first
    assert json.loads((seed_0 / "kept.json").read_text())["validation"] == [0.0, 0.0]
    assert (seed_0 / "restart-1" / "run" / "selected_step.json").is_file()
