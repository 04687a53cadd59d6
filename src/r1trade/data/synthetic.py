"""Synthetic candles with a planted, learnable edge: a market where the best policy is known.

A learning agent should first be tested where the answer is known. `planted_edge_candles` generates realistic
OHLCV bars in the canonical schema (see `r1trade.data.store`) and plants one causal rule in them:

    the sign of the last interval's close-to-close change repeats in the next interval with probability p,

an interval being `interval` bars (by default the env's `decision_every`). With p > 0.5 the market trends from
one interval to the next, with p < 0.5 it reverses, with p = 0.5 there is nothing to find.

How it is planted (exactly, not approximately):
- Intervals are blocks of `interval` bars on a fixed grid: an interval ends at the close of every bar whose
  close time is a whole multiple of `interval` bars since 1970-01-01 UTC (for hourly bars and interval 4: the
  closes at 00:00, 04:00, 08:00, ... UTC). The grid is a property of the timestamps, so it survives splits and
  slicing, and `decision_grid` recovers it from any piece of the data.
- Interval k's direction d_k is a two-state Markov chain: d_0 is +1 or -1 with probability 1/2, then d_k =
  d_{k-1} with probability p, else -d_{k-1}.
- Its net log-change is d_k × move × G_k with G_k ~ Gamma(4, 1/4) (mean 1), so its sign is d_k exactly.
- The bars inside an interval are a Gaussian random walk with GARCH(1,1) volatility (clustering), conditioned
  on ending at that net change (a Brownian bridge: each bar takes a share of the correction proportional to
  its variance), so the bars look like an ordinary random walk and the interval's sign is still exact.
- Each bar opens at the previous close; highs and lows add half-normal wicks scaled by the bar's volatility;
  volume is lognormal noise times (0.5 + |return| / volatility), so it rises with the size of the move.

Because the directions form a Markov chain and everything else is drawn independently of the future
directions, P(d_{k+1} = d_k | everything up to the end of interval k) = p: the "oracle" rule (follow the last
interval's sign when p > 0.5, fade it when p < 0.5) is the best any policy can do in expectation (before
trading costs), and it needs nothing but the last two interval-end closes.

What the agent sees: at a decision bar t the observation shows `Change: ... | <decision_every> bars ±x.xx%`,
which is close[t] / close[t - decision_every] - 1: exactly the last interval's change when t is an interval
end. The env starts its episodes on the grid (`TradingEnv.reset` and the backtest's decision windows read
`MarketReplay.decision_grid`), so with `decision_every == interval` every decision falls at an interval end
and the position it sets is held over exactly the next interval (orders fill at the next open, which equals
the decision bar's close).

No look-ahead: every random stream is drawn block by block in time order, so the first n bars are the same
whether n or n + m bars are generated (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from r1trade.data.store import timeframe_to_timedelta

if TYPE_CHECKING:
    from r1trade.config import SyntheticConfig

GRID_ATTR = "decision_grid"
"""Candle attrs key: the length in bars of the intervals the data is built on (their ends lie on the grid)."""
EDGE_ATTR = "planted_edge"
"""Candle attrs key: the planted rule's parameters (interval, p, move, seed)."""

_GAMMA_SHAPE = 4.0  # interval move sizes: Gamma(4, 1/4) × move, mean `move`, coefficient of variation 0.5
_WICK_SCALE = 0.5  # a wick is |N(0, 1)| × 0.5 × the bar's volatility
_VOLUME_NOISE = 0.5  # lognormal sigma of volume


@dataclass(frozen=True)
class DecisionGrid:
    """Where planted intervals end in a piece of data: bars first, first + every, first + 2 every, ..."""

    every: int
    first: int
    """Position of the first bar that ends an interval (0 <= first < every)."""

    def on_grid(self, bar: int) -> bool:
        """Whether `bar` (a position in the data) ends an interval."""
        return bar >= 0 and (bar - self.first) % self.every == 0

    def next_on_grid(self, bar: int) -> int:
        """The first interval end at or after `bar`."""
        return bar + (self.first - bar) % self.every


def grid_first_bar(index: pd.DatetimeIndex, timeframe: str, every: int) -> int:
    """Position of the first bar of `index` whose close is a multiple of `every` bars after the epoch."""
    step = timeframe_to_timedelta(timeframe).value
    bars_since_epoch = pd.Timestamp(index[0]).value // step
    return int((-(bars_since_epoch + 1)) % every)


def decision_grid(candles: pd.DataFrame) -> DecisionGrid | None:
    """The interval grid of generated candles (from their attrs and timestamps); None for other data."""
    every = candles.attrs.get(GRID_ATTR)
    if not every or len(candles) == 0:
        return None
    timeframe = candles.attrs.get("timeframe") or "1h"
    return DecisionGrid(every=int(every), first=grid_first_bar(candles.index, timeframe, int(every)))


def planted_edge_candles(
    *,
    seed: int,
    bars: int,
    interval: int,
    p: float,
    move: float,
    volatility: float,
    garch_alpha: float = 0.1,
    garch_beta: float = 0.88,
    initial_price: float = 100.0,
    volume: float = 1000.0,
    timeframe: str = "1h",
    start: str | pd.Timestamp = "2024-01-01",
    symbol: str = "SYN/USD",
) -> pd.DataFrame:
    """`bars` canonical candles from `start` (floored to the timeframe) with the rule the module describes.

    `volatility` is the unconditional std of a bar's log-return (0: straight-line bars), `garch_alpha` and
    `garch_beta` the GARCH(1,1) reaction and persistence, `move` the mean absolute log-change of an interval.
    """
    if bars < 1 or interval < 1:
        raise ValueError("need bars >= 1 and interval >= 1")
    if not 0.0 <= p <= 1.0 or move <= 0 or volatility < 0 or initial_price <= 0 or volume <= 0:
        raise ValueError("need 0 <= p <= 1, move > 0, volatility >= 0, initial_price > 0 and volume > 0")
    if garch_alpha < 0 or garch_beta < 0 or garch_alpha + garch_beta >= 1:
        raise ValueError("need garch_alpha, garch_beta >= 0 and garch_alpha + garch_beta < 1")
    step = timeframe_to_timedelta(timeframe)
    first_open = pd.Timestamp(start)
    first_open = first_open.tz_localize("UTC") if first_open.tzinfo is None else first_open.tz_convert("UTC")
    first_open = pd.Timestamp(first_open.value // step.value * step.value, unit="ns", tz="UTC")
    index = pd.date_range(first_open, periods=bars, freq=step, name="timestamp")
    # generate whole intervals from the one the first bar belongs to; the bars before it are dropped
    skipped = interval - 1 - grid_first_bar(index, timeframe, interval)
    blocks = math.ceil((skipped + bars) / interval)
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]
    uniforms = streams[0].random(blocks)  # (K,)
    sizes = streams[1].standard_gamma(_GAMMA_SHAPE, blocks) / _GAMMA_SHAPE  # (K,)
    shocks = streams[2].standard_normal(blocks * interval)  # (K·I,)
    wicks = np.abs(streams[3].standard_normal((blocks * interval, 2)))  # (K·I, 2)
    noise = streams[4].standard_normal(blocks * interval)  # (K·I,)

    directions = interval_directions(uniforms, p)  # (K,)
    sigma = _garch_sigma(shocks, volatility=volatility, alpha=garch_alpha, beta=garch_beta)  # (K·I,)
    raw = (sigma * shocks).reshape(blocks, interval)  # (K, I)
    variance = (sigma**2).reshape(blocks, interval)
    total = variance.sum(axis=1, keepdims=True)
    weights = np.divide(variance, total, out=np.full_like(variance, 1.0 / interval), where=total > 0)
    target = (directions * move * sizes)[:, None]  # (K, 1): each interval's net log-change
    returns = (raw + weights * (target - raw.sum(axis=1, keepdims=True))).ravel()  # the bridge, (K·I,)

    log_close = np.cumsum(returns)
    log_open = np.r_[0.0, log_close[:-1]]
    keep = slice(skipped, skipped + bars)
    shift = math.log(initial_price) - log_open[skipped]
    close = np.exp(log_close[keep] + shift)
    open_ = np.exp(log_open[keep] + shift)
    high = np.maximum(open_, close) * np.exp(_WICK_SCALE * sigma[keep] * wicks[keep, 0])
    low = np.minimum(open_, close) * np.exp(-_WICK_SCALE * sigma[keep] * wicks[keep, 1])
    scale = volatility if volatility > 0 else move / interval
    volumes = volume * np.exp(_VOLUME_NOISE * noise[keep] - _VOLUME_NOISE**2 / 2) * (
        0.5 + np.abs(returns[keep]) / scale
    )
    candles = pd.DataFrame(
        {"open": open_, "high": high, "low": low, "close": close, "volume": volumes}, index=index
    )
    candles.attrs.update(
        symbol=symbol,
        timeframe=timeframe,
        source=f"synthetic planted_edge (p={p:g}, seed={seed})",
        **{GRID_ATTR: interval, EDGE_ATTR: {"interval": interval, "p": p, "move": move, "seed": seed}},
    )
    return candles


def interval_directions(uniforms: np.ndarray, p: float) -> np.ndarray:
    """±1 per interval: the first from uniforms[0] < 1/2, then the previous one kept when uniforms[k] < p."""
    first = 1.0 if uniforms[0] < 0.5 else -1.0
    flips = np.r_[0, np.cumsum(uniforms[1:] >= p)]
    return first * np.where(flips % 2 == 0, 1.0, -1.0)


def _garch_sigma(shocks: np.ndarray, *, volatility: float, alpha: float, beta: float) -> np.ndarray:
    """Per-bar volatility of a GARCH(1,1) driven by the standard normal `shocks`, from its mean level."""
    variance = volatility**2
    omega = variance * (1.0 - alpha - beta)
    sigma = np.empty(len(shocks))
    for i, z in enumerate(shocks.tolist()):  # a recursion: ~10 ms for 20,000 bars
        sigma[i] = math.sqrt(variance)
        variance = omega + (alpha * z * z + beta) * variance
    return sigma


def synthetic_candles(config: SyntheticConfig, *, interval: int) -> pd.DataFrame:
    """Candles for a `data.synthetic` config section (`interval`: its own, else the env's decision_every)."""
    return planted_edge_candles(
        seed=config.seed,
        bars=config.bars,
        interval=interval,
        p=config.p,
        move=config.move,
        volatility=config.volatility,
        garch_alpha=config.garch_alpha,
        garch_beta=config.garch_beta,
        initial_price=config.initial_price,
        volume=config.volume,
        timeframe=config.timeframe,
        start=pd.Timestamp(config.start),
        symbol=config.symbol,
    )


@dataclass(frozen=True)
class EdgeStats:
    """How often an interval's sign repeated the previous interval's, over `pairs` consecutive intervals."""

    every: int
    pairs: int
    repeat_rate: float

    @property
    def standard_error(self) -> float:
        """Binomial standard error of `repeat_rate`."""
        if self.pairs == 0:
            return math.nan
        return math.sqrt(max(self.repeat_rate * (1 - self.repeat_rate), 1e-12) / self.pairs)


def interval_changes(candles: pd.DataFrame, grid: DecisionGrid) -> np.ndarray:
    """Close-to-close changes between consecutive interval ends (the first end has no predecessor)."""
    ends = candles["close"].to_numpy()[grid.first :: grid.every]
    return np.diff(ends)


def measure_edge(candles: pd.DataFrame, grid: DecisionGrid | None = None) -> EdgeStats | None:
    """The realised sign persistence of consecutive intervals on `grid` (default: the data's own grid)."""
    grid = grid or decision_grid(candles)
    if grid is None:
        return None
    signs = np.sign(interval_changes(candles, grid))
    same = signs[1:] == signs[:-1]
    counted = (signs[1:] != 0) & (signs[:-1] != 0)
    pairs = int(counted.sum())
    return EdgeStats(grid.every, pairs, float(same[counted].mean()) if pairs else math.nan)


def oracle_targets(candles: pd.DataFrame) -> pd.Series:
    """The planted rule as targets: at each interval end t, sign(close[t] - close[t - interval]) when p > 0.5,
    the opposite when p < 0.5, flat when p = 0.5; held until the next interval end; flat before the first one.

    Uses bars up to t only. Raises ValueError for candles without a planted edge.
    """
    edge, grid = candles.attrs.get(EDGE_ATTR), decision_grid(candles)
    if not edge or grid is None:
        raise ValueError("the oracle needs synthetic planted-edge candles (data.source: synthetic)")
    p = float(edge["p"])
    side = 1.0 if p > 0.5 else -1.0 if p < 0.5 else 0.0
    close = candles["close"].to_numpy()
    target = np.full(len(close), np.nan)
    ends = np.arange(grid.first, len(close), grid.every)
    ends = ends[ends >= grid.every]  # an interval end with a full interval of history
    target[ends] = side * np.sign(close[ends] - close[ends - grid.every])
    return pd.Series(target, index=candles.index, name="target").ffill().fillna(0.0)
