"""The deflated Sharpe ratio (Bailey & López de Prado 2014): is a Sharpe ratio still significant once the
number of variants tried on the same data, and the returns' skewness and fat tails, are accounted for?

The best of N skill-less variants has a positive Sharpe ratio by luck alone. Its expected value is

    SR0 = sqrt(V) ((1 - γ) Φ⁻¹(1 - 1/N) + γ Φ⁻¹(1 - 1/(N e)))      (γ: the Euler–Mascheroni constant)

where V is the variance of the variants' Sharpe estimates. Here V = 1 / (T - 1), the variance of a Sharpe
estimate over T returns when the true Sharpe ratio is 0 (every variant without skill). The deflated Sharpe
ratio is the probability that the true Sharpe ratio exceeds SR0:

    DSR = Φ((SR - SR0) sqrt(T - 1) / sqrt(1 - γ3 SR + (γ4 - 1) / 4 SR²))

with SR the per-period (not annualised) Sharpe ratio mean / std(ddof=1), γ3 the skewness and γ4 the kurtosis
(3 for normal returns) of the T returns, both from population moments. A DSR above 0.95 says the Sharpe ratio
is significant at 95 % after N trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

EULER_GAMMA = 0.5772156649015329
_NORMAL = NormalDist()


@dataclass(frozen=True)
class DeflatedSharpe:
    """The deflated Sharpe ratio of one return series and what it was computed from."""

    probability: float
    """DSR: the probability that the true Sharpe ratio exceeds `expected_max` (NaN if undefined)."""
    sharpe: float
    """Per-period Sharpe ratio of the returns."""
    expected_max: float
    """SR0, the expected maximum per-period Sharpe ratio of `trials` skill-less variants."""
    trials: int
    observations: int
    skewness: float
    kurtosis: float


def expected_max_sharpe(trials: int, variance: float) -> float:
    """SR0: the expected largest of `trials` Sharpe estimates of variance `variance` whose true value is 0."""
    if trials < 2:
        raise ValueError("the expected maximum needs at least 2 trials")
    inverse = _NORMAL.inv_cdf
    quantiles = inverse(1.0 - 1.0 / trials), inverse(1.0 - 1.0 / (trials * math.e))
    return math.sqrt(variance) * ((1.0 - EULER_GAMMA) * quantiles[0] + EULER_GAMMA * quantiles[1])


def deflated_sharpe(returns: np.ndarray, *, trials: int) -> DeflatedSharpe:
    """The deflated Sharpe ratio of per-period `returns`, the best of `trials` variants (module formulas)."""
    values = np.asarray(returns, dtype=float)
    count = len(values)
    deviations = values - values.mean() if count else values
    m2 = float(np.mean(deviations**2)) if count else 0.0
    if count < 3 or m2 == 0.0:
        return DeflatedSharpe(math.nan, math.nan, math.nan, trials, count, math.nan, math.nan)
    skewness = float(np.mean(deviations**3)) / m2**1.5
    kurtosis = float(np.mean(deviations**4)) / m2**2
    sharpe = float(values.mean() / values.std(ddof=1))
    benchmark = expected_max_sharpe(trials, 1.0 / (count - 1))
    spread = 1.0 - skewness * sharpe + (kurtosis - 1.0) / 4.0 * sharpe**2
    probability = math.nan
    if spread > 0:
        probability = _NORMAL.cdf((sharpe - benchmark) * math.sqrt(count - 1) / math.sqrt(spread))
    return DeflatedSharpe(probability, sharpe, benchmark, trials, count, skewness, kurtosis)
