"""The verdicts that count every trial: SPA and StepM against hand-worked cases, the trials counted from the
ladder, and the Verdicts section and keys of every report."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_synthetic_candles

from r1trade.backtest.report import write_report
from r1trade.backtest.report_runs import ReportContext
from r1trade.backtest.runner import run_baseline
from r1trade.backtest.significance import probabilistic_sharpe
from r1trade.backtest.superiority import superiority_on_losses, superiority_test
from r1trade.backtest.uncertainty import run_sample, with_uncertainty
from r1trade.backtest.verdicts import count_trials, decision_returns
from r1trade.cli import main
from r1trade.config import Config
from r1trade.data.splits import split_by_fraction
from r1trade.errors import ConfigError

FAST = {"block": 5, "resamples": 200, "seed": 0}


def test_a_strategy_ahead_at_every_decision_beats_the_benchmark_with_p_0() -> None:
    # "ahead" returns 0.01 more than the benchmark at every decision: its loss differential is 0.01 in every
    # decision, so every resample's mean differential is 0.01, recentred to 0, never above the observed 0.01:
    # p = 0 (lower, consistent and upper alike). "behind" trails by 0.01 give or take 0.001: its recentred
    # resample means stay within a few 0.0001 of 0, below 0.01 too. StepM names "ahead" only; "same" (the
    # benchmark's own returns) is left out as tied.
    rng = np.random.default_rng(0)
    benchmark = rng.normal(0.0, 0.02, 200)
    returns = {
        "buy_and_hold": benchmark, "ahead": benchmark + 0.01, "same": benchmark.copy(),
        "behind": benchmark - 0.01 + rng.normal(0.0, 0.001, 200),
    }
    test = superiority_test(returns, "buy_and_hold", **FAST)
    assert test.pvalues == {"lower": 0.0, "consistent": 0.0, "upper": 0.0} and test.pvalue == 0.0
    assert test.superior == ("ahead",) and test.tied == ("same",)
    assert test.candidates == ("ahead", "same", "behind") and test.observations == 200


def test_runs_no_better_than_the_benchmark_are_not_significant() -> None:
    rng = np.random.default_rng(1)
    returns = {"buy_and_hold": rng.normal(0.001, 0.02, 300), **{
        f"variant {k}": rng.normal(0.0, 0.02, 300) for k in range(4)
    }}
    test = superiority_test(returns, "buy_and_hold", **FAST)
    assert test.pvalue > 0.05 and test.superior == ()
    # only a tie: nothing can beat the benchmark
    tied = superiority_test({"a": returns["buy_and_hold"], "b": returns["buy_and_hold"]}, "a", **FAST)
    assert tied.pvalue == 1.0 and tied.tied == ("b",) and tied.superior == ()


def test_losses_are_judged_as_given_lower_being_better() -> None:
    # the same series as losses: "low" loses 0.01 less than the benchmark at every decision, so it is better
    # with p = 0, where as returns it would trail; the test carries what its losses are
    rng = np.random.default_rng(0)
    benchmark = rng.normal(0.5, 0.1, 100)
    test = superiority_on_losses({"rule": benchmark, "low": benchmark - 0.01, "high": benchmark + 0.01}, "rule",
                                 loss="a miss", **FAST)
    assert test.superior == ("low",) and test.pvalue == 0.0 and test.loss == "a miss"
    assert superiority_test({"rule": benchmark, "low": benchmark - 0.01}, "rule", **FAST).superior == ()


def test_spa_needs_a_candidate_and_three_decisions() -> None:
    with pytest.raises(ValueError, match="besides the benchmark"):
        superiority_test({"buy_and_hold": np.ones(5)}, "buy_and_hold", **FAST)
    with pytest.raises(ValueError, match="at least 3 decisions"):
        superiority_test({"buy_and_hold": np.ones(2), "a": np.zeros(2)}, "buy_and_hold", **FAST)


def _ladder(tmp_path: Path) -> Path:
    records = [{"level": "btc", "variant": f"v{k}"} for k in range(3)] + [{"level": "tool_gated", "variant": "t"}]
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(records))
    return path


def test_trials_are_the_ladder_records_of_the_configs_market(tmp_path: Path) -> None:
    config = Config()
    config.backtest.ladder = str(_ladder(tmp_path))
    config.backtest.ladder_level = "btc"
    counted = count_trials(config, models=1)
    assert counted.count == 3 and counted.source == f"the 3 btc records of {config.backtest.ladder}"
    assert count_trials(config, models=5).count == 5  # at least the report's own models
    assert count_trials(config, models=1, given=7).count == 7
    assert count_trials(config, models=0).count == 0  # a report without models: no trials to deflate
    config.backtest.ladder_level = None
    assert count_trials(config, models=2).source == "the 2 models of this report"
    config.backtest.ladder_level = "btc"
    config.backtest.ladder = str(tmp_path / "absent.json")
    assert count_trials(config, models=2).count == 2
    assert "no ladder at" in count_trials(config, models=2).source
    config.backtest.ladder_level = "moon"
    with pytest.raises(ConfigError, match="backtest.ladder_level 'moon'"):
        count_trials(config, models=1)


@pytest.fixture
def context() -> ReportContext:
    config = Config(name="unit", seed=3)
    config.backtest.random_seeds = 2
    config.backtest.bootstrap_resamples = 200
    config.backtest.params = {"vol_target": {"lookback": 24}}
    splits = split_by_fraction(make_synthetic_candles(1200), train=0.5, validation=0.25)
    return ReportContext(config=config, splits=splits, split="test", bars_per_year=8760.0)


def test_every_report_carries_the_verdicts(context: ReportContext, tmp_path: Path) -> None:
    names = ("sma_crossover", "buy_and_hold", "vol_target", "random")
    runs = [run_baseline(name, context) for name in names]
    samples = {run.name: run_sample(run, context) for run in runs}
    done = with_uncertainty(runs, samples, context, models={"sma_crossover"}, trials=4,
                            trials_source="the 4 btc records of ladder.json")
    write_report(done, context, tmp_path)
    document = json.loads((tmp_path / "metrics.json").read_text())

    model = document["strategies"]["sma_crossover"]
    returns = decision_returns(samples["sma_crossover"], context)
    assert model["psr"]["probability"] == pytest.approx(probabilistic_sharpe(returns).probability)
    assert model["psr"]["observations"] == len(context.decision_bars)
    record = model["min_track_record"]
    assert record["observed_decisions"] == len(context.decision_bars) and record["confidence"] == 0.95
    if record["decisions"] != "inf":  # a decision spans env.decision_every hourly bars
        every = context.config.env.decision_every
        assert record["years"] == pytest.approx(record["decisions"] * every / 8760.0, rel=0.01)
    assert model["deflated_sharpe"]["trials"] == 4
    assert model["deflated_sharpe"]["trials_source"] == "the 4 btc records of ladder.json"
    assert all("psr" in entry and "min_track_record" in entry for entry in document["strategies"].values())

    # buy-and-hold and, on a volatility-target mandate, vol_target are the benchmarks
    assert set(document["spa"]) == {"buy_and_hold", "vol_target"}
    against = document["spa"]["buy_and_hold"]
    assert against["candidates"] == ["sma_crossover", "vol_target", "random"]
    assert 0.0 <= against["pvalue"] <= 1.0 and set(against["stepm_better"]) <= set(against["candidates"])
    assert (against["mean_block_decisions"], against["resamples"], against["seed"]) == (10, 200, 3)
    assert document["spa"]["vol_target"]["candidates"] == ["sma_crossover", "buy_and_hold", "random"]
    assert document["verdicts"]["trials"] == 4 and document["verdicts"]["psr_benchmark_sharpe"] == 0.0

    markdown = (tmp_path / "metrics.md").read_text()
    metrics_part, verdicts_part = markdown.split("\n## Verdicts\n")
    assert "| Return [%] |" in metrics_part and "| Deflated Sharpe Ratio (4 trials) |" in metrics_part
    assert "| PSR (Sharpe > 0) |" in verdicts_part and "| StepM vs vol_target (5 %) |" in verdicts_part
    assert "SPA against buy_and_hold over 3 runs: p = " in verdicts_part
    assert "Deflated Sharpe Ratio: 4 trials: the 4 btc records of ladder.json." in verdicts_part
    page = (tmp_path / "report.html").read_text()
    assert "<h2>Verdicts</h2>" in page and "<th>Min. Track Record [years]</th>" in page


def test_the_terminal_shows_the_verdicts_and_the_trials(capsys, tmp_path: Path) -> None:
    args = ["backtest", "--config", "smoke", "--trials", "3", "--set", "backtest.bootstrap_resamples=100",
            "--out", str(tmp_path)]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    assert "Verdicts" in out and "PSR (Sharpe > 0)" in out and "Min. Track Record [decisions]" in out
    assert "SPA against buy_and_hold over 3 runs: p = " in out
    assert "Deflated Sharpe Ratio: 3 trials: given with --trials." in out
    document = json.loads((tmp_path / "metrics.json").read_text())
    assert document["strategies"]["sma_crossover"]["deflated_sharpe"]["trials"] == 3
    assert document["spa"]["buy_and_hold"]["candidates"] == ["sma_crossover", "rsi_mean_reversion", "random"]
