"""`vol_forecast`: the volatility mandate's size from a forecast fitted on the train split, to show what the
volatility that `get_volatility` reports is worth to a sizer.

The forecast is a log-linear HAR model (Corsi 2009) on the two realised volatilities the tool shows, over
`short` bars and over `long` bars, both ending at the decision bar:

    log σ_next = a + b · log σ_short + c · log σ_long + ε,   ε ~ N(0, s²),

with σ_next the realised volatility over the interval the decision is held for, the quantity the mandate
scores. It is fitted by least squares on the train split's decisions (`fit_vol_forecast`), never on the bars it
is tested on.

Under the mandate's squared relative miss, the size to hold is not σ* / σ̂: with σ uncertain, the expected miss
E[((w σ − σ*) / σ*)²] = (w² E[σ²] − 2 w σ* E[σ] + σ*²) / σ*² is lowest at w = σ* E[σ] / E[σ²], which shrinks
the size the more uncertain the forecast is. `forecast_sizes` takes the size of the mandate's set with the
lowest expected miss under the fitted log-normal: E[σ] = exp(μ + s² / 2), E[σ²] = exp(2 μ + 2 s²).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from r1trade.backtest.mandate import split_decisions
from r1trade.backtest.metrics import infer_bars_per_year


class VolForecast(NamedTuple):
    """A fitted forecast: log σ_next = intercept + short_coef · log σ_short + long_coef · log σ_long, with
    residual variance `residual_var` (σ annualised); `r_squared` and `decisions` describe the fit."""

    intercept: float
    short_coef: float
    long_coef: float
    residual_var: float
    r_squared: float
    decisions: int


def trailing_volatility(candles: pd.DataFrame, bars: int) -> np.ndarray:
    """(n,) the annualised standard deviation (ddof 1) of the `bars` log close-to-close returns ending at each
    bar, as `get_volatility` reports it; NaN until `bars` returns exist."""
    returns = np.log(candles["close"].astype(float)).diff()
    sigma = returns.rolling(bars, min_periods=bars).std() * np.sqrt(infer_bars_per_year(candles.index))
    return sigma.to_numpy(dtype=float)


def fit_vol_forecast(candles: pd.DataFrame, *, every: int, first: int, short: int, long: int) -> VolForecast:
    """Least squares of the log realised volatility over the `every` bars after each decision (bars first,
    first + every, ... with a whole interval after them) on the log trailing volatilities over `short` and
    `long` bars; decisions with an undefined or zero volatility are left out. ValueError below four usable
    decisions.
    """
    decisions, realised = split_decisions(candles, every=every, first=first)  # (D,), (D,) annualised
    columns = [trailing_volatility(candles, short)[decisions], trailing_volatility(candles, long)[decisions]]
    rows = np.column_stack([realised, *columns])  # (D, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(rows)
    usable = logs[np.isfinite(logs).all(axis=1)]
    if len(usable) < 4:
        raise ValueError(f"{len(usable)} decisions with a defined, non-zero volatility: need at least 4")
    design = np.column_stack([np.ones(len(usable)), usable[:, 1:]])  # (D', 3)
    coefficients, *_ = np.linalg.lstsq(design, usable[:, 0], rcond=None)
    residuals = usable[:, 0] - design @ coefficients
    spread = float(((usable[:, 0] - usable[:, 0].mean()) ** 2).sum())
    r_squared = 1.0 - float((residuals**2).sum()) / spread if spread > 0 else 1.0
    residual_var = float((residuals**2).sum()) / max(len(usable) - 3, 1)
    intercept, short_coef, long_coef = (float(value) for value in coefficients)
    return VolForecast(intercept, short_coef, long_coef, residual_var, r_squared, len(usable))


def forecast_sizes(mean_log: np.ndarray, residual_var: float, *, target: float, sizes: Sequence[float]) -> np.ndarray:
    """The size of `sizes` with the lowest expected mandate miss when log σ ~ N(mean_log, residual_var); the
    smaller size on a tie, NaN where mean_log is NaN.

    A forecast of exactly σ* with no uncertainty holds 1; with log-variance 0.25, E[σ] = σ* e^0.125 and
    E[σ²] = σ*² e^0.5, so w* = e^-0.375 = 0.69, nearest in expected miss 0.75 (0.5 would miss more):

    >>> forecast_sizes(np.log([0.4, 0.4, np.nan]), 0.0, target=0.4, sizes=[0, 0.5, 1, 1.5]).tolist()
    [1.0, 1.0, nan]
    >>> forecast_sizes(np.log([0.4]), 0.25, target=0.4, sizes=[0, 0.25, 0.5, 0.75, 1]).tolist()
    [0.75]
    """
    levels = np.sort(np.asarray(sizes, dtype=float))
    mean_log = np.asarray(mean_log, dtype=float)
    first_moment = np.exp(mean_log + residual_var / 2)[:, None]  # (n, 1) E[σ]
    second_moment = np.exp(2 * mean_log + 2 * residual_var)[:, None]  # (n, 1) E[σ²]
    expected_miss = (levels**2 * second_moment - 2 * levels * target * first_moment) / target**2 + 1  # (n, S)
    chosen = levels[np.nan_to_num(expected_miss, nan=0.0).argmin(axis=1)]
    return np.where(np.isnan(mean_log), np.nan, chosen)


def vol_forecast(
    candles: pd.DataFrame,
    *,
    intercept: float,
    short_coef: float,
    long_coef: float,
    residual_var: float,
    target: float,
    sizes: Sequence[float],
    short: int = 24,
    long: int = 168,
) -> pd.Series:
    """At every bar, the size with the lowest expected mandate miss under the fitted forecast from the trailing
    volatilities ending there (`forecast_sizes`); flat until `long` returns exist."""
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0 = -inf, and 0 × -inf for an unused window
        mean_log = (intercept + short_coef * np.log(trailing_volatility(candles, short))
                    + long_coef * np.log(trailing_volatility(candles, long)))
    mean_log = np.where(np.isfinite(mean_log), mean_log, np.nan)  # a zero volatility: no forecast, flat
    sized = forecast_sizes(mean_log, residual_var, target=target, sizes=sizes)
    return pd.Series(np.nan_to_num(sized, nan=0.0), index=candles.index, name="target")
