"""Realised volatility and average true range at a decision bar, from that bar and the bars before it only.

What `get_volatility` shows, so that an agent can size a position from risk: a position of size s has about s
times the market's volatility, so a volatility target T suggests s = T / realised volatility. Crypto trades
every day, so volatility is annualised over a 365-day year of the bar length (8,760 hourly bars).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from r1trade.data.store import timeframe_to_timedelta
from r1trade.env.market import MarketReplay

SECONDS_PER_YEAR = 365 * 24 * 3600
ATR_BARS = 14
LONG_FACTOR = 7
"""The longer volatility window, in multiples of the shorter one (24 hourly bars: a day against a week)."""


def bars_per_year(timeframe: str) -> float:
    """Bars in a 365-day year: `1h` → 8760, `4h` → 2190, `1d` → 365.

    >>> bars_per_year("1h"), bars_per_year("1d")
    (8760.0, 365.0)
    """
    return SECONDS_PER_YEAR / timeframe_to_timedelta(timeframe).total_seconds()


def realised_volatility(close: Sequence[float], bar: int, bars: int) -> float:
    """Standard deviation (ddof 1) of the last `bars` log-returns ending at `bar` (fewer at the data's start),
    per bar; NaN below two returns.

    >>> round(realised_volatility([100.0, 101.0, 100.0, 101.0], 3, 3), 6)  # |log-returns| 0.00995, signs +-+
    0.01149
    """
    first = max(bar - bars, 0)
    returns = [math.log(close[i] / close[i - 1]) for i in range(first + 1, bar + 1)]
    if len(returns) < 2:
        return math.nan
    mean = sum(returns) / len(returns)
    return math.sqrt(sum((r - mean) ** 2 for r in returns) / (len(returns) - 1))


def interval_volatility(close: np.ndarray, decision_bars: np.ndarray, bars: int) -> np.ndarray:
    """Per-bar volatility over the interval after each decision bar d: `realised_volatility(close, d + bars,
    bars)` for every d at once, the std (ddof 1) of the log-returns of bars d + 1 .. d + bars. (D,) from (D,).

    What the volatility mandate scores a decision on: the bars its position is held over, none of which it
    saw.

    >>> closes = np.array([100.0, 101.0, 100.0, 101.0, 101.0])  # log-returns a, -a, a, 0 (a = 0.00995)
    >>> interval_volatility(closes, np.array([0, 1]), 3).round(5)  # a, -a, a: a·sqrt(4/3); -a, a, 0: a
    array([0.01149, 0.00995])
    """
    log_returns = np.diff(np.log(np.asarray(close, dtype=float)))  # (n - 1,): entry j is bar j + 1's
    if bars < 2 or len(log_returns) < bars:
        raise ValueError(f"need at least 2 bars in an interval and {bars} returns in the data")
    windows = sliding_window_view(log_returns, bars)  # (n - bars, bars): row d holds bars d + 1 .. d + bars
    return windows[np.asarray(decision_bars, dtype=np.int64)].std(axis=1, ddof=1)


def mean_true_range_pct(
    high: Sequence[float], low: Sequence[float], close: Sequence[float], bar: int, bars: int = ATR_BARS
) -> float:
    """Mean true range of the last `bars` bars ending at `bar` (fewer at the data's start), in % of bar's
    close; a bar's true range is max(high - low, |high - previous close|, |low - previous close|). NaN at
    bar 0.

    >>> mean_true_range_pct([10.0, 11.0, 10.5], [9.0, 10.0, 9.5], [10.0, 10.5, 10.0], 2, 2)
    10.0
    """
    ranges = [
        max(high[i] - low[i], abs(high[i] - close[i - 1]), abs(low[i] - close[i - 1]))
        for i in range(max(bar - bars, 0) + 1, bar + 1)
    ]
    return 100.0 * sum(ranges) / len(ranges) / close[bar] if ranges else math.nan


def volatility_text(replay: MarketReplay, bar: int, bars: int) -> str:
    """`Volatility, annualised over 365 days: 24 bars 45.2% | 168 bars 60.1%. Mean true range, 14 bars: 0.85%
    of price.` The window lengths are those used (shorter at the start of the data)."""
    yearly = math.sqrt(bars_per_year(replay.timeframe))
    parts = []
    for window in (bars, LONG_FACTOR * bars):
        used = min(window, bar)
        value = realised_volatility(replay.close, bar, window) * yearly * 100.0
        parts.append(f"{used} bars {'n/a' if math.isnan(value) else f'{value:.1f}%'}")
    atr = mean_true_range_pct(replay.high, replay.low, replay.close, bar)
    atr_text = "n/a" if math.isnan(atr) else f"{atr:.2f}% of price"
    return (
        f"Volatility, annualised over 365 days: {' | '.join(parts)}. Mean true range, {min(ATR_BARS, bar)} "
        f"bars: {atr_text}."
    )
