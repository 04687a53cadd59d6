"""How sure a backtest's figures are: 95 % intervals, a model's verdict against buy-and-hold, deflated Sharpe.

Every run with scored decisions gets block-bootstrap intervals (`r1trade.backtest.bootstrap`) on Return [%],
Sharpe Ratio and Direction Accuracy [%]. One set of resampled decisions, seeded with the config's seed, serves
every run of a backtest (of a fold, or of the pooled folds), so a model and buy-and-hold are always resampled
on the same decisions: their differences are paired. A model's verdict is decided on the interval of its
Return [%] difference with buy-and-hold (`VERDICT_METRIC`): "better" when the interval lies above 0, "worse"
when below, "undecided" when it holds 0. The random baseline is resampled as its mean equity curve and the
share of its seeds right at each decision (its table's Sharpe Ratio is the mean of its seeds', so may lie
outside its interval).

When several variants were compared on the same data (`trials` >= 2; by default counted by
`r1trade.backtest.verdicts.count_trials`), the models' Sharpe ratios (in a report without models, every
strategy's) are deflated (`r1trade.backtest.significance`) using their per-decision excess returns. Every run
with decisions also gets its probabilistic Sharpe ratio and minimum track record, and each benchmark run
(buy-and-hold, vol_target) the SPA and StepM tests of every other run against it
(`r1trade.backtest.verdicts`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from r1trade.backtest.bootstrap import (
    INTERVAL_METRICS,
    DecisionSample,
    decision_sample,
    percentile_interval,
    resampled_statistics,
    stationary_indices,
)
from r1trade.backtest.metrics import per_bar_rate
from r1trade.backtest.report_runs import ReportContext, StrategyRun
from r1trade.backtest.significance import deflated_sharpe
from r1trade.backtest.verdicts import decision_returns, superiority_tests, track_record

VERDICT_METRIC = "Return [%]"
"""The difference with buy-and-hold whose interval decides a model's verdict."""
REFERENCE = "buy_and_hold"


def run_sample(run: StrategyRun, context: ReportContext) -> DecisionSample | None:
    """The run's evaluated bars cut at the context's decisions; None for a run without scored decisions."""
    bars = context.decision_bars
    if run.hits is None or len(bars) == 0:
        return None
    equity = run.equity.reindex(context.candles.index).to_numpy(dtype=float)
    return decision_sample(equity, bars, run.hits, rf_per_bar=_rf_per_bar(context))


def with_uncertainty(
    runs: Sequence[StrategyRun],
    samples: Mapping[str, DecisionSample],
    context: ReportContext,
    *,
    models: Collection[str],
    trials: int,
    trials_source: str = "",
) -> list[StrategyRun]:
    """`runs` with their intervals, the models' comparison with buy-and-hold, the deflated Sharpe ratios (of
    `trials` variants; `trials_source` says where that number comes from), each run's PSR and minimum track
    record, and the SPA and StepM tests against the benchmark runs.

    samples: each run's decisions (`run_sample`, or the folds' concatenated), all of one length; runs without
    a sample are returned as they are. context: gives the settings (block, resamples, seed, risk-free rate).
    """
    if not samples:
        return list(runs)
    (count,) = {len(sample) for sample in samples.values()}
    settings = context.config.backtest
    indices = stationary_indices(  # (resamples, count), shared by every run: paired differences
        count, resamples=settings.bootstrap_resamples, mean_block=settings.bootstrap_block,
        rng=np.random.default_rng(context.config.seed),
    )
    stats = {
        name: resampled_statistics(sample, indices, bars_per_year=context.bars_per_year)
        for name, sample in samples.items()
    }
    by_name = {run.name: run for run in runs}
    deflated = (set(models) or set(samples)) if trials >= 2 else set()
    returns = {name: decision_returns(sample, context) for name, sample in samples.items()}  # each (count,)
    tests = {test.benchmark: test for test in superiority_tests(returns, context)}
    updated = []
    for run in runs:
        if run.name not in stats:
            updated.append(run)
            continue
        psr, record = track_record(samples[run.name], context)
        changes: dict[str, Any] = {
            "ci95": {metric: percentile_interval(stats[run.name][metric]) for metric in INTERVAL_METRICS},
            "psr": psr,
            "min_track_record": record,
            "superiority": tests.get(run.name),
        }
        if run.name in models and REFERENCE in stats:
            changes["vs_buy_and_hold"] = paired_comparison(
                stats[run.name], stats[REFERENCE], run.metrics, by_name[REFERENCE].metrics
            )
        if run.name in deflated:
            changes["deflated_sharpe"] = deflated_sharpe(
                returns[run.name], trials=trials, trials_source=trials_source
            )
        updated.append(replace(run, **changes))
    return updated


def paired_comparison(
    stats: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    metrics: Mapping[str, Any],
    reference_metrics: Mapping[str, Any],
) -> dict[str, Any]:
    """Intervals of the differences run - reference over the same resamples, the differences themselves, and
    the verdict on `VERDICT_METRIC`."""
    intervals = {m: percentile_interval(stats[m] - reference[m]) for m in INTERVAL_METRICS}
    return {
        **intervals,
        "difference": {m: float(metrics[m]) - float(reference_metrics[m]) for m in INTERVAL_METRICS},
        "verdict": verdict(intervals[VERDICT_METRIC]),
        "verdict_on": VERDICT_METRIC,
    }


def verdict(interval: tuple[float, float]) -> str:
    """"better" when a difference's interval lies above 0, "worse" when below, else (or NaN) "undecided"."""
    low, high = interval
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "undecided"


def _rf_per_bar(context: ReportContext) -> float:
    rate = context.config.backtest.risk_free_rate
    return per_bar_rate(rate, context.bars_per_year) if rate else 0.0
