"""The risk-aware reward components (variance, drawdown) and the volatility tool, on worked examples."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from r1trade.config import EnvConfig, RewardsConfig, load_config
from r1trade.data.store import timeframe_to_timedelta
from r1trade.env.market import MarketReplay
from r1trade.env.rewards import COMPONENTS, drawdown_step, squared_return
from r1trade.env.trading_env import TradingEnv, make_envs
from r1trade.env.volatility import mean_true_range_pct, realised_volatility, volatility_text

CALL = '<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def call(name: str, args: str = "{}") -> str:
    return CALL.format(name=name, args=args)


def candles_from_closes(closes: list[float], freq: str = "1h") -> pd.DataFrame:
    """Bars that open at the previous close (the first at its own), high and low at the body's ends."""
    close = np.asarray(closes, dtype=float)
    open_ = np.r_[close[0], close[:-1]]
    step = timeframe_to_timedelta(freq)
    index = pd.date_range("2024-01-01", periods=len(close), freq=step, tz="UTC", name="timestamp")
    frame = pd.DataFrame(
        {"open": open_, "high": np.maximum(open_, close), "low": np.minimum(open_, close), "close": close,
         "volume": 1.0},
        index=index,
    )
    frame.attrs.update(symbol="TEST/USD", timeframe=freq, source="test")
    return frame


# --------------------------------------------------------------------------- pure reward functions


def test_squared_return_is_the_square() -> None:
    assert squared_return(0.03) == pytest.approx(9e-4)
    assert squared_return(-0.03) == squared_return(0.03)


def test_drawdown_step_by_hand() -> None:
    # peak 100 → 110 at the first mark; 99 is log(110 / 99) = 0.105361 below it: the deepest so far
    increase, peak, deepest = drawdown_step([110.0, 99.0], peak=100.0, deepest=0.0)
    assert (increase, peak, deepest) == pytest.approx((0.1053605, 110.0, 0.1053605))
    # a rebound that stays above the trough deepens nothing
    assert drawdown_step([104.5, 103.0], peak=peak, deepest=deepest) == pytest.approx((0.0, 110.0, deepest))
    # a new peak 121, then 96.8: log(121 / 96.8) = log(1.25) = 0.223144, 0.223144 - 0.105361 = 0.117783 more
    increase, peak, deepest = drawdown_step([121.0, 96.8], peak=110.0, deepest=deepest)
    assert (increase, peak, deepest) == pytest.approx((0.1177830, 121.0, math.log(1.25)))
    # equity at or below zero is floored like the pnl's log: log(1 / 0.01) = 4.60517
    assert drawdown_step([-5.0], peak=100.0, deepest=0.0)[0] == pytest.approx(math.log(100.0))


def test_risk_components_have_weights_with_descriptions() -> None:
    assert COMPONENTS["variance"] == "variance" and COMPONENTS["drawdown"] == "drawdown"
    for field in ("variance", "drawdown"):
        assert RewardsConfig.model_fields[field].description
        assert getattr(RewardsConfig(), field) == 0.0  # off unless a config asks for them


# --------------------------------------------------------------------------- the env pays them per decision


def test_env_logs_variance_and_drawdown_per_decision_by_hand() -> None:
    # closes by bar; each bar opens at the previous close. A decision every 2 bars from bar 1, no costs.
    closes = [100.0, 100.0, 110.0, 99.0, 104.5, 103.0, 121.0, 96.8, 100.0]
    config = EnvConfig(fee_bps=0, slippage_bps=0, slippage_vol_frac=0, decision_every=2, warmup_bars=1,
                       indicators=["roc_1"], observe_indicators=[])
    env = TradingEnv(candles_from_closes(closes), config, RewardsConfig(variance=-1.0, drawdown=-1.0))
    env.reset(seed=0, options={"start": 1, "decisions": 3})
    turns = [call("place_order", '{"side": "long", "size": 1, "view": "bullish"}'),
             call("hold", '{"view": "neutral"}'), call("hold", '{"view": "neutral"}')]
    components = [env.step(turn)[4]["reward_components"] for turn in turns]
    # long 100 units at bar 2's open (100): equity 11000, 9900 | 10450, 10300 | 12100, 9680 at the closes
    # log-returns -0.01005, 0.03961, -0.06208; the deepest drawdown grows by 0.10536, 0, 0.11778
    pnl = [math.log(9900 / 10000), math.log(10300 / 9900), math.log(9680 / 10300)]
    deepened = [math.log(11000 / 9900), 0.0, math.log(12100 / 9680) - math.log(11000 / 9900)]
    for step, ret, deeper in zip(components, pnl, deepened, strict=True):
        assert step["pnl"] == pytest.approx(100 * ret)
        assert step["variance"] == pytest.approx(-ret * ret)  # 1.01e-4, 1.569e-3, 3.854e-3, weighted by -1
        assert step["drawdown"] == pytest.approx(-deeper, abs=1e-12)
    # over the episode the drawdown components add up to its maximum drawdown, log(12100 / 9680)
    assert -sum(step["drawdown"] for step in components) == pytest.approx(math.log(1.25))


# --------------------------------------------------------------------------- the volatility tool


def alternating(bars: int, step: float = 0.01) -> pd.DataFrame:
    """Daily closes whose log-returns alternate +step, -step: 100, 101.005, 100, ..."""
    return candles_from_closes([100.0 * math.exp(step * (i % 2)) for i in range(bars)], freq="1d")


def test_volatility_by_hand_on_daily_bars() -> None:
    replay = MarketReplay.build(alternating(30), indicators=[])
    # 2 returns (+0.01, -0.01): std 0.01·√2 a day, over 365 days 0.01·√730 = 27.02 %
    assert realised_volatility(replay.close, 20, 2) * math.sqrt(365) == pytest.approx(0.01 * math.sqrt(730))
    # 14 alternating returns, mean 0: std 0.01·√(14 / 13) = 0.010377 a day, 19.83 % a year
    assert realised_volatility(replay.close, 20, 14) == pytest.approx(0.01 * math.sqrt(14 / 13))
    # every true range is |Δclose| = 1.00502; bar 20 closes at 100: 1.005 % of price
    atr = mean_true_range_pct(replay.high, replay.low, replay.close, 20)
    assert atr == pytest.approx(100 * (math.exp(0.01) - 1))
    assert volatility_text(replay, 20, 2) == (
        "Volatility, annualised over 365 days: 2 bars 27.0% | 14 bars 19.8%. Mean true range, 14 bars: "
        "1.01% of price."
    )
    # at the start of the data the windows are as long as the history, and n/a below two returns
    start = volatility_text(replay, 1, 2)
    assert start.startswith("Volatility, annualised over 365 days: 1 bars n/a | 1 bars n/a.")


def test_volatility_never_reads_a_future_bar() -> None:
    candles = alternating(40)
    altered = candles.copy()
    altered.iloc[21:] = np.random.default_rng(0).uniform(50, 200, size=(19, 5))
    texts = [volatility_text(MarketReplay.build(frame, indicators=[]), 20, 3) for frame in (candles, altered)]
    assert texts[0] == texts[1]


def test_volatility_tool_only_with_its_switch() -> None:
    plain = make_envs(load_config("smoke"), 1)[0]
    assert "get_volatility" not in plain.registry.names and "get_volatility" not in plain.system_prompt
    (env,) = make_envs(load_config("smoke", ["env.volatility_tool=true"]), 1)
    assert "get_volatility" in env.info_tools
    # the same prompt with one more tool line
    added = set(env.system_prompt.splitlines()) - set(plain.system_prompt.splitlines())
    assert len(added) == 1 and next(iter(added)).startswith("- get_volatility(): Realised volatility")
    env.reset(seed=0)
    messages, *_, info = env.step(call("get_volatility"))
    bars = env.env_config.volatility_bars
    assert messages[0]["content"].startswith(f"Volatility, annualised over 365 days: {bars} bars ")
    assert info["tool_error"] is None and info["parse_error"] is None
    # hourly bars: the realised volatility shown is the per-bar std times √8760
    expected = realised_volatility(env.replay.close, env.bar, bars) * math.sqrt(8760) * 100
    assert f"{bars} bars {expected:.1f}%" in messages[0]["content"]
