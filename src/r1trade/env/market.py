"""Market replay: one split's candles with indicator and sentiment features, computed once, shared by envs.

Every feature at bar t is computed from bars 0..t only (trailing windows and recursive averages), so an
environment that shows bar t's features never shows the future. Features are stored in display units (percent
of price, distance from a moving average in percent) and pre-formatted once, so rendering a prompt is a
lookup.

Indicator names: `rsi_N`, `macd_hist` (12/26/9), `bb_pctb` or `bb_pctb_N` (N bars, 2σ), `atr_N`, `sma_N`,
`ema_N`, `volume_z` or `volume_z_N` (z-score of volume over N bars), `roc_N` (N-bar return), `adx_N`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import ta

from r1trade.data.store import COLUMNS, timeframe_to_timedelta
from r1trade.data.synthetic import DecisionGrid, decision_grid
from r1trade.env.sentiment import PROXY_SOURCE, align_sentiment, market_sentiment_proxy
from r1trade.errors import ConfigError, DataError

_NAME = re.compile(r"^(rsi|atr|sma|ema|roc|adx|bb_pctb|volume_z|macd_hist)(?:_(\d+))?$")
_DEFAULT_WINDOW = {"rsi": 14, "atr": 14, "roc": 10, "adx": 14, "bb_pctb": 20, "volume_z": 20}


@dataclass(frozen=True)
class IndicatorSpec:
    """A parsed indicator name: what it is, its window, how it is labelled and formatted."""

    name: str
    kind: str
    window: int
    label: str
    unit: str  # "" for a plain value, "%" for percent
    signed: bool
    decimals: int


def parse_indicator(name: str) -> IndicatorSpec:
    """`'rsi_14'` → RSI over 14 bars; raises ConfigError naming the accepted forms for anything else."""
    match = _NAME.match(name)
    window = int(match.group(2)) if match and match.group(2) else None
    kind = match.group(1) if match else ""
    if not match or (kind == "macd_hist" and window is not None) or window == 0:
        raise ConfigError(
            f"unknown indicator '{name}': use rsi_N, macd_hist, bb_pctb[_N], atr_N, sma_N, ema_N, "
            "volume_z[_N], roc_N or adx_N"
        )
    if window is None:
        if kind in ("sma", "ema"):
            raise ConfigError(f"indicator '{name}' needs a window, e.g. {kind}_20")
        window = _DEFAULT_WINDOW.get(kind, 26)
    labels = {
        "rsi": (f"RSI{window}", "", False, 1),
        "atr": (f"ATR{window}", "%", False, 2),
        "sma": (f"SMA{window}", "%", True, 2),
        "ema": (f"EMA{window}", "%", True, 2),
        "roc": (f"ROC{window}", "%", True, 2),
        "adx": (f"ADX{window}", "", False, 1),
        "bb_pctb": ("BB%B" if window == 20 else f"BB%B{window}", "", False, 2),
        "volume_z": ("VolZ" if window == 20 else f"VolZ{window}", "", True, 2),
        "macd_hist": ("MACDh", "%", True, 3),
    }
    label, unit, signed, decimals = labels[kind]
    return IndicatorSpec(name, kind, window, label, unit, signed, decimals)


def _compute(spec: IndicatorSpec, candles: pd.DataFrame) -> pd.Series:
    """The indicator in display units; every value uses bars up to its own only."""
    close, high, low, volume = candles["close"], candles["high"], candles["low"], candles["volume"]
    w = spec.window
    compute: dict[str, Callable[[], pd.Series]] = {
        "rsi": lambda: ta.momentum.RSIIndicator(close, w).rsi(),
        "atr": lambda: ta.volatility.AverageTrueRange(high, low, close, w).average_true_range() / close * 100,
        "sma": lambda: (close / close.rolling(w, min_periods=w).mean() - 1) * 100,
        "ema": lambda: (close / close.ewm(span=w, adjust=False, min_periods=w).mean() - 1) * 100,
        "roc": lambda: (close / close.shift(w) - 1) * 100,
        "adx": lambda: ta.trend.ADXIndicator(high, low, close, w).adx(),
        "bb_pctb": lambda: ta.volatility.BollingerBands(close, w, 2).bollinger_pband(),
        "volume_z": lambda: (volume - volume.rolling(w, min_periods=w).mean())
        / volume.rolling(w, min_periods=w).std(),
        "macd_hist": lambda: ta.trend.MACD(close, 26, 12, 9).macd_diff() / close * 100,
    }
    with np.errstate(all="ignore"):
        return compute[spec.kind]().replace([np.inf, -np.inf], np.nan)


def _format(spec: IndicatorSpec, values: np.ndarray) -> list[str]:
    """`'RSI14 56.1'`, `'SMA20 +1.20%'` or `'RSI14 n/a'` for every bar."""
    pattern = f"{spec.label} {{:{'+' if spec.signed else ''}.{spec.decimals}f}}{spec.unit}"
    missing = f"{spec.label} n/a"
    return [missing if math.isnan(v) else pattern.format(v) for v in values.tolist()]


def format_price(price: float, significant: int = 6) -> str:
    """`significant` digits without exponent: 11234.5, 0.123457; 'n/a' for NaN."""
    if not math.isfinite(price):
        return "n/a"
    digits = math.floor(math.log10(abs(price))) if price else 0
    return f"{price:.{min(max(significant - 1 - digits, 0), 8)}f}"


def format_amount(amount: float) -> str:
    """A volume or unit count, short: 1234, 12, 1.5, 0.0446."""
    size = abs(amount)
    if size >= 10:
        return f"{amount:.0f}"
    return f"{amount:.1f}" if size >= 1 else f"{amount:.3g}"


@dataclass(frozen=True, eq=False)
class MarketReplay:
    """Read-only market data of one split, built once by `MarketReplay.build` and shared by every env.

    Bar t's timestamp is its open time; decisions happen at its close (`decision_labels[t]`). Lists are plain
    Python floats and strings because envs read single elements per step.
    """

    symbol: str
    timeframe: str
    index: pd.DatetimeIndex
    open: list[float]
    high: list[float]
    low: list[float]
    close: list[float]
    volume: list[float]
    volatility: list[float]
    indicators: dict[str, IndicatorSpec]
    feature_values: dict[str, list[float]]
    feature_text: dict[str, list[str]]
    sentiment: list[float]
    sentiment_source: str
    bar_labels: list[str]
    decision_labels: list[str]
    candle_lines: list[str]
    text_cache: dict[tuple, str] = field(default_factory=dict, repr=False)
    """Rendered market text per (bar, layout), filled lazily by the prompt renderer, shared by every env."""
    decision_grid: DecisionGrid | None = None
    """For generated data with a planted edge: the bars where its intervals end (episodes start there)."""

    def __len__(self) -> int:
        return len(self.close)

    @classmethod
    def build(
        cls,
        candles: pd.DataFrame,
        *,
        indicators: list[str],
        volatility_bars: int = 24,
        sentiment: pd.Series | None = None,
    ) -> MarketReplay:
        """Compute every feature of `candles` once (seconds at most, for ATR/ADX on large data)."""
        if len(candles) < 2:
            raise DataError(f"the market replay needs at least 2 bars, got {len(candles)}")
        specs = {name: parse_indicator(name) for name in dict.fromkeys(indicators)}
        timeframe = candles.attrs.get("timeframe") or "1h"
        index = pd.DatetimeIndex(candles.index)
        decision_times = index + timeframe_to_timedelta(timeframe)
        values = {name: _compute(spec, candles).to_numpy(dtype=float) for name, spec in specs.items()}
        log_ret = np.log(candles["close"]).diff()
        volatility = log_ret.rolling(volatility_bars, min_periods=2).std().fillna(0.0).to_numpy(dtype=float)
        if sentiment is None:
            mood, source = market_sentiment_proxy(candles), PROXY_SOURCE
        else:
            mood = align_sentiment(sentiment, decision_times)
            source = sentiment.attrs.get("source", "sentiment data")
        columns = [candles[c].to_numpy(dtype=float).tolist() for c in COLUMNS]
        bar_labels = index.strftime("%Y-%m-%d %H:%M").tolist()
        short_labels = index.strftime("%m-%d %H:%M").tolist()
        return cls(
            symbol=str(candles.attrs.get("symbol") or "UNKNOWN"),
            timeframe=timeframe,
            index=index,
            open=columns[0],
            high=columns[1],
            low=columns[2],
            close=columns[3],
            volume=columns[4],
            volatility=volatility.tolist(),
            indicators=specs,
            feature_values={name: v.tolist() for name, v in values.items()},
            feature_text={name: _format(specs[name], v) for name, v in values.items()},
            sentiment=mood.tolist(),
            sentiment_source=source,
            bar_labels=bar_labels,
            decision_labels=decision_times.strftime("%Y-%m-%d %H:%M UTC").tolist(),
            candle_lines=[
                " ".join([label, *(format_price(p, 5) for p in (o, h, lo, c)), format_amount(v)])
                for label, o, h, lo, c, v in zip(short_labels, *columns, strict=True)
            ],
            decision_grid=decision_grid(candles),
        )

    def change_pct(self, bar: int, bars: int) -> float:
        """Close-to-close change over the `bars` bars ending at `bar`, in percent (NaN without history)."""
        if bar - bars < 0:
            return math.nan
        return (self.close[bar] / self.close[bar - bars] - 1.0) * 100.0

    def forward_return(self, bar: int, horizon: int) -> float | None:
        """close[bar + horizon] / close[bar] − 1, or None past the data. For rewards only, never prompts."""
        if bar + horizon >= len(self.close):
            return None
        return self.close[bar + horizon] / self.close[bar] - 1.0


def changes_text(replay: MarketReplay, bar: int, decision_every: int) -> str:
    """`Change: 1 bar +0.12% | 4 bars -1.03% | 24 bars +2.50%`: over one bar, one decision interval and six."""
    spans = sorted({1, decision_every, 6 * decision_every})
    return "Change: " + " | ".join(
        f"{n} bar{'s' if n > 1 else ''} {signed_pct(replay.change_pct(bar, n))}" for n in spans
    )


def signed_pct(value: float) -> str:
    """`+1.23%`, or `n/a` for a change without history."""
    return "n/a" if math.isnan(value) else f"{value:+.2f}%"
