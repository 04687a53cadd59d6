"""Environment test helpers: hand-made and random candles, configs without frictions, tool-call text."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from r1trade.config import EnvConfig, RewardsConfig
from r1trade.env import MarketReplay, TradingEnv

SHORT_INDICATORS = ["rsi_3", "sma_3"]


def ohlc_candles(rows: list[tuple[float, float, float, float]], *, start: str = "2024-01-01") -> pd.DataFrame:
    """Canonical candles from (open, high, low, close) rows, volume 1."""
    frame = pd.DataFrame(rows, columns=["open", "high", "low", "close"], dtype=float)
    frame["volume"] = 1.0
    frame.index = pd.date_range(start, periods=len(rows), freq="1h", tz="UTC", name="timestamp")
    frame.attrs.update(symbol="TEST/USD", timeframe="1h", source="test")
    return frame


def daily(log_returns: list[float]) -> pd.DataFrame:
    """Daily candles with closes 100·exp(cumulative log-returns), each bar opening at the previous close."""
    close = 100.0 * np.exp(np.cumsum([0.0, *log_returns]))
    open_ = np.r_[close[0], close[:-1]]
    index = pd.date_range("2024-01-01", periods=len(close), freq="D", tz="UTC", name="timestamp")
    return pd.DataFrame(
        {"open": open_, "high": np.maximum(open_, close), "low": np.minimum(open_, close), "close": close,
         "volume": 1.0},
        index=index,
    )


def flat_then(closes: list[float], *, lead: int = 3) -> pd.DataFrame:
    """`lead` bars at 100, then bars opening at the previous close and closing at each of `closes`."""
    rows = [(100.0, 100.0, 100.0, 100.0)] * lead
    previous = 100.0
    for close in closes:
        rows.append((previous, max(previous, close), min(previous, close), close))
        previous = close
    return ohlc_candles(rows)


def random_candles(n: int = 300, *, seed: int = 0, sigma: float = 0.01) -> pd.DataFrame:
    """A valid random-walk OHLCV series with gaps between close and next open."""
    rng = np.random.default_rng(seed)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0, sigma, n)))
    open_ = np.r_[100.0, close[:-1]] * np.exp(rng.normal(0, sigma / 4, n))
    high = np.maximum(open_, close) * (1 + rng.uniform(0, sigma, n))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, sigma, n))
    frame = pd.DataFrame(
        {"open": open_, "high": high, "low": low, "close": close, "volume": rng.uniform(1, 10, n)},
        index=pd.date_range("2024-01-01", periods=n, freq="1h", tz="UTC", name="timestamp"),
    )
    frame.attrs.update(symbol="TEST/USD", timeframe="1h", source="test")
    return frame


def env_config(**overrides: Any) -> EnvConfig:
    """A small env: short indicators, no frictions unless asked, decisions every bar."""
    base: dict[str, Any] = dict(
        fee_bps=0.0,
        slippage_bps=0.0,
        slippage_vol_frac=0.0,
        decision_every=1,
        episode_decisions=3,
        warmup_bars=1,
        indicators=SHORT_INDICATORS,
        observe_indicators=["rsi_3"],
    )
    return EnvConfig(**{**base, **overrides})


def make_env(
    candles: pd.DataFrame | MarketReplay, rewards: RewardsConfig | None = None, **overrides: Any
) -> TradingEnv:
    return TradingEnv(candles, env_config(**overrides), rewards or RewardsConfig())


def call(name: str, reasoning: str = "", **arguments: Any) -> str:
    """A well-formed turn calling `name`."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"{reasoning}<tool_call>{body}</tool_call>"


def long(size: float = 1.0, view: str = "bullish", **extra: Any) -> str:
    return call("place_order", side="long", size=size, view=view, **extra)


def short(size: float = 1.0, view: str = "bearish", **extra: Any) -> str:
    return call("place_order", side="short", size=size, view=view, **extra)


def hold(view: str = "neutral") -> str:
    return call("hold", view=view)


def close(view: str = "neutral") -> str:
    return call("close_position", view=view)
