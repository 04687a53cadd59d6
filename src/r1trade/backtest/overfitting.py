"""The probability of backtest overfitting (PBO) by combinatorially symmetric cross-validation (CSCV; Bailey,
Borwein, López de Prado & Zhu 2017): how often does the variant that looks best on one half of the data rank
below the median of the variants on the other half?

The returns of N variants (trials) over the same T periods form a T × N matrix. Its rows are cut into S blocks
of equal length (S even; the first T mod S rows are dropped so that the blocks are even, the latest data kept).
Each of the C(S, S/2) ways to choose S/2 blocks is one split: the chosen blocks, in order, are the in-sample
half, the other blocks the out-of-sample half. In each split:

- the in-sample best is the variant with the highest Sharpe ratio mean / std(ddof=1) on the in-sample half
  (ties: the first of them);
- its out-of-sample rank r counts the variants it beats out of sample, 1 (worst) to N (best), ties sharing
  their average rank;
- ω = r / (N + 1) is its relative rank and λ = ln(ω / (1 - ω)) its logit: λ > 0 when it lands above the
  out-of-sample median.

PBO is the share of splits with λ ≤ 0. Variants that cannot be told apart (identical returns) land exactly on
the median in every split (λ = 0), so PBO = 1: selecting among them says nothing. A variant whose returns do
not vary within a half has Sharpe ratio +inf, -inf or 0 by the sign of its mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

DEFAULT_BLOCKS = 16
"""S, the blocks the periods are cut into (the paper's choice: C(16, 8) = 12,870 splits)."""


@dataclass(frozen=True)
class Overfitting:
    """The PBO of N variants and what it was computed from."""

    probability: float
    """PBO: the share of splits whose in-sample best ranks at or below the out-of-sample median."""
    logits: np.ndarray
    """λ of each split, (C(S, S/2),), splits in the order of `itertools.combinations(range(S), S/2)`."""
    blocks: int
    trials: int
    periods: int
    """The rows used: T less the T mod S dropped from the start."""


def backtest_overfitting(returns: np.ndarray, *, blocks: int = DEFAULT_BLOCKS) -> Overfitting:
    """PBO of the variants whose per-period returns are the columns of `returns` (T, N), by CSCV over
    `blocks` blocks (see the module docstring). ValueError when the shape does not allow it."""
    matrix = np.asarray(returns, dtype=float)
    if matrix.ndim != 2 or matrix.shape[1] < 2:
        raise ValueError("need a (periods, trials) matrix of at least 2 trials")
    if blocks < 2 or blocks % 2:
        raise ValueError(f"the blocks must be an even number, 2 or more (got {blocks})")
    length = matrix.shape[0] // blocks
    if length * blocks // 2 < 2:
        raise ValueError(
            f"{matrix.shape[0]} periods in {blocks} blocks leave fewer than 2 periods a half: use fewer blocks"
        )
    if not np.all(np.isfinite(matrix)):
        raise ValueError("the returns must be finite numbers")
    used = matrix[matrix.shape[0] - length * blocks:]  # (S L, N): the first T mod S rows dropped
    centred = used - used.mean(axis=0)  # variances from sums of centred values lose less to rounding
    sums = centred.reshape(blocks, length, -1).sum(axis=1)  # (S, N)
    squares = (centred**2).reshape(blocks, length, -1).sum(axis=1)  # (S, N)
    chosen = np.zeros((math.comb(blocks, blocks // 2), blocks))  # (C, S): 1 for the in-sample blocks
    for split, members in enumerate(combinations(range(blocks), blocks // 2)):
        chosen[split, list(members)] = 1.0
    inside = _sharpe(chosen @ sums, chosen @ squares, length * blocks // 2, used.mean(axis=0))  # (C, N)
    outside = _sharpe((1 - chosen) @ sums, (1 - chosen) @ squares, length * blocks // 2, used.mean(axis=0))
    best = np.argmax(inside, axis=1)  # (C,)
    picked = outside[np.arange(len(best)), best][:, None]  # (C, 1)
    rank = (outside < picked).sum(axis=1) + ((outside == picked).sum(axis=1) + 1) / 2  # (C,), 1 to N
    trials = matrix.shape[1]
    omega = rank / (trials + 1)
    logits = np.log(omega / (1 - omega))
    return Overfitting(float(np.mean(logits <= 0)), logits, blocks, trials, len(used))


def _sharpe(sums: np.ndarray, squares: np.ndarray, count: int, offset: np.ndarray) -> np.ndarray:
    """mean / std(ddof=1) from the sums and sums of squares of `count` centred values (`offset`: the mean
    taken off); ±inf or 0 where the values do not vary."""
    mean = sums / count
    variance = np.maximum((squares - count * mean**2) / (count - 1), 0.0)
    mean = mean + offset
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = mean / np.sqrt(variance)
    flat = np.where(mean > 0, np.inf, np.where(mean < 0, -np.inf, 0.0))
    return np.where(variance > 0, ratio, flat)
