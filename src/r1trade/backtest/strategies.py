"""Rule baselines: each maps candles to a target position per bar (fraction of equity; |target| ≤ 1 unless a
volatility-target mandate's sizes go above it, held on margin).

A target at bar t is computed from bars 0..t only (trailing windows, forward fills, per-bar random draws), so
it can be decided at that bar's close; warm-up bars where an indicator is undefined are flat (0).

The volatility-target mandate (`env.mandate: vol_target`) is judged against `vol_target` sized from its sizes,
`random_sizes`, buy-and-hold, `best_constant`: the constant size whose mean mandate miss was lowest on the
train split (`best_constant_exposure`), and `vol_forecast`: sizes from a volatility forecast fitted on the train
split (`r1trade.backtest.volatility_forecast`); neither is chosen on the bars it is tested on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from ta.momentum import RSIIndicator

from r1trade.backtest.mandate import decision_misses, split_decisions
from r1trade.backtest.volatility_forecast import trailing_volatility, vol_forecast
from r1trade.data.synthetic import oracle_targets

Strategy = Callable[..., pd.Series]


def buy_and_hold(candles: pd.DataFrame) -> pd.Series:
    """Fully long from the first close onwards (so it enters at the open of bar 1)."""
    return pd.Series(1.0, index=candles.index, name="target")


def sma_crossover(
    candles: pd.DataFrame, *, fast: int = 20, slow: int = 50, allow_short: bool = False
) -> pd.Series:
    """Momentum: long while the fast SMA of closes is above the slow one, else flat or short."""
    if not 0 < fast < slow:
        raise ValueError("need 0 < fast < slow")
    close = candles["close"]
    fast_ma, slow_ma = close.rolling(fast).mean(), close.rolling(slow).mean()
    target = np.where(fast_ma > slow_ma, 1.0, -1.0 if allow_short else 0.0)
    return pd.Series(np.where(slow_ma.notna(), target, 0.0), index=candles.index, name="target")


def rsi_mean_reversion(
    candles: pd.DataFrame,
    *,
    window: int = 14,
    low: float = 30.0,
    high: float = 70.0,
    allow_short: bool = False,
) -> pd.Series:
    """Mean reversion on RSI: long from RSI < low, flat (or short) from RSI > high, held till the next."""
    if not 0 <= low < high <= 100:
        raise ValueError("need 0 <= low < high <= 100")
    rsi = RSIIndicator(candles["close"], window=window).rsi()
    signal = pd.Series(np.nan, index=candles.index)
    signal[rsi < low] = 1.0
    signal[rsi > high] = -1.0 if allow_short else 0.0
    return signal.ffill().fillna(0.0).rename("target")


def random_strategy(
    candles: pd.DataFrame, *, seed: int = 0, p_change: float = 0.05, allow_short: bool = False
) -> pd.Series:
    """Noise baseline: at each bar, with probability p_change, a new target drawn from {-1, 0, 1} (or {0, 1}).

    The draws depend only on the seed and the bar's position, never on prices.
    """
    levels = np.array([-1.0, 0.0, 1.0] if allow_short else [0.0, 1.0])
    uniforms = np.random.default_rng(seed).random((len(candles), 2))  # row t depends on t only: prefix-stable
    draws = levels[(uniforms[:, 1] * len(levels)).astype(np.int64)]
    target = pd.Series(np.where(uniforms[:, 0] < p_change, draws, np.nan), index=candles.index, name="target")
    return target.ffill().fillna(0.0)


def vol_target(
    candles: pd.DataFrame,
    *,
    target: float = 0.5,
    lookback: int = 168,
    max_leverage: float = 1.0,
    band: float = 0.1,
    sizes: Sequence[float] | None = None,
) -> pd.Series:
    """Volatility targeting: long target / σ of equity, at most max_leverage, so the position's volatility is
    about `target` (annualised, 0.5 = 50 % a year) whatever the market's.

    σ at bar t is the standard deviation (ddof 1) of the `lookback` log close-to-close returns ending at bar
    t, annualised over a 365-day year of the candles' bar length; flat until `lookback` returns exist. With
    `sizes` (a mandate's), the size is the nearest of them (the smaller on a tie). A new size is traded only
    when it differs from the one held by more than `band` (fraction of equity), which keeps the turnover, and
    so the fees, of small estimate changes away. Volatility clusters, so a size from recent volatility holds
    less through turbulent periods (Moreira & Muir 2017). A cap above 1 holds on margin, which the backtest
    allows up to `env.max_position_frac`.
    """
    if target <= 0 or lookback < 2 or not max_leverage > 0 or band < 0:
        raise ValueError("need target > 0, lookback >= 2, max_leverage > 0 and band >= 0")
    sigma = trailing_volatility(candles, lookback)  # (n,) annualised, NaN in the warm-up
    with np.errstate(divide="ignore"):
        wanted = np.minimum(target / sigma, max_leverage)  # NaN in the warm-up, the cap at σ = 0
    if sizes is not None:
        wanted = nearest_size(wanted, sizes)
    held, held_sizes = 0.0, np.zeros(len(candles))
    for t, size in enumerate(wanted.tolist()):
        if not np.isnan(size) and abs(size - held) > band:
            held = size
        held_sizes[t] = held
    return pd.Series(held_sizes, index=candles.index, name="target")


def nearest_size(wanted: np.ndarray, sizes: Sequence[float]) -> np.ndarray:
    """Each wanted size as the nearest of `sizes` (the smaller on a tie); NaN stays NaN.

    >>> nearest_size(np.array([0.6, 0.625, 3.0, np.nan]), [0, 0.25, 0.5, 0.75, 1, 1.5]).tolist()
    [0.5, 0.5, 1.5, nan]
    """
    if len(sizes) == 0:
        raise ValueError("sizes must not be empty")
    levels = np.sort(np.asarray(sizes, dtype=float))
    wanted = np.asarray(wanted, dtype=float)
    nearest = levels[np.abs(wanted[:, None] - levels[None, :]).argmin(axis=1)]  # (n,): the first of a tie
    return np.where(np.isnan(wanted), np.nan, nearest)


def constant_exposure(candles: pd.DataFrame, *, size: float) -> pd.Series:
    """The same long size (fraction of equity) at every bar: `best_constant` holds the one chosen on the train
    split (`best_constant_exposure`)."""
    if size < 0:
        raise ValueError("need size >= 0")
    return pd.Series(float(size), index=candles.index, name="target")


def random_sizes(
    candles: pd.DataFrame, *, seed: int = 0, sizes: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0)
) -> pd.Series:
    """Noise baseline for a mandate: at every bar a long size drawn uniformly from `sizes` (a mandate's, under
    one: each decision then holds a fresh draw). The draws depend only on the seed and the bar's position."""
    if len(sizes) == 0 or min(sizes) < 0:
        raise ValueError("need sizes, each >= 0")
    levels = np.asarray(sizes, dtype=float)
    uniforms = np.random.default_rng(seed).random(len(candles))  # entry t depends on t only: prefix-stable
    return pd.Series(levels[(uniforms * len(levels)).astype(np.int64)], index=candles.index, name="target")


def best_constant_exposure(
    candles: pd.DataFrame, *, sizes: Sequence[float], target_vol: float, every: int, first: int
) -> tuple[float, dict[float, float]]:
    """The constant size with the lowest mean mandate miss (`decision_misses`) over the decisions at bars
    first, first + every, ... of `candles` that have a whole interval after them, and each size's mean miss.
    Meant for the train split: the choice then never sees the bars it is tested on. The smaller size wins a
    tie.
    """
    _, sigma = split_decisions(candles, every=every, first=first)  # (D,) annualised
    misses = {
        float(size): float(decision_misses(np.full(len(sigma), size), sigma, target_vol=target_vol).mean())
        for size in sorted(sizes)
    }
    return min(misses, key=misses.__getitem__), misses


def oracle(candles: pd.DataFrame, *, allow_short: bool = True) -> pd.Series:
    """The rule planted in synthetic candles (`r1trade.data.synthetic`): at the end of each planted interval,
    long if the interval's close-to-close change was up and short if down when p > 0.5 (the reverse when
    p < 0.5, flat when p = 0.5), held over the next interval. Without shorting, a short becomes flat.

    Decided from bars up to t; the best any policy can do in expectation on that market. Raises ValueError on
    candles without a planted edge.
    """
    target = oracle_targets(candles)
    return target if allow_short else target.clip(lower=0.0)


class StrategySpec(NamedTuple):
    """A baseline and the parameters it runs with unless overridden."""

    fn: Strategy
    defaults: dict[str, Any]


STRATEGIES: dict[str, StrategySpec] = {
    "buy_and_hold": StrategySpec(buy_and_hold, {}),
    "sma_crossover": StrategySpec(sma_crossover, {"fast": 20, "slow": 50, "allow_short": False}),
    "rsi_mean_reversion": StrategySpec(
        rsi_mean_reversion, {"window": 14, "low": 30.0, "high": 70.0, "allow_short": False}
    ),
    "random": StrategySpec(random_strategy, {"seed": 0, "p_change": 0.05, "allow_short": False}),
    "vol_target": StrategySpec(
        vol_target, {"target": 0.5, "lookback": 168, "max_leverage": 1.0, "band": 0.1, "sizes": None}
    ),
    "random_sizes": StrategySpec(random_sizes, {"seed": 0, "sizes": [0.0, 0.25, 0.5, 0.75, 1.0]}),
}
"""Rule baselines that run on any candles."""

PLANTED_EDGE_STRATEGIES: dict[str, StrategySpec] = {"oracle": StrategySpec(oracle, {"allow_short": True})}
"""Baselines that need generated candles with a planted edge (`data.source: synthetic`)."""

MANDATE_STRATEGIES: dict[str, StrategySpec] = {
    "best_constant": StrategySpec(constant_exposure, {"size": 1.0}),
    "vol_forecast": StrategySpec(vol_forecast, {
        "intercept": 0.0, "short_coef": 0.0, "long_coef": 1.0, "residual_var": 0.0, "target": 0.5,
        "sizes": [0.0, 0.25, 0.5, 0.75, 1.0], "short": 24, "long": 168,
    }),
}
"""Baselines that need a volatility-target mandate (`env.mandate: vol_target`): the backtest chooses the size,
or fits the forecast, on the train split."""

ALL_STRATEGIES: dict[str, StrategySpec] = {**STRATEGIES, **PLANTED_EDGE_STRATEGIES, **MANDATE_STRATEGIES}


def make_targets(name: str, candles: pd.DataFrame, **overrides: Any) -> pd.Series:
    """Targets of the registered strategy `name`, with its defaults updated by `overrides`."""
    if name not in ALL_STRATEGIES:
        raise KeyError(f"unknown strategy {name!r}; choose from {sorted(ALL_STRATEGIES)}")
    spec = ALL_STRATEGIES[name]
    unknown = set(overrides) - set(spec.defaults)
    if unknown:
        raise TypeError(f"{name} has no parameter(s) {sorted(unknown)}")
    return spec.fn(candles, **{**spec.defaults, **overrides})
