"""Is a Sharpe ratio significant? The probabilistic Sharpe ratio and minimum track record length (Bailey &
López de Prado 2012), and the deflated Sharpe ratio (Bailey & López de Prado 2014), which also counts the
variants tried on the same data.

Every figure here is per period (a decision, in the reports), not annualised: SR = mean / std(ddof=1) of the T
returns, γ3 their skewness and γ4 their kurtosis (raw: 3 for normal returns), both from population moments.
A Sharpe estimate's standard error grows with skewness against it and with fat tails:

    PSR(SR*) = Φ((SR - SR*) sqrt(T - 1) / sqrt(1 - γ3 SR + (γ4 - 1) / 4 SR²))

is the probability that the true Sharpe ratio exceeds SR*, and

    MinTRL = 1 + (1 - γ3 SR + (γ4 - 1) / 4 SR²) (z_α / (SR - SR*))²

the number of returns needed before PSR(SR*) reaches the confidence 1 - α (z_α = Φ⁻¹(1 - α)); infinite when
SR does not exceed SR*.

The best of N skill-less variants has a positive Sharpe ratio by luck alone. Its expected value is

    SR0 = sqrt(V) ((1 - γ) Φ⁻¹(1 - 1/N) + γ Φ⁻¹(1 - 1/(N e)))      (γ: the Euler–Mascheroni constant)

where V is the variance of the variants' Sharpe estimates; by default V = 1 / (T - 1), the variance of a Sharpe
estimate over T returns when the true Sharpe ratio is 0 (every variant without skill). The deflated Sharpe
ratio is PSR(SR0). A PSR or DSR above 0.95 says the Sharpe ratio is significant at 95 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

EULER_GAMMA = 0.5772156649015329
_NORMAL = NormalDist()


@dataclass(frozen=True)
class SharpeMoments:
    """A return series' per-period Sharpe ratio and the moments its standard error depends on (NaN when
    undefined: fewer than 3 returns, or returns that do not vary)."""

    sharpe: float
    observations: int
    skewness: float
    kurtosis: float


@dataclass(frozen=True)
class ProbabilisticSharpe:
    """PSR(benchmark) of one return series: the probability that its true per-period Sharpe ratio exceeds
    `benchmark` (NaN if undefined)."""

    probability: float
    benchmark: float
    sharpe: float
    observations: int
    skewness: float
    kurtosis: float


@dataclass(frozen=True)
class MinTrackRecord:
    """The returns needed before PSR(benchmark) reaches `confidence`, and the years they span."""

    periods: float
    """MinTRL in returns (here decisions); inf when the Sharpe ratio does not exceed the benchmark, NaN if
    undefined."""
    years: float
    benchmark: float
    confidence: float
    observed: int
    """The returns the series has: the record is long enough when `observed` >= `periods`."""


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
    trials_source: str = ""
    """Where the number of trials comes from (e.g. the ladder's records of the same market)."""


def sharpe_moments(returns: np.ndarray) -> SharpeMoments:
    """Per-period Sharpe ratio (ddof=1), skewness and raw kurtosis (population moments) of `returns`."""
    values = np.asarray(returns, dtype=float)
    count = len(values)
    deviations = values - values.mean() if count else values
    m2 = float(np.mean(deviations**2)) if count else 0.0
    if count < 3 or m2 == 0.0:
        return SharpeMoments(math.nan, count, math.nan, math.nan)
    skewness = float(np.mean(deviations**3)) / m2**1.5
    kurtosis = float(np.mean(deviations**4)) / m2**2
    return SharpeMoments(float(values.mean() / values.std(ddof=1)), count, skewness, kurtosis)


def sharpe_spread(sharpe: float, skewness: float, kurtosis: float) -> float:
    """1 - γ3 SR + (γ4 - 1) / 4 SR²: (T - 1) times the variance of a Sharpe estimate over T returns."""
    return 1.0 - skewness * sharpe + (kurtosis - 1.0) / 4.0 * sharpe**2


def probabilistic_sharpe_ratio(
    sharpe: float, *, observations: int, skewness: float, kurtosis: float, benchmark: float = 0.0
) -> float:
    """PSR(benchmark) = Φ((SR - SR*) sqrt(T - 1) / sqrt(spread)); NaN if undefined (module formulas)."""
    spread = sharpe_spread(sharpe, skewness, kurtosis)
    if observations < 2 or not spread > 0:
        return math.nan
    return _NORMAL.cdf((sharpe - benchmark) * math.sqrt(observations - 1) / math.sqrt(spread))


def min_track_record_length(
    sharpe: float, *, skewness: float, kurtosis: float, benchmark: float = 0.0, confidence: float = 0.95
) -> float:
    """MinTRL = 1 + spread (z / (SR - SR*))², z = Φ⁻¹(confidence), in returns; inf when SR <= SR*."""
    spread = sharpe_spread(sharpe, skewness, kurtosis)
    if not spread > 0:
        return math.nan
    if sharpe <= benchmark:
        return math.inf
    return 1.0 + spread * (_NORMAL.inv_cdf(confidence) / (sharpe - benchmark)) ** 2


def probabilistic_sharpe(returns: np.ndarray, *, benchmark: float = 0.0) -> ProbabilisticSharpe:
    """PSR(benchmark) of per-period `returns`."""
    moments = sharpe_moments(returns)
    probability = probabilistic_sharpe_ratio(
        moments.sharpe, observations=moments.observations, skewness=moments.skewness,
        kurtosis=moments.kurtosis, benchmark=benchmark,
    )
    return ProbabilisticSharpe(probability, benchmark, *_fields(moments))


def min_track_record(
    returns: np.ndarray, *, period_years: float, benchmark: float = 0.0, confidence: float = 0.95
) -> MinTrackRecord:
    """MinTRL of per-period `returns`, also in years (`period_years`: the years one period spans)."""
    moments = sharpe_moments(returns)
    periods = min_track_record_length(
        moments.sharpe, skewness=moments.skewness, kurtosis=moments.kurtosis, benchmark=benchmark,
        confidence=confidence,
    )
    return MinTrackRecord(periods, periods * period_years, benchmark, confidence, moments.observations)


def expected_max_sharpe(trials: int, variance: float) -> float:
    """SR0: the expected largest of `trials` Sharpe estimates of variance `variance` whose true value is 0."""
    if trials < 2:
        raise ValueError("the expected maximum needs at least 2 trials")
    inverse = _NORMAL.inv_cdf
    quantiles = inverse(1.0 - 1.0 / trials), inverse(1.0 - 1.0 / (trials * math.e))
    return math.sqrt(variance) * ((1.0 - EULER_GAMMA) * quantiles[0] + EULER_GAMMA * quantiles[1])


def deflated_sharpe(
    returns: np.ndarray, *, trials: int, variance: float | None = None, trials_source: str = ""
) -> DeflatedSharpe:
    """The deflated Sharpe ratio of per-period `returns`, the best of `trials` variants whose Sharpe
    estimates have variance `variance` (default 1 / (T - 1)); see the module formulas."""
    moments = sharpe_moments(returns)
    if math.isnan(moments.sharpe):
        return DeflatedSharpe(math.nan, math.nan, math.nan, trials, *_fields(moments)[1:], trials_source)
    count = moments.observations
    benchmark = expected_max_sharpe(trials, 1.0 / (count - 1) if variance is None else variance)
    probability = probabilistic_sharpe_ratio(
        moments.sharpe, observations=count, skewness=moments.skewness, kurtosis=moments.kurtosis,
        benchmark=benchmark,
    )
    return DeflatedSharpe(probability, moments.sharpe, benchmark, trials, *_fields(moments)[1:], trials_source)


def _fields(moments: SharpeMoments) -> tuple[float, int, float, float]:
    return moments.sharpe, moments.observations, moments.skewness, moments.kurtosis
