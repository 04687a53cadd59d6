"""`r1trade backtest --walk-forward K`: fold ranges and the embargo by hand, pooled runs by hand, the CLI end
to end (in a subprocess), a model through the folds, a foreign daily asset, and one-line usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SAMPLE, make_synthetic_candles
from env_fixtures import hold, long

from r1trade.backtest import runner
from r1trade.backtest.metrics import compute_metrics, sharpe_ratio
from r1trade.backtest.model_runs import context_plan, model_run, play_windows
from r1trade.backtest.report_runs import ReportContext, StrategyRun
from r1trade.backtest.walk_forward import fold_contexts, pooled_run
from r1trade.cli import main
from r1trade.config import Config, load_config
from r1trade.data.splits import after_train, fold_bounds, make_splits, split_by_fraction
from r1trade.data.store import load_clean_candles
from r1trade.errors import ConfigError, UsageError
from r1trade.rollout.loop import Trajectory, Turn

METRICS = ["Return [%]", "Sharpe Ratio", "Direction Accuracy [%]"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- folds by hand


def test_fold_bounds_by_hand() -> None:
    # 20 bars, 3 folds, 2 bars of embargo: 20 - 2 × 2 = 16 bars to share, 6 + 5 + 5
    # fold 1: bars 0–5; embargo 6, 7; fold 2: 8–12; embargo 13, 14; fold 3: 15–19
    assert fold_bounds(20, 3, 2) == [(0, 5), (8, 12), (15, 19)]
    assert fold_bounds(9, 3, 0) == [(0, 2), (3, 5), (6, 8)]
    bounds = fold_bounds(1000, 7, 24)
    for (_, last), (first, _) in pairwise(bounds):
        assert first - last - 1 == 24  # exactly the embargo between consecutive folds
    assert bounds[-1][1] == 999  # no bar at the end is left out


@pytest.mark.parametrize(
    ("bars", "folds", "message"),
    [(100, 1, "a walk-forward needs 2 or more folds, not 1"), (10, 3, "10 bars cannot hold 3 folds 5 bars apart")],
)
def test_fold_bounds_refuse_bad_values(bars: int, folds: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        fold_bounds(bars, folds, 5)


def test_span_all_starts_after_the_train_split_and_its_embargo() -> None:
    candles = make_synthetic_candles(100)
    splits = split_by_fraction(candles, train=0.6, validation=0.2, embargo_bars=3)
    span = after_train(candles, splits, 3)
    assert span.index[0] == candles.index[60 + 3] and span.index[-1] == candles.index[-1]
    assert span.attrs == candles.attrs


def small_context(bars: int = 60, *, embargo: int = 2) -> ReportContext:
    config = Config(name="unit")
    config.data.split.embargo_bars = embargo
    config.env.decision_every = 4
    candles = make_synthetic_candles(bars)
    splits = split_by_fraction(make_synthetic_candles(300), train=0.5, validation=0.25)
    return ReportContext(config=config, splits=splits, split="all", bars_per_year=8760.0, span=candles)


def test_fold_contexts_cover_the_folds_and_need_two_decisions() -> None:
    folds = fold_contexts(small_context(), 3)  # 60 - 2 × 2 = 56 bars: 19, 19, 18
    assert [(f.first_bar, f.last_bar) for f in folds] == [(0, 18), (21, 39), (42, 59)]
    assert [len(f.candles) for f in folds] == [19, 19, 18]
    assert all(len(f.decision_bars) >= 2 for f in folds)
    with pytest.raises(UsageError, match="fold 1 has 6 bars, too few for 2 decisions every 4 bars"):
        fold_contexts(small_context(), 8)  # 60 - 7 × 2 = 46 bars: 6 folds of 6 and 2 of 5


def fold_run(equity: list[float], bars: list[int], pnl: float, hits: list[float]) -> StrategyRun:
    index = make_synthetic_candles(10, freq="1D").index[bars]
    curve = pd.Series(equity, index=index, dtype=float)
    metrics = compute_metrics(
        curve, trades=pd.DataFrame({"units": [1.0], "fees": [0.1], "pnl": [pnl]}),
        positions=pd.Series([0.0, 1.0, 1.0], index=index), fees_paid=0.1, traded_notional=100.0,
        bars_per_year=365.0, min_annualise_days=0,
    )
    return StrategyRun("s", curve, pd.DataFrame({"units": [1.0], "fees": [0.1], "pnl": [pnl]}), metrics,
                       hits=np.array(hits))


def test_pooled_run_by_hand() -> None:
    # fold 1: 100 → 110 → 121 on days 0–2; fold 2: 100 → 90 → 99 on days 5–7, started flat
    # chained: fold 2 scaled by 121 / 100 and joined without its first (flat) bar: 121 → 108.9 → 119.79
    # pooled per-bar returns: +.1, +.1, -.1, +.1 (the folds' own); return 100 (1.21 × 0.99 - 1) = 19.79 %
    # trades: PnL 21, then -1 × 1.21; fees 0.1 + 0.1 × 1.21; exposure (2/3 × 3 + 2/3 × 3) / 6; hits 1, 0, 1, 1
    candles = make_synthetic_candles(10, freq="1D")
    context = ReportContext(Config(name="unit"), split_by_fraction(make_synthetic_candles(300), train=0.5,
                            validation=0.25), "all", 365.0, span=candles)
    contexts = [replace(context, first_bar=0, last_bar=2), replace(context, first_bar=5, last_bar=7)]
    runs = [
        fold_run([100, 110, 121], [0, 1, 2], 21.0, [1, 0]), fold_run([100, 90, 99], [5, 6, 7], -1.0, [1, 1])
    ]
    pooled = pooled_run(runs, contexts)
    assert pooled.equity.tolist() == pytest.approx([100, 110, 121, 108.9, 119.79])
    assert list(pooled.equity.index) == list(candles.index[[0, 1, 2, 6, 7]])
    metrics = pooled.metrics
    assert metrics["Return [%]"] == pytest.approx(19.79)
    returns = np.array([0.1, 0.1, -0.1, 0.1])
    assert metrics["Sharpe Ratio"] == pytest.approx(sharpe_ratio(returns, bars_per_year=365))
    assert metrics["# Trades"] == 2 and metrics["Win Rate [%]"] == 50.0
    assert metrics["Profit Factor"] == pytest.approx(21 / 1.21)
    assert metrics["Fees Paid"] == pytest.approx(0.1 + 0.121)
    assert metrics["Exposure Time [%]"] == pytest.approx(100 * 2 / 3)
    assert metrics["Direction Accuracy [%]"] == 75.0
    assert pooled.trades["fold"].tolist() == [1, 2]
    assert pooled.trades["pnl"].tolist() == pytest.approx([21, -1.21])


# --------------------------------------------------------------------------- the CLI


def test_cli_walk_forward_on_the_smoke_config(tmp_path: Path) -> None:
    out = tmp_path / "report"
    command = [sys.executable, "-m", "r1trade.cli", "backtest", "--config", "smoke", "--strategy",
               "buy_and_hold", "--walk-forward", "3", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "metrics.json").read_text())
    config = load_config("smoke")
    embargo = config.data.split.embargo_bars
    assert document["walk_forward"]["folds"] == 3
    assert document["walk_forward"]["embargo_bars"] == embargo == 24
    test = make_splits(load_clean_candles(SAMPLE)[0], config.data.split).test
    fee, slippage = config.env.fee_bps / 1e4, config.env.slippage_bps / 1e4
    growth, scored, decisions = 1.0, 0.0, 0
    for fold, (first, last) in zip(document["folds"], fold_bounds(len(test), 3, embargo), strict=True):
        assert (fold["first_bar"], fold["last_bar"], fold["bars"]) == (first, last, last - first + 1)
        assert fold["start"] == test.index[first].isoformat() and fold["end"] == test.index[last].isoformat()
        bars = fold["strategies"]["buy_and_hold"]
        # each fold starts flat: long from the fold's second open (with slippage), the fee paid on entry
        fill = test["open"].iloc[first + 1] * (1 + slippage)
        expected = 100 * (test["close"].iloc[last] / fill - fee - 1)
        assert bars["Return [%]"] == pytest.approx(expected, rel=1e-12)
        assert list(bars["ci95"]) == METRICS and all(low <= high for low, high in bars["ci95"].values())
        growth *= 1 + bars["Return [%]"] / 100
        scored += bars["Direction Accuracy [%]"] * fold["decisions"]["count"]
        decisions += fold["decisions"]["count"]
    gaps = [test.index.get_loc(b["start"]) - test.index.get_loc(a["end"]) - 1
            for a, b in pairwise(document["folds"])]
    assert gaps == [embargo, embargo]  # the embargo lies between consecutive folds
    pooled = document["strategies"]["buy_and_hold"]
    assert pooled["Return [%]"] == pytest.approx(100 * (growth - 1), rel=1e-9)
    assert pooled["Direction Accuracy [%]"] == pytest.approx(scored / decisions, rel=1e-12)
    assert document["decisions"]["count"] == decisions
    assert list(pooled["ci95"]) == METRICS and "vs_buy_and_hold" not in pooled
    assert document["uncertainty"]["resamples"] == config.backtest.bootstrap_resamples
    markdown = (out / "metrics.md").read_text()
    assert "## Fold 3" in markdown and "| Return [%] 95 % CI |" in markdown
    assert "<h2>Fold 2</h2>" in (out / "report.html").read_text()
    assert "Fold 1 ·" in done.stdout and "95 % CI" in done.stdout


def test_span_all_uses_every_bar_after_training(capsys, tmp_path: Path) -> None:
    args = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold", "--walk-forward", "3",
            "--walk-forward-span", "all", "--out", str(tmp_path)]
    code, _, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "metrics.json").read_text())
    config = load_config("smoke")
    candles = load_clean_candles(SAMPLE)[0]
    train = make_splits(candles, config.data.split).train
    first = candles.index[len(train) + config.data.split.embargo_bars]
    assert document["split"] == "all" and document["walk_forward"]["span"] == "all"
    assert document["folds"][0]["start"] == first.isoformat()
    assert document["folds"][-1]["end"] == candles.index[-1].isoformat()


class AlwaysLong:
    """Plays each env by going long at its first decision and holding after (instead of a model)."""

    def run(self, envs: Sequence, seeds: Sequence[int | None]) -> list[Trajectory]:
        trajectories = []
        for k, (env, seed) in enumerate(zip(envs, seeds, strict=True)):
            env.reset(seed)
            trajectory, done = Trajectory(seed=seed, group=k), False
            while not done:
                text = hold() if trajectory.turns else long(1.0)
                _, reward, terminated, truncated, info = env.step(text)
                trajectory.turns.append(Turn(0, 0, 0, text, reward, False, info))
                done = terminated or truncated
            trajectories.append(trajectory)
        return trajectories


def test_a_model_is_evaluated_on_each_fold_against_buy_and_hold(monkeypatch, tmp_path: Path) -> None:
    def scripted(name: str, models: object, context: ReportContext, *, note: str) -> StrategyRun:
        plan = context_plan(context)
        return model_run(name, play_windows(AlwaysLong(), context, plan), context, plan, note=note)

    player = runner.ModelPlayer("agent (scripted)", lambda fold: runner.LoadedModel(None, "always long"))
    monkeypatch.setattr(runner, "run_model", scripted)
    monkeypatch.setattr(runner, "model_players", lambda *args, **kwargs: [player])
    config = load_config("smoke", ["backtest.max_decisions=6", "backtest.agent_windows=2"])
    outcome = runner.run_backtest(
        config, strategy="sma_crossover", walk_forward=2, trials=4, out_dir=tmp_path
    )
    document = json.loads((tmp_path / "metrics.json").read_text())
    agent = "agent (scripted)"
    assert list(document["strategies"]) == [agent, "sma_crossover", "buy_and_hold"]  # with buy-and-hold
    bounds = fold_bounds(len(outcome.context.split_candles), 2, config.data.split.embargo_bars)
    warmup = config.env.warmup_bars
    for fold, (first, _) in zip(document["folds"], bounds, strict=True):
        assert fold["decisions"]["count"] == 6
        assert fold["first_bar"] == max(first, warmup)  # every strategy on the model's bars of the fold
        versus = fold["strategies"][agent]["vs_buy_and_hold"]
        assert versus["verdict"] in ("better", "worse", "undecided") and versus["verdict_on"] == "Return [%]"
        assert list(fold["strategies"]["buy_and_hold"]["ci95"]) == METRICS
    pooled = document["strategies"][agent]
    assert pooled["deflated_sharpe"]["trials"] == 4 and "vs_buy_and_hold" in pooled
    assert "vs_buy_and_hold" not in document["strategies"]["sma_crossover"]
    assert pooled["Action Entropy [nats]"] == pytest.approx(  # 4 longs and 8 holds over both folds' decisions
        -(1 / 3 * np.log(1 / 3) + 2 / 3 * np.log(2 / 3))
    )
    assert "buy-and-hold at 95 %" in (tmp_path / "report.html").read_text()
    assert "its walk-forward fold" in document["folds"][1]["notes"][agent]


def test_a_model_plays_every_bar_after_training(capsys, tmp_path: Path) -> None:
    # the untrained model through span "all": an env replays the span as a split of its own
    fast = ["backtest.max_decisions=2", "backtest.agent_windows=1", "backtest.bootstrap_resamples=100",
            "rollout.max_new_tokens=8", "model.cpu_kernels=off"]
    args = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold", "--baseline", "base-model",
            "--walk-forward", "2", "--walk-forward-span", "all", "--out", str(tmp_path),
            *[part for setting in fast for part in ("--set", setting)]]
    code, _, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "metrics.json").read_text())
    config = load_config("smoke")
    candles = load_clean_candles(SAMPLE)[0]
    span = after_train(candles, make_splits(candles, config.data.split), config.data.split.embargo_bars)
    (first, _), (second, _) = fold_bounds(len(span), 2, config.data.split.embargo_bars)
    folds = document["folds"]
    assert document["split"] == "all" and list(document["strategies"]) == ["base model", "buy_and_hold"]
    assert [fold["first_bar"] for fold in folds] == [first + config.env.warmup_bars, second]
    assert [fold["start"] for fold in folds] == [span.index[fold["first_bar"]].isoformat() for fold in folds]
    for fold in folds:
        model = fold["strategies"]["base model"]
        assert fold["decisions"]["count"] == 2 and model["# Decisions"] == 2
        assert "checkpoints" not in fold and "untrained: tiny-random" in fold["notes"]["base model"]


def test_a_foreign_daily_asset_imported_from_csv(capsys, tmp_path: Path) -> None:
    candles = make_synthetic_candles(1100, seed=3, freq="1D")
    source = tmp_path / "export.csv"
    frame = candles.rename(columns=str.capitalize)
    frame.index = frame.index.strftime("%Y-%m-%d")
    frame.rename_axis("Date").to_csv(source)
    imported = tmp_path / "asset.parquet"
    code, _, err = run(capsys, "import-csv", str(source), "--out", str(imported), "--symbol", "FOO/EUR")
    assert code == 0, err
    args = ["backtest", "--config", "smoke", "--data", str(imported), "--walk-forward", "3",
            "--out", str(tmp_path / "report")]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert document["bars_per_year"] == 365 and document["data"]["symbol"] == "FOO/EUR"
    assert len(document["folds"]) == 3 and all("ci95" in s for s in document["strategies"].values())
    assert "Fold 3" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--walk-forward", "1"], "--walk-forward 1: use 2 or more folds"),
        (["--walk-forward", "100"], "fold 1 has 7 bars, too few for 2 decisions every 4 bars"),
        (["--walk-forward", "500"], "bars cannot hold 500 folds 24 bars apart"),
        (["--walk-forward-span", "all"], "--walk-forward-span needs --walk-forward K"),
        (["--walk-forward", "2", "--walk-forward-span", "later"], "--walk-forward-span 'later': use one of"),
        (["--trials", "0"], "--trials 0: give the number of variants tried"),
        (["--step", "3"], "--step picks each fold agent's checkpoint of a walk-forward run"),
    ],
)
def test_bad_values_are_one_line_usage_errors(capsys, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    base = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold", "--out", str(out)]
    code, _, err = run(capsys, *base, *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
