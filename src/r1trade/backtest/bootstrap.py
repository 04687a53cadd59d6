"""Stationary block bootstrap (Politis & Romano 1994) over a backtest's decisions, for 95 % intervals.

Per-bar returns are autocorrelated (a position is held for several bars, volatility clusters), so resampling
single returns would understate the uncertainty. The unit resampled is a decision: the bars from one decision
bar to the next, with every per-bar return in them, and whether the decision's direction was right. Blocks of
consecutive decisions start at uniformly drawn decisions and have geometric lengths of mean `mean_block`
(wrapping from the last decision to the first), until a resample holds as many decisions as the original.

A resample's statistics are the metrics table's, computed on the resampled bars (`resampled_statistics`):
- Return [%] = 100 (Π growth - 1), growth = equity at the end of a decision's bars / equity at their start
- Sharpe Ratio = mean / std(ddof=1) of the per-bar excess returns × sqrt(bars per year)
- Direction Accuracy [%] = 100 mean(hits)
The decisions partition the evaluated bars (the first also owns the bars before it, the last those after it),
so on the original order these equal the table's values.

An interval is the percentile interval: the 2.5th and 97.5th percentiles of the resampled statistic.
A paired difference (a model minus buy-and-hold) evaluates both runs on the same resampled decisions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INTERVAL_METRICS = ("Return [%]", "Sharpe Ratio", "Direction Accuracy [%]")
"""The metrics that get 95 % intervals, in the order they are reported."""


@dataclass(frozen=True)
class DecisionSample:
    """A run's evaluated bars grouped by decision; every array holds one value per decision, (D,)."""

    growth: np.ndarray
    """Equity at the decision's last bar over equity at its first (its bars' compounded return + 1)."""
    sums: np.ndarray
    """Sum of the per-bar excess returns in the decision's bars."""
    squares: np.ndarray
    """Sum of their squares."""
    bars: np.ndarray
    """Number of per-bar returns in the decision's bars."""
    hits: np.ndarray
    """1 where the decision's direction was right, 0 where not (a share for a run averaged over seeds)."""

    def __len__(self) -> int:
        return len(self.hits)

    def excess_returns(self, rf_per_bar: float = 0.0) -> np.ndarray:
        """(D,) each decision's return over its bars less the risk-free growth over them."""
        return self.growth - (1.0 + rf_per_bar) ** self.bars

    @staticmethod
    def concat(samples: Sequence[DecisionSample]) -> DecisionSample:
        """The decisions of several samples (walk-forward folds) in order, as one sample."""
        fields = DecisionSample.__dataclass_fields__
        return DecisionSample(*(np.concatenate([getattr(s, name) for s in samples]) for name in fields))


def decision_sample(
    equity: np.ndarray, decision_bars: np.ndarray, hits: np.ndarray, *, rf_per_bar: float = 0.0
) -> DecisionSample:
    """Cut an equity curve (one value per evaluated bar) at its decision bars (positions in it, increasing).

    Decision i owns the per-bar returns from bar decision_bars[i] to decision_bars[i + 1]; the first decision
    starts at bar 0 and the last ends at the last bar, so the decisions hold every return of the curve.
    """
    equity, bars = np.asarray(equity, dtype=float), np.asarray(decision_bars, dtype=np.int64)
    if len(bars) == 0 or len(hits) != len(bars):
        raise ValueError("need at least one decision and one hit per decision")
    bounds = np.r_[0, bars[1:], len(equity) - 1]  # (D + 1,)
    if np.any(np.diff(bounds) < 1):
        raise ValueError("decision bars must increase and lie before the last bar")
    excess = equity[1:] / equity[:-1] - 1.0 - rf_per_bar  # (n - 1,): return from bar j to bar j + 1
    return DecisionSample(
        growth=equity[bounds[1:]] / equity[bounds[:-1]],
        sums=np.add.reduceat(excess, bounds[:-1]),
        squares=np.add.reduceat(excess**2, bounds[:-1]),
        bars=np.diff(bounds).astype(float),
        hits=np.asarray(hits, dtype=float),
    )


def block_indices(starts: np.ndarray, new_block: np.ndarray) -> np.ndarray:
    """Resampled positions from block starts and block breaks, both (R, n): where new_block[r, t], a block
    begins at starts[r, t]; elsewhere position t continues its block by one, wrapping from n - 1 to 0."""
    n = starts.shape[1]
    position = np.arange(n)
    opened = np.maximum.accumulate(np.where(new_block, position, 0), axis=1)  # (R, n): where t's block began
    return (np.take_along_axis(starts, opened, axis=1) + position - opened) % n


def stationary_indices(n: int, *, resamples: int, mean_block: float, rng: np.random.Generator) -> np.ndarray:
    """(resamples, n) positions of the stationary bootstrap: blocks of geometric length with mean `mean_block`
    (a new block begins at each position with probability 1 / mean_block, and always at the first)."""
    if n < 1 or resamples < 1 or mean_block < 1:
        raise ValueError("need n >= 1, resamples >= 1 and mean_block >= 1")
    starts = rng.integers(0, n, size=(resamples, n))
    new_block = rng.random((resamples, n)) < 1.0 / mean_block
    new_block[:, 0] = True
    return block_indices(starts, new_block)


def resampled_statistics(
    sample: DecisionSample, indices: np.ndarray, *, bars_per_year: float
) -> dict[str, np.ndarray]:
    """Return [%], Sharpe Ratio and Direction Accuracy [%] of each resample (`indices`: (R, D) decisions)."""
    bars = sample.bars[indices].sum(axis=1)  # (R,)
    mean = sample.sums[indices].sum(axis=1) / bars
    variance = (sample.squares[indices].sum(axis=1) - bars * mean**2) / np.maximum(bars - 1.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = mean / np.sqrt(variance) * math.sqrt(bars_per_year)
        sharpe = np.where((variance > 0) & (bars > 1), ratio, np.nan)
    return {
        "Return [%]": 100.0 * (np.prod(sample.growth[indices], axis=1) - 1.0),
        "Sharpe Ratio": sharpe,
        "Direction Accuracy [%]": 100.0 * sample.hits[indices].mean(axis=1),
    }


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of `values`, NaN resamples left out; (NaN, NaN) if all are."""
    finite = values[~np.isnan(values)]
    if len(finite) == 0:
        return (math.nan, math.nan)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return (float(low), float(high))
