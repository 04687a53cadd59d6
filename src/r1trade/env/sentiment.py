"""Market sentiment on a 0–100 fear/greed scale: an imported series (e.g. Fear & Greed) or a market proxy.

The proxy copies the idea of the public fear/greed indices from price and volume alone, each part computed
from past bars only:
- momentum: the 24-bar log-return in units of its expected spread (σ₂₄ × √24), greed when prices run up;
- volatility: log(σ₁₆₈ / σ₂₄), fear when recent volatility is above its weekly norm (σ = std of 1-bar
  log-returns);
- volume: the z-score of the last 24 bars' mean log-volume against 168 bars, signed by the 24-bar return,
  since heavy volume in a rally reads as greed and in a sell-off as fear.
Index = 50 + 50 × tanh((0.5 × momentum + 0.3 × volatility + 0.2 × volume) / 1.5). Windows are in bars.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from r1trade.errors import DataError, UsageError

PROXY_SOURCE = "market proxy (momentum, volatility, volume)"
_SHORT, _LONG = 24, 168
_BANDS = ((24, "Extreme Fear"), (46, "Fear"), (54, "Neutral"), (75, "Greed"), (100, "Extreme Greed"))
_TIME_COLUMNS = ("timestamp", "date", "time", "datetime")
_VALUE_COLUMNS = ("value", "fng_value", "sentiment", "score", "fear_greed")


def sentiment_label(value: float) -> str:
    """The usual fear/greed band of a 0–100 value: 20 → Extreme Fear, 50 → Neutral, 80 → Extreme Greed."""
    return next(label for upper, label in _BANDS if value <= upper)


def market_sentiment_proxy(candles: pd.DataFrame) -> np.ndarray:
    """The proxy index (see the module docstring) for every bar; NaN until 24 bars of history exist."""
    close = candles["close"]
    log_ret = np.log(close).diff()
    vol_short = log_ret.rolling(_SHORT, min_periods=_SHORT).std()
    vol_long = log_ret.rolling(_LONG, min_periods=_SHORT).std()
    move = np.log(close / close.shift(_SHORT))
    momentum = move / (vol_short * np.sqrt(_SHORT))
    volatility = np.log(vol_long / vol_short)
    log_volume = np.log(candles["volume"].clip(lower=1e-12))
    volume_z = (log_volume.rolling(_SHORT).mean() - log_volume.rolling(_LONG, min_periods=_SHORT).mean()) / (
        log_volume.rolling(_LONG, min_periods=_SHORT).std()
    )
    score = 0.5 * momentum + 0.3 * volatility + 0.2 * volume_z * np.sign(move)
    index = 50.0 + 50.0 * np.tanh(score.replace([np.inf, -np.inf], np.nan) / 1.5)
    return index.to_numpy(dtype=float)


def align_sentiment(series: pd.Series, decision_times: pd.DatetimeIndex) -> np.ndarray:
    """The latest value stamped at or before each decision time (NaN before the first); never a later one.

    Stamps are read as publication times: a daily index stamped 00:00 becomes visible at the first decision at
    or after midnight.
    """
    stamps = pd.DatetimeIndex(series.index).as_unit("ns").asi8
    values = series.to_numpy(dtype=float)
    position = np.searchsorted(stamps, decision_times.as_unit("ns").asi8, side="right") - 1
    return np.where(position >= 0, values[np.clip(position, 0, None)], np.nan)


def load_sentiment_csv(path: str | Path) -> pd.Series:
    """Read a sentiment history CSV (time column + 0–100 value column, e.g. an alternative.me Fear & Greed
    export).

    Time columns: timestamp, date, time or datetime (ISO dates or unix seconds/milliseconds). Value columns:
    value, fng_value, sentiment, score or fear_greed. Returns a sorted, UTC-indexed float series.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"sentiment file not found: '{path}'")
    frame = pd.read_csv(path)
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    time_col = next((c for c in _TIME_COLUMNS if c in frame.columns), None)
    value_col = next((c for c in _VALUE_COLUMNS if c in frame.columns), None)
    if time_col is None or value_col is None:
        raise DataError(
            f"'{path}': need a time column ({', '.join(_TIME_COLUMNS)}) and a value column "
            f"({', '.join(_VALUE_COLUMNS)}); found {', '.join(frame.columns)}"
        )
    raw_times = frame[time_col]
    if pd.api.types.is_numeric_dtype(raw_times):
        unit = "ms" if raw_times.abs().max() > 1e11 else "s"
        times = pd.to_datetime(raw_times, unit=unit, utc=True)
    else:
        times = pd.to_datetime(raw_times, utc=True, format="mixed", errors="coerce")
    values = pd.to_numeric(frame[value_col], errors="coerce")
    bad = times.isna() | values.isna() | (values < 0) | (values > 100)
    if bad.any():
        rows = (np.flatnonzero(bad.to_numpy())[:3] + 2).tolist()
        raise DataError(f"'{path}': unreadable time or value outside 0–100 on line(s) {rows}")
    index = pd.DatetimeIndex(times, name="timestamp")
    series = pd.Series(values.to_numpy(dtype=float), index=index, name="sentiment")
    series = series[~series.index.duplicated(keep="last")].sort_index()
    series.attrs["source"] = f"sentiment file {path.name}"
    return series
