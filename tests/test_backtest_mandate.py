"""The volatility-target mandate in the backtest: its baselines on hand-made series, its rows and intervals,
the best constant and the volatility forecast chosen on the train split only, and training and backtesting the
rung through the CLI."""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from env_fixtures import daily

from r1trade.backtest import mandate, strategies, volatility_forecast
from r1trade.backtest.mandate import (
    decided_at,
    decision_sigmas,
    mandate_rows,
    size_volatility_correlation,
    with_mandate,
)
from r1trade.backtest.runner import load_context, mandate_params, run_baseline
from r1trade.backtest.strategies import best_constant_exposure, constant_exposure, random_sizes, vol_target
from r1trade.backtest.volatility_forecast import fit_vol_forecast, vol_forecast
from r1trade.cli import main
from r1trade.config import load_config
from r1trade.env.volatility import realised_volatility

SIZES = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5]
A = 0.8 / math.sqrt(730)
"""A daily log-return whose alternating pair (A, -A) has an annualised volatility of 0.8: std A·√2, × √365."""
ROWS = ("Mandate Penalty", "Realised Volatility [%]", "Target Volatility [%]", "Size-Volatility Rank Correlation")


@pytest.mark.parametrize("module", [mandate, strategies, volatility_forecast])
def test_docstring_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------- baselines on hand-made series


def test_vol_target_on_the_mandates_sizes_by_hand() -> None:
    candles = daily([A, -A, -A, A, A])  # returns r1..r5 end at bars 1..5
    # σ over the last 2 returns: bar 2 (A, -A): 0.8; bar 3 (-A, -A): 0; bar 4: 0.8; bar 5: 0. Target 0.4:
    # 0.4 / 0.8 = 0.5, a size of the set; σ = 0: the cap 1.5. Flat until two returns exist.
    sized = vol_target(candles, target=0.4, lookback=2, band=0.0, sizes=SIZES, max_leverage=1.5)
    assert sized.tolist() == [0.0, 0.0, 0.5, 1.5, 0.5, 1.5]
    # target 0.9: 1.125 is nearest 1 (not 1.5); with a cap of 1, σ = 0 holds 1
    nearest = vol_target(candles, target=0.9, lookback=2, band=0.0, sizes=SIZES, max_leverage=1.0)
    assert nearest.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_constant_and_random_sizes() -> None:
    candles = daily([0.01, -0.02] * 300)
    assert constant_exposure(candles, size=0.75).eq(0.75).all()
    drawn = random_sizes(candles, seed=3, sizes=SIZES)
    assert set(drawn) == set(SIZES) and drawn.value_counts().min() > 60  # 601 draws of 6 sizes
    assert drawn.equals(random_sizes(candles, seed=3, sizes=SIZES))
    prefix = random_sizes(candles.iloc[:50], seed=3, sizes=SIZES)
    assert drawn.iloc[:50].equals(prefix)  # no later bar changes a draw
    assert not drawn.equals(random_sizes(candles, seed=4, sizes=SIZES))


def test_best_constant_by_hand() -> None:
    # decisions every 2 days from day 0: day 0 holds over (A, -A), σ = 0.8; day 2 over (A/2, -A/2), σ = 0.4.
    # Target 0.4. Size 0 misses 1 and 1; size 0.5: (0.4 - 0.4)² = 0, then ((0.2 - 0.4) / 0.4)² = 0.25, mean
    # 0.125; size 1: ((0.8 - 0.4) / 0.4)² = 1, then 0, mean 0.5. Best: 0.5.
    candles = daily([A, -A, A / 2, -A / 2])
    size, misses = best_constant_exposure(candles, sizes=[0.0, 0.5, 1.0], target_vol=0.4, every=2, first=0)
    assert size == 0.5 and misses == pytest.approx({0.0: 1.0, 0.5: 0.125, 1.0: 0.5})


def test_vol_forecast_sizes_by_hand() -> None:
    # Pairs of daily returns (short = long = 2 bars; the week's coefficient 0): bars 2..6 see σ = 0.8, 0.6, 0.4,
    # 1.0 and 1.6 (|x - y| / √2 · √365). With a forecast of σ itself and no uncertainty the size is the nearest
    # to 0.4 / σ: 0.5, 0.75 (of 0.67), 1, 0.5 (of 0.4), 0.25. With a residual variance of 0.25 the expected miss
    # is lowest at e^-0.375 = 0.687 of that: 0.34, 0.46, 0.69, 0.27, 0.17, held as 0.25, 0.5, 0.75, 0.25, 0.25.
    candles = daily([A, -A, A / 2, -A / 2, 2 * A, -2 * A])
    forecast = {"intercept": 0.0, "short_coef": 1.0, "long_coef": 0.0, "target": 0.4, "sizes": SIZES,
                "short": 2, "long": 2}
    assert vol_forecast(candles, residual_var=0.0, **forecast).tolist() == [0, 0, 0.5, 0.75, 1, 0.5, 0.25]
    assert vol_forecast(candles, residual_var=0.25, **forecast).tolist() == [0, 0, 0.25, 0.5, 0.75, 0.25, 0.25]
    still = daily([A, -A, 0.0, 0.0])  # bar 3: (-A, 0), σ 0.4, size 1; bar 4: σ 0, no forecast, flat
    assert vol_forecast(still, residual_var=0.0, **forecast).tolist() == [0, 0, 0.5, 1.0, 0.0]


def test_vol_forecast_is_fitted_on_the_tools_numbers() -> None:
    """The regressors are what get_volatility shows (the env's realised_volatility over 24 and 168 bars at the
    decision bar) and the response the volatility of the interval the decision holds: the fit is their least
    squares in logs, rebuilt here decision by decision."""
    rng = np.random.default_rng(5)
    regime = np.repeat(rng.uniform(0.002, 0.02, 40), 100)  # hourly σ in 40 calm or wild stretches
    closes = 100.0 * np.exp(np.r_[0.0, np.cumsum(regime * rng.standard_normal(4000))])
    candles = pd.DataFrame({"close": closes}, index=pd.date_range("2024-01-01", periods=4001, freq="1h", tz="UTC"))
    fit = fit_vol_forecast(candles, every=24, first=168, short=24, long=168)
    per_year = math.sqrt(8760)
    decisions = range(168, 4001 - 24, 24)
    rows = [(realised_volatility(closes, d + 24, 24), realised_volatility(closes, d, 24),
             realised_volatility(closes, d, 168)) for d in decisions]
    logs = np.log(np.array(rows) * per_year)  # (D, 3): the interval after, the day's and the week's
    design = np.column_stack([np.ones(len(logs)), logs[:, 1:]])
    expected, *_ = np.linalg.lstsq(design, logs[:, 0], rcond=None)
    residuals = logs[:, 0] - design @ expected
    assert fit.decisions == len(decisions) == 159
    assert [fit.intercept, fit.short_coef, fit.long_coef] == pytest.approx(expected.tolist())
    assert fit.residual_var == pytest.approx((residuals**2).sum() / (159 - 3))
    assert fit.r_squared == pytest.approx(1 - residuals.var() / logs[:, 0].var())
    assert 0.5 < fit.short_coef + fit.long_coef < 1.0 and fit.r_squared > 0.5  # clustered, so forecastable
    with pytest.raises(ValueError, match="need at least 4"):  # 250 bars: decisions at bars 168, 192 and 216
        fit_vol_forecast(candles.iloc[:250], every=24, first=168, short=24, long=168)


def test_decided_at_and_the_rows_by_hand() -> None:
    target = pd.Series([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert decided_at(target, np.array([1, 4])).tolist() == [0.0, 0.2, 0.2, 0.2, 0.5, 0.5]
    sigmas = np.array([0.8, 0.4])
    # 0.5 against 80 % then 40 %: delivered 40 % (a miss of 0), then 20 % (((0.2 - 0.4) / 0.4)² = 0.25): mean
    # 0.125; delivered variances 0.16 and 0.04: RMS sqrt(0.1) = 31.6228 %; a constant size has no correlation
    expected = dict(zip(ROWS, [0.125, 31.6228, 40.0, math.nan], strict=True))
    assert mandate_rows(np.array([0.5, 0.5]), sigmas, target_vol=0.4) == pytest.approx(
        expected, abs=1e-4, nan_ok=True
    )
    # a second seed holding 0 then 1: misses 1 and 0, so per decision (0 + 1) / 2 and (0.25 + 0) / 2, mean
    # 0.3125; delivered variances (0.16, 0.04) and (0, 0.16): per decision 0.08 and 0.1, RMS sqrt(0.09) = 30 %.
    # The correlation pools the seeds' (size, σ) pairs (0.5, 0.8), (0.5, 0.4), (0, 0.8), (1, 0.4): ranks
    # (2.5, 2.5, 1, 4) and (3.5, 1.5, 3.5, 1.5), centred (0, 0, -1.5, 1.5) and (1, -1, 1, -1): -3 / sqrt(4.5 · 4)
    seeded = mandate_rows(np.array([[0.5, 0.5], [0.0, 1.0]]), sigmas, target_vol=0.4)
    assert seeded == pytest.approx(dict(zip(ROWS, [0.3125, 30.0, 40.0, -1 / math.sqrt(2)], strict=True)))


def test_the_size_volatility_correlation_by_hand_and_per_resample() -> None:
    sizes, sigmas = np.array([1.0, 0.5, 0.5, 0.25]), np.array([0.2, 0.4, 0.5, 0.8])
    # ranks (4, 2.5, 2.5, 1) and (1, 2, 3, 4), centred (1.5, 0, 0, -1.5) and (-1.5, -0.5, 0.5, 1.5):
    # -4.5 / sqrt(4.5 · 5) = -0.9487
    assert size_volatility_correlation(sizes, sigmas) == pytest.approx([-0.9486833])
    assert size_volatility_correlation(sizes[::-1], sigmas) == pytest.approx([0.9486833])  # the mirror image
    resamples = np.array([[0, 1, 2, 3], [0, 0, 1, 1], [1, 2, 1, 2], [3, 3, 3, 3]])
    # the same decisions; (1, 1, 0.5, 0.5) against (0.2, 0.2, 0.4, 0.4): -1; 0.5 alone: none; one decision: none
    assert size_volatility_correlation(sizes, sigmas, resamples) == pytest.approx(
        [-0.9486833, -1.0, math.nan, math.nan], nan_ok=True
    )


# --------------------------------------------------------------------------- the runner under the mandate


@pytest.fixture(scope="module")
def context():
    """btc_voltarget_tiny's test split (the shipped sample), 200 resamples."""
    overrides = ["backtest.bootstrap_resamples=200", "backtest.random_seeds=2"]
    config = load_config("btc_voltarget_tiny", overrides)
    return load_context(config)


def test_best_constant_is_chosen_on_the_train_split_only(context) -> None:
    params, note = mandate_params("best_constant", context)
    env = context.config.env
    chosen, misses = best_constant_exposure(context.splits.train, sizes=env.exposures, target_vol=0.4,
                                            every=24, first=env.warmup_bars)
    assert params == {"size": chosen} and f"holds {chosen:g} of equity" in note
    assert misses[0.0] == 1.0 and misses[chosen] == min(misses.values())
    wild = context.splits.test.copy()
    wild[["open", "high", "low", "close"]] *= np.exp(np.random.default_rng(0).normal(0, 0.2, (len(wild), 1)))
    tested_wild = replace(context, splits=replace(context.splits, test=wild))
    assert mandate_params("best_constant", tested_wild)[0] == params
    calm = context.splits.train.copy()  # the train split's moves shrunk tenfold: a larger size is best
    calm[["open", "high", "low", "close"]] = np.exp(np.log(calm[["open", "high", "low", "close"]]) / 10 + 8)
    calmer = mandate_params("best_constant", replace(context, splits=replace(context.splits, train=calm)))[0]
    assert calmer["size"] > chosen


def test_vol_forecast_is_fitted_on_the_train_split_only(context) -> None:
    params, note = mandate_params("vol_forecast", context)
    env = context.config.env
    fit = fit_vol_forecast(context.splits.train, every=24, first=env.warmup_bars, short=24, long=168)
    assert params == {"intercept": fit.intercept, "short_coef": fit.short_coef, "long_coef": fit.long_coef,
                      "residual_var": fit.residual_var, "target": 0.4, "sizes": SIZES, "short": 24, "long": 168}
    assert "fitted on the train split" in note and f"{fit.decisions} decisions" in note and "R² " in note
    wild = context.splits.test.copy()
    wild[["open", "high", "low", "close"]] *= np.exp(np.random.default_rng(0).normal(0, 0.2, (len(wild), 1)))
    assert mandate_params("vol_forecast", replace(context, splits=replace(context.splits, test=wild)))[0] == params


def test_every_baseline_decides_at_the_decision_bars_with_its_sizes(context) -> None:
    names = ("vol_target", "best_constant", "buy_and_hold", "random_sizes", "vol_forecast")
    runs = [run_baseline(name, context) for name in names]
    decisions = len(context.decision_bars)
    assert decisions > 100
    unseeded = [*runs[:3], runs[4]]
    for run in unseeded:
        assert run.exposures.shape == (decisions,) and set(run.exposures) <= set(SIZES)
    assert runs[2].exposures.tolist() == [1.0] * decisions
    assert runs[3].exposures.shape == (2, decisions)  # one row per seed
    assert len(set(runs[0].exposures)) >= 3 and len(set(runs[4].exposures)) >= 3  # both follow the volatility
    # orders fill at the open after a decision bar only: trades open and close on decision bars + 1
    for run in unseeded:
        assert set(run.trades["entry_bar"]) <= set(context.decision_bars + 1)
        closed = run.trades.loc[~run.trades["is_open"], "exit_bar"]
        assert set(closed) <= set(context.decision_bars + 1)
    scored = with_mandate(runs, decision_sigmas(context), context)
    for run in scored:
        assert set(ROWS) <= set(run.metrics) and run.metrics["Target Volatility [%]"] == 40.0
        low, high = run.ci95["Mandate Penalty"]
        assert 0 <= low <= high and run.metrics["Mandate Penalty"] >= 0
        mix = [value for key, value in run.extra.items() if key.startswith("Exposure Mix")]
        assert sum(mix) == pytest.approx(100)
    assert "Mandate Penalty − best_constant" not in scored[1].ci95
    rho = {run.name: (run.metrics[ROWS[3]], run.ci95[ROWS[3]]) for run in scored}
    for name in ("vol_target", "vol_forecast"):  # both hold less when the volatility clusters high
        value, (low, high) = rho[name]
        assert low <= value <= high < 0, name
    value, (low, high) = rho["random_sizes"]  # sizes drawn blind: no correlation to speak of
    assert low < 0 < high and abs(value) < 0.1
    for name in ("best_constant", "buy_and_hold"):  # one size: none
        assert math.isnan(rho[name][0]) and all(map(math.isnan, rho[name][1])), name
    low, high = scored[0].ci95["Mandate Penalty − best_constant"]
    assert low <= high
    twin = with_mandate([runs[1], replace(runs[1], name="twin")], decision_sigmas(context), context)[1]
    assert twin.ci95["Mandate Penalty − best_constant"] == (0.0, 0.0)  # paired on the same decisions


def test_spa_against_vol_target_is_on_the_decisions_misses(context) -> None:
    """The mandate's SPA and StepM judge every run against vol_target on each decision's miss: a run holding, at
    every decision, the size that misses least once the interval's volatility is known (look-ahead, so never a
    strategy) is better or as good at every decision, and StepM names it; buy-and-hold, which misses more on
    this sample, is not named; a twin of vol_target is tied and left out."""
    runs = {name: run_baseline(name, context) for name in ("vol_target", "buy_and_hold")}
    sigmas = decision_sigmas(context)
    misses = np.array([[((w * s - 0.4) / 0.4) ** 2 for w in SIZES] for s in sigmas])  # (D, sizes)
    hindsight = np.asarray(SIZES)[misses.argmin(axis=1)]
    runs["hindsight"] = replace(runs["vol_target"], name="hindsight", exposures=hindsight)
    runs["twin"] = replace(runs["vol_target"], name="twin")
    scored = {run.name: run for run in with_mandate(list(runs.values()), sigmas, context)}
    test = scored["vol_target"].superiority
    assert test is not None and test.loss == mandate.PENALTY_LOSS and test.benchmark == "vol_target"
    assert test.candidates == ("buy_and_hold", "hindsight", "twin") and test.tied == ("twin",)
    assert test.superior == ("hindsight",) and test.pvalue < 0.05
    assert all(scored[name].superiority is None for name in ("buy_and_hold", "hindsight", "twin"))


def test_mandate_baselines_need_the_mandate(capsys) -> None:
    code = main(["backtest", "--config", "smoke", "--strategy", "best_constant"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "env.mandate: vol_target" in err
    code = main(["backtest", "--config", "smoke", "--strategy", "vol_forecast"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "env.mandate: vol_target" in err
    for setting in ("backtest.params.best_constant.size=1", "backtest.params.vol_forecast.residual_var=0"):
        code = main(["backtest", "--config", "btc_voltarget_tiny", "--set", setting])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "chosen on the train split" in err


def test_without_a_model_the_baselines_are_measured_where_a_model_would_decide(capsys, tmp_path) -> None:
    """A trailing-volatility rule holds cash (penalty 1) until it has a week of history, so a baselines-only
    report starts, as a model's plan does, after env.warmup_bars (168 bars, 7 daily decisions)."""
    code = main(["backtest", "--config", "btc_voltarget_tiny", "--out", str(tmp_path / "r"),
                 "--set", "backtest.bootstrap_resamples=100", "--set", "backtest.random_seeds=2"])
    capsys.readouterr()
    assert code == 0
    document = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert document["decisions"]["first_bar"] == 168
    for rule in ("vol_target", "vol_forecast"):  # never idle in cash for want of history
        assert document["strategies"][rule]["Exposure Mix: 0 [%]"] == 0.0


def test_a_baseline_above_the_largest_position_is_one_line(capsys, tmp_path) -> None:
    code = main(["backtest", "--config", "smoke", "--strategy", "vol_target", "--out", str(tmp_path / "r"),
                 "--set", "backtest.params.vol_target.max_leverage=1.5"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "above the largest position held here, 1" in err


# --------------------------------------------------------------------------- through the CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "r1trade.cli", *args], capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.slow
def test_warm_start_train_then_backtest_the_rung_through_the_cli(tmp_path: Path) -> None:
    warmed = _cli("warmstart", "--config", "btc_voltarget_tiny", "--set", "warmstart.max_steps=2",
                  "--set", "warmstart.episodes=2", "--set", f"output_dir={tmp_path}")
    assert warmed.returncode == 0, warmed.stderr[-3000:]  # its demonstrations fit rollout.max_new_tokens
    warm = tmp_path / "btc_voltarget_tiny-warmstart" / "model"
    trained = _cli(
        "train", "--config", "btc_voltarget_tiny", "--set", f"model.name_or_path={warm}",
        "--set", "train.updates=1", "--set", "rollout.num_envs=4",
        "--set", "env.episode_decisions=1", "--set", "rollout.max_new_tokens=12", "--set", "train.epochs=1",
        "--set", "train.minibatch_size=4", "--set", "train.micro_batch_size=4",
        "--set", f"output_dir={tmp_path}",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    record = json.loads((tmp_path / "btc_voltarget_tiny" / "metrics.jsonl").read_text().splitlines()[0])
    assert any("mandate" in key for key in record)  # the component is logged on its own
    out = tmp_path / "report"
    tested = _cli(
        "backtest", "--checkpoint", str(tmp_path / "btc_voltarget_tiny" / "checkpoints" / "step-1"),
        "--baseline", "base-model", "--walk-forward", "2", "--set", "backtest.max_decisions=2",
        "--set", "backtest.agent_windows=1", "--set", "rollout.max_new_tokens=12",
        "--set", "backtest.bootstrap_resamples=100", "--set", "backtest.random_seeds=2", "--out", str(out),
    )
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "Volatility-target mandate (target 40 % a year" in tested.stdout
    document = json.loads((out / "metrics.json").read_text())
    assert f"RL started from: {warm}" in document["folds"][0]["notes"]["base model"]  # the warm start
    assert document["mandate"]["target_vol"] == 0.4 and document["mandate"]["exposures"] == SIZES
    names = {"agent (step-1)", "base model", "vol_target", "vol_forecast", "best_constant", "buy_and_hold",
             "random_sizes"}
    assert set(document["strategies"]) == names
    for fold in document["folds"]:
        assert fold["decisions"]["count"] == 2
        for entry in fold["strategies"].values():
            assert 0 <= entry["Mandate Penalty"] and entry["Target Volatility [%]"] == 40.0
            assert {"Mandate Penalty", "Realised Volatility [%]"} <= set(entry["ci95"])
    for name, pooled in document["strategies"].items():
        # pooled over the folds' decisions: the decision-weighted mean of the folds' penalties (2 and 2)
        folds = [fold["strategies"][name]["Mandate Penalty"] for fold in document["folds"]]
        assert pooled["Mandate Penalty"] == pytest.approx(sum(folds) / 2), name
        assert {"Mandate Penalty", "Realised Volatility [%]"} <= set(pooled["ci95"])
    assert "Mandate Penalty − best_constant" in document["strategies"]["agent (step-1)"]["ci95"]
    assert document["spa"]["vol_target"]["losses"] == mandate.PENALTY_LOSS  # the mandate's own question
    assert document["spa"]["buy_and_hold"]["losses"] == "minus each decision's excess return"
    assert "SPA against vol_target over 6 runs, on each decision's mandate miss" in tested.stdout
    for name in ("best_constant", "vol_forecast"):
        chosen = document["folds"][0]["notes"][name]
        assert chosen.startswith("holds ") and "the train split" in chosen
    assert "| Mandate Penalty |" in (out / "metrics.md").read_text()
