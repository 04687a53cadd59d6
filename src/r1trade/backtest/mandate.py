"""The volatility-target mandate in a backtest: each decision's miss, the mandate's rows and their intervals.

Under `env.mandate: vol_target` every strategy is scored on the report's decision bars
(`ReportContext.decision_bars`, every `env.decision_every` bars) as the env's reward scores the agent: the
long size w it holds after each decision against the market's realised volatility σ over the interval that
follows (`interval_volatility`, annualised over a 365-day year), with σ* = `rewards.vol_target`. A rule
baseline decides only at those bars (`decided_at`), so its w is its target there; a model's is its order's.

- `Mandate Penalty`: the mean miss ((w σ − σ*) / σ*)² over the decisions (`vol_target_miss`; cash: 1; lower
  is better);
- `Realised Volatility [%]`: 100 × the root mean square of the delivered volatilities w σ, against
- `Target Volatility [%]`: 100 σ*;
- `Size-Volatility Rank Correlation`: Spearman's ρ between w and σ over the decisions: does a strategy hold
  less through the more volatile days? A sizer that reads a volatility forecast is negative, a constant size
  has none (NaN);
- `Exposure Mix: <size> [%]` (below the metrics): the share of decisions held at each of `env.exposures`.

Their 95 % intervals come from the stationary block bootstrap over decisions of the other intervals, with the
same seed and so the same resampled decisions (`r1trade.backtest.bootstrap`); each run's penalty minus
best_constant's (`REFERENCE`) is paired on them. A run averaged over seeds has one row of sizes per seed: its
misses and delivered variances are averaged over the seeds at each decision.

Does any run meet the mandate better than the `vol_target` rule, once every run compared is counted? SPA and
StepM (`r1trade.backtest.superiority`) answer it on the decisions' misses, on the same bootstrap settings; the
test is the `vol_target` run's `superiority`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from r1trade.backtest.bootstrap import percentile_interval, stationary_indices
from r1trade.backtest.metrics import infer_bars_per_year
from r1trade.backtest.report_runs import (
    MANDATE_PENALTY,
    REALISED_VOLATILITY,
    SIZE_VOLATILITY_CORRELATION,
    TARGET_VOLATILITY,
    ReportContext,
    StrategyRun,
)
from r1trade.backtest.superiority import superiority_on_losses
from r1trade.config import Config
from r1trade.env.rewards import vol_target_miss
from r1trade.env.volatility import interval_volatility

REFERENCE = "best_constant"
"""The run every other run's penalty is compared with: the constant size chosen on the train split."""
MANDATE_BENCHMARK = "vol_target"
"""The rule the SPA and StepM tests of the mandate judge every other run against."""
PENALTY_LOSS = "each decision's mandate miss ((w σ − σ*) / σ*)²"


def is_mandate(config: Config) -> bool:
    """Whether the config's env holds the volatility-target mandate."""
    return config.env.mandate == "vol_target"


def decision_misses(exposures: np.ndarray, sigmas: np.ndarray, *, target_vol: float) -> np.ndarray:
    """`vol_target_miss` of every decision: exposures (D,) or (seeds, D), sigmas (D,) annualised -> the
    shape of exposures."""
    miss = np.vectorize(lambda w, s: vol_target_miss(exposure=w, realised_vol=s, target_vol=target_vol))
    return np.asarray(miss(np.asarray(exposures, dtype=float), np.asarray(sigmas, dtype=float)), dtype=float)


def split_decisions(candles: pd.DataFrame, *, every: int, first: int) -> tuple[np.ndarray, np.ndarray]:
    """The decision bars first, first + every, ... of `candles` that have a whole interval after them, and the
    market's annualised volatility over each interval: what `best_constant` and `vol_forecast` are chosen on.
    ValueError when no decision fits."""
    closes = candles["close"].to_numpy(dtype=float)
    decisions = np.arange(first, len(closes) - every, every)
    if len(decisions) == 0:
        raise ValueError(f"no decision every {every} bars from bar {first} fits in {len(closes)} bars")
    per_year = infer_bars_per_year(candles.index)
    return decisions, interval_volatility(closes, decisions, every) * np.sqrt(per_year)


def decision_sigmas(context: ReportContext) -> np.ndarray:
    """(D,) the market's annualised volatility over the interval after each of the context's decisions."""
    closes = context.candles["close"].to_numpy(dtype=float)
    every = context.config.env.decision_every
    return interval_volatility(closes, context.decision_bars, every) * math.sqrt(context.bars_per_year)


def decided_at(target: pd.Series, decision_bars: np.ndarray) -> pd.Series:
    """`target` as a policy that decides only at `decision_bars` (positions in it, increasing) holds it: its
    value at each decision bar, held until the next; flat before the first."""
    held = np.full(len(target), np.nan)
    held[decision_bars] = target.to_numpy(dtype=float)[decision_bars]
    return pd.Series(held, index=target.index, name=target.name).ffill().fillna(0.0)


def mandate_rows(exposures: np.ndarray, sigmas: np.ndarray, *, target_vol: float) -> dict[str, float]:
    """The mandate's rows of one run: mean penalty, realised against target volatility, and how its sizes
    follow the volatility (see the module)."""
    penalty, variance = _per_decision(exposures, sigmas, target_vol=target_vol)
    return {
        MANDATE_PENALTY: float(penalty.mean()),
        REALISED_VOLATILITY: 100.0 * math.sqrt(float(variance.mean())),
        TARGET_VOLATILITY: 100.0 * target_vol,
        SIZE_VOLATILITY_CORRELATION: float(size_volatility_correlation(exposures, sigmas)[0]),
    }


def size_volatility_correlation(
    exposures: np.ndarray, sigmas: np.ndarray, indices: np.ndarray | None = None
) -> np.ndarray:
    """Spearman's ρ (ties at their average rank) between the sizes held and the volatility σ they were held
    through, over every (seed, decision): exposures (D,) or (S, D), sigmas (D,); with `indices` (R, D), one ρ per
    resample of decisions. -> (1,) or (R,); NaN where the sizes or the σ are constant.

    >>> size_volatility_correlation(np.array([1.0, 0.5, 0.5, 0.25]), np.array([0.2, 0.4, 0.5, 0.8]))
    array([-0.9486833])
    """
    exposures = np.atleast_2d(np.asarray(exposures, dtype=float))  # (S, D)
    picks = np.arange(exposures.shape[1])[None, :] if indices is None else indices  # (R, D)
    sizes = exposures[:, picks].transpose(1, 0, 2).reshape(len(picks), -1)  # (R, S·D)
    vols = np.tile(np.asarray(sigmas, dtype=float)[picks], exposures.shape[0])  # (R, S·D)
    ranked = [pd.DataFrame(values).rank(axis=1).to_numpy() for values in (sizes, vols)]
    centred = [values - values.mean(axis=1, keepdims=True) for values in ranked]
    spread = np.sqrt((centred[0] ** 2).sum(axis=1) * (centred[1] ** 2).sum(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (centred[0] * centred[1]).sum(axis=1) / spread
    return np.where(spread > 1e-12, rho, np.nan)


def with_mandate(
    runs: Sequence[StrategyRun], sigmas: np.ndarray, context: ReportContext
) -> list[StrategyRun]:
    """`runs` with the mandate's rows, their 95 % intervals (beside `REFERENCE`, also the paired interval of
    the penalty difference) and exposure mix; runs without exposures are returned as they are. sigmas: (D,),
    one per decision of the runs' exposures (the folds' concatenated for a pooled run)."""
    target, settings = context.config.rewards.vol_target, context.config.backtest
    scored = {run.name: _per_decision(run.exposures, sigmas, target_vol=target) for run in runs
              if run.exposures is not None}
    if not scored:
        return list(runs)
    indices = stationary_indices(  # (resamples, D): the same decisions as the other intervals (same seed)
        len(sigmas), resamples=settings.bootstrap_resamples, mean_block=settings.bootstrap_block,
        rng=np.random.default_rng(context.config.seed),
    )
    reference = scored.get(REFERENCE)
    updated = []
    for run in runs:
        if run.name not in scored:
            updated.append(run)
            continue
        penalty, variance = scored[run.name]
        intervals = {
            MANDATE_PENALTY: percentile_interval(penalty[indices].mean(axis=1)),
            REALISED_VOLATILITY: percentile_interval(100.0 * np.sqrt(variance[indices].mean(axis=1))),
            SIZE_VOLATILITY_CORRELATION: percentile_interval(
                size_volatility_correlation(run.exposures, sigmas, indices)
            ),
        }
        if reference is not None and run.name != REFERENCE:
            difference = penalty - reference[0]  # (D,) paired, decision by decision
            intervals[f"{MANDATE_PENALTY} − {REFERENCE}"] = percentile_interval(
                difference[indices].mean(axis=1)
            )
        rows = mandate_rows(run.exposures, sigmas, target_vol=target)
        mix = exposure_mix(run.exposures, context.config.env.exposures)
        updated.append(replace(run, metrics={**run.metrics, **rows}, ci95={**run.ci95, **intervals},
                               extra={**run.extra, **mix}))
    if MANDATE_BENCHMARK in scored and len(scored) > 1 and len(sigmas) >= 3:
        test = superiority_on_losses(
            {name: penalty for name, (penalty, _) in scored.items()}, MANDATE_BENCHMARK, loss=PENALTY_LOSS,
            block=settings.bootstrap_block, resamples=settings.bootstrap_resamples, seed=context.config.seed,
        )
        updated = [replace(run, superiority=test) if run.name == MANDATE_BENCHMARK else run for run in updated]
    return updated


def exposure_mix(exposures: np.ndarray, sizes: Sequence[float]) -> dict[str, float]:
    """`Exposure Mix: <size> [%]`: the share of decisions (of seeds and decisions) held at each of `sizes`.

    >>> exposure_mix(np.array([0.5, 0.5, 0.0, 1.5]), [0, 0.5, 1.5])
    {'Exposure Mix: 0 [%]': 25.0, 'Exposure Mix: 0.5 [%]': 50.0, 'Exposure Mix: 1.5 [%]': 25.0}
    """
    held = np.asarray(exposures, dtype=float)
    return {f"Exposure Mix: {size:g} [%]": 100.0 * float(np.mean(np.isclose(held, size)))
            for size in sorted(sizes)}


def _per_decision(
    exposures: np.ndarray, sigmas: np.ndarray, *, target_vol: float
) -> tuple[np.ndarray, np.ndarray]:
    """(D,) misses and (D,) delivered variances (w σ)², each averaged over seeds when exposures is (S, D)."""
    exposures = np.atleast_2d(np.asarray(exposures, dtype=float))  # (S, D)
    if exposures.shape[1] != len(sigmas):
        raise ValueError(f"{exposures.shape[1]} exposures for {len(sigmas)} decisions")
    misses = decision_misses(exposures, sigmas, target_vol=target_vol)  # (S, D)
    return misses.mean(axis=0), ((exposures * sigmas) ** 2).mean(axis=0)
