"""The block bootstrap over decisions: worked examples, agreement with the metrics table, coverage, pairs."""

import math

import numpy as np
import pytest
from conftest import make_synthetic_candles

from r1trade.backtest.bootstrap import (
    DecisionSample,
    block_indices,
    decision_sample,
    percentile_interval,
    resampled_statistics,
    stationary_indices,
)
from r1trade.backtest.metrics import sharpe_ratio
from r1trade.backtest.report_runs import ReportContext
from r1trade.backtest.runner import run_baseline
from r1trade.backtest.uncertainty import paired_comparison, run_sample, verdict, with_uncertainty
from r1trade.config import Config
from r1trade.data.splits import split_by_fraction


def test_block_indices_worked_example() -> None:
    # n = 5. Row 0: blocks begin at t = 0 (start 3) and t = 2 (start 1): 3, 4 | 1, 2, 3.
    # Row 1: one block from 4, wrapping past the last decision: 4, 0, 1, 2, 3.
    # Row 2: a new block at every position (mean block length 1): the starts themselves.
    starts = np.array([[3, 0, 1, 4, 2], [4, 9, 9, 9, 9], [2, 2, 0, 4, 1]])
    new_block = np.array([[1, 0, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)
    assert block_indices(starts, new_block).tolist() == [[3, 4, 1, 2, 3], [4, 0, 1, 2, 3], [2, 2, 0, 4, 1]]


def test_stationary_indices_are_seeded_runs_of_geometric_length() -> None:
    draw = stationary_indices(200, resamples=300, mean_block=8, rng=np.random.default_rng(1))
    again = stationary_indices(200, resamples=300, mean_block=8, rng=np.random.default_rng(1))
    assert draw.shape == (300, 200) and np.array_equal(draw, again)
    assert draw.min() >= 0 and draw.max() < 200
    # inside a block each position follows the previous one (mod n); a new block begins with probability 1/8,
    # at a random decision that follows the previous one by chance with probability 1/200
    continues = (draw[:, 1:] - draw[:, :-1]) % 200 == 1
    assert 1 - continues.mean() == pytest.approx(1 / 8 * (1 - 1 / 200), abs=0.01)
    # every decision is drawn about equally often (300 times on average)
    assert np.bincount(draw.ravel(), minlength=200).std() / 300 < 0.1


def test_decision_sample_and_resampled_statistics_worked_example() -> None:
    # equity 100 → 110 → 99 → 99 → 108.9 → 119.79: per-bar returns r = +.1, -.1, 0, +.1, +.1
    # decisions at bars 0, 2, 4: the first owns r0, r1 (growth 99 / 100), the second r2, r3 (108.9 / 99),
    # the last r4 (119.79 / 108.9)
    equity = np.array([100, 110, 99, 99, 108.9, 119.79])
    sample = decision_sample(equity, np.array([0, 2, 4]), np.array([1.0, 0.0, 1.0]))
    np.testing.assert_allclose(sample.growth, [0.99, 1.1, 1.1])
    np.testing.assert_allclose(sample.sums, [0.0, 0.1, 0.1], atol=1e-15)
    np.testing.assert_allclose(sample.squares, [0.02, 0.01, 0.01])
    assert sample.bars.tolist() == [2, 2, 1] and len(sample) == 3

    stats = resampled_statistics(sample, np.array([[0, 1, 2], [2, 2, 2], [1, 0, 0]]), bars_per_year=365)
    # row 0 is the original order: return 100 (0.99 × 1.1 × 1.1 - 1) = 19.79 %; mean r = 0.04,
    # var = (0.04 - 5 × 0.04²) / 4 = 0.008, Sharpe = 0.04 / sqrt(0.008) × sqrt(365) = 8.5440037...;
    # 2 of 3 right
    # row 1: three copies of the last decision: 100 (1.1³ - 1) = 33.1 %; every return 0.1, std 0: no Sharpe
    # row 2: decisions 1, 0, 0: bar returns 0, .1, .1, -.1, .1, -.1; growth 1.1 × 0.99² → 7.811 %;
    # hits 0, 1, 1
    np.testing.assert_allclose(stats["Return [%]"], [19.79, 33.1, 7.811])
    assert stats["Sharpe Ratio"][0] == pytest.approx(0.04 / math.sqrt(0.008) * math.sqrt(365), rel=1e-9)
    assert math.isnan(stats["Sharpe Ratio"][1])
    resampled = np.array([0, 0.1, 0.1, -0.1, 0.1, -0.1])
    assert stats["Sharpe Ratio"][2] == pytest.approx(sharpe_ratio(resampled, bars_per_year=365), rel=1e-9)
    np.testing.assert_allclose(stats["Direction Accuracy [%]"], [200 / 3, 100.0, 200 / 3])


def test_decision_sample_refuses_what_it_cannot_cut() -> None:
    with pytest.raises(ValueError, match="one hit per decision"):
        decision_sample(np.ones(5), np.array([0, 2]), np.ones(3))
    with pytest.raises(ValueError, match="before the last bar"):
        decision_sample(np.ones(5), np.array([0, 4]), np.ones(2))


def test_percentile_interval() -> None:
    assert percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5))
    assert percentile_interval(np.r_[np.arange(101.0), np.nan]) == pytest.approx((2.5, 97.5))  # NaN left out
    assert all(math.isnan(v) for v in percentile_interval(np.array([np.nan, np.nan])))


@pytest.fixture
def context() -> ReportContext:
    config = Config(name="unit")
    splits = split_by_fraction(make_synthetic_candles(1200), train=0.5, validation=0.25)
    return ReportContext(config=config, splits=splits, split="test", bars_per_year=8760.0)


@pytest.mark.parametrize("name", ["buy_and_hold", "sma_crossover", "random"])
def test_the_original_order_reproduces_the_metrics_table(context: ReportContext, name: str) -> None:
    # the random baseline's table Sharpe is the mean of its seeds' Sharpe ratios; its sample is its mean curve
    run = run_baseline(name, context)
    sample = run_sample(run, context)
    assert sample is not None and len(sample) == len(context.decision_bars)
    stats = resampled_statistics(sample, np.arange(len(sample))[None, :], bars_per_year=context.bars_per_year)
    for metric in ("Return [%]", "Sharpe Ratio", "Direction Accuracy [%]"):
        if name == "random" and metric == "Sharpe Ratio":
            continue
        assert stats[metric][0] == pytest.approx(run.metrics[metric], rel=1e-9, abs=1e-9), metric


def test_interval_of_a_known_mean_covers_it_about_95_percent_of_the_time() -> None:
    # 200 seeded AR(1) series (phi = 0.3) of 500 decisions around a known mean; the statistic is the mean of
    # the per-decision values (Direction Accuracy [%] of fractional hits, × 100). The stationary bootstrap
    # with mean blocks of 10 covers the true mean in about 93 % of the repetitions; the i.i.d. bootstrap
    # (blocks of 1) on strongly autocorrelated series (phi = 0.8) covers it far less often: hence blocks.
    def coverage(phi: float, mean_block: float) -> float:
        rng = np.random.default_rng(7)
        reps, n, mean = 200, 500, 0.5
        noise = rng.normal(size=(reps, n))
        series = np.empty((reps, n))
        series[:, 0] = noise[:, 0] / math.sqrt(1 - phi**2)
        for t in range(1, n):
            series[:, t] = phi * series[:, t - 1] + noise[:, t]
        covered = 0
        for values in mean + 0.1 * series:
            ones = np.ones(n)
            sample = DecisionSample(growth=ones, sums=0 * ones, squares=0 * ones, bars=ones, hits=values)
            indices = stationary_indices(n, resamples=400, mean_block=mean_block, rng=rng)
            stats = resampled_statistics(sample, indices, bars_per_year=1.0)
            low, high = percentile_interval(stats["Direction Accuracy [%]"])
            covered += low <= 100 * mean <= high
        return covered / reps

    assert 0.90 <= coverage(0.3, 10) <= 0.99
    assert coverage(0.8, 1) < 0.8


def test_verdict_rule() -> None:
    assert verdict((0.5, 3.0)) == "better"
    assert verdict((-3.0, -0.5)) == "worse"
    assert verdict((-1.0, 2.0)) == "undecided"
    assert verdict((math.nan, math.nan)) == "undecided"


def test_paired_differences_use_the_same_resamples(context: ReportContext) -> None:
    # a run compared with itself differs by exactly 0 in every resample
    run = run_baseline("sma_crossover", context)
    sample = run_sample(run, context)
    indices = stationary_indices(len(sample), resamples=200, mean_block=5, rng=np.random.default_rng(0))
    stats = resampled_statistics(sample, indices, bars_per_year=8760.0)
    same = paired_comparison(stats, stats, run.metrics, run.metrics)
    assert same["Return [%]"] == (0.0, 0.0) and same["verdict"] == "undecided"
    assert same["difference"]["Direction Accuracy [%]"] == 0.0 and same["verdict_on"] == "Return [%]"


def test_with_uncertainty_gives_models_a_verdict_and_deflated_sharpe(context: ReportContext) -> None:
    runs = [run_baseline(name, context) for name in ("sma_crossover", "buy_and_hold")]
    samples = {run.name: run_sample(run, context) for run in runs}
    done = with_uncertainty(runs, samples, context, models={"sma_crossover"}, trials=3)
    model, reference = done
    for run in done:
        assert list(run.ci95) == ["Return [%]", "Sharpe Ratio", "Direction Accuracy [%]"]
        for metric, (low, high) in run.ci95.items():
            assert low <= high
            if metric != "Sharpe Ratio":  # the percentile interval holds the point estimate here
                assert low <= run.metrics[metric] <= high
    assert model.vs_buy_and_hold["verdict"] in ("better", "worse", "undecided")
    assert model.vs_buy_and_hold["difference"]["Return [%]"] == pytest.approx(
        model.metrics["Return [%]"] - reference.metrics["Return [%]"]
    )
    assert reference.vs_buy_and_hold is None and reference.deflated_sharpe is None
    assert model.deflated_sharpe.trials == 3 and 0 <= model.deflated_sharpe.probability <= 1
    # seeded: the same intervals every time
    assert with_uncertainty(runs, samples, context, models={"sma_crossover"}, trials=3)[0].ci95 == model.ci95
    # one trial: nothing to deflate
    single = with_uncertainty(runs, samples, context, models={"sma_crossover"}, trials=1)
    assert single[0].deflated_sharpe is None
