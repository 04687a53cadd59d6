"""TradingEnv as the rollout sees it: messages, determinism, no look-ahead, bounded context, limits."""

from __future__ import annotations

import math

import env_fuzz as fuzz
import numpy as np
import pandas as pd
import pytest
from env_fixtures import call, close, hold, long, make_env, ohlc_candles, random_candles, short
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1trade.config import RewardsConfig, load_config
from r1trade.env import MarketReplay, TradingEnv, load_replay, make_envs
from r1trade.env.check import momentum_policy, random_policy, run_episode
from r1trade.env.rewards import COMPONENTS
from r1trade.errors import DataError

ROLES = {"system", "user", "assistant", "tool"}
ALL_INDICATORS = ["rsi_14", "macd_hist", "bb_pctb", "atr_14", "sma_20", "ema_50", "volume_z", "roc_12",
                  "adx_14"]


@pytest.fixture(scope="module")
def replay() -> MarketReplay:
    return MarketReplay.build(random_candles(400, seed=7), indicators=["rsi_3", "sma_3"])


def test_reset_returns_system_and_first_observation(replay: MarketReplay) -> None:
    env = make_env(replay)
    messages, info = env.reset(seed=3)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == env.system_prompt
    assert messages[1]["content"].startswith("Decision 1/3 | ")
    assert info["decision_index"] == 0 and info["equity"] == 10_000 and info["context_reset"] is False
    assert env.messages == messages


def test_tool_schemas_are_openai_style_and_rendered_into_the_system_prompt(replay: MarketReplay) -> None:
    env = make_env(replay)
    names = [schema["function"]["name"] for schema in env.tool_schemas]
    assert names == ["get_candles", "get_indicators", "get_sentiment", "get_portfolio", "place_order",
                     "close_position", "hold"]
    for schema in env.tool_schemas:
        assert schema["type"] == "function"
        assert schema["function"]["parameters"]["type"] == "object"
        assert f"- {schema['function']['name']}(" in env.system_prompt
    assert '<tool_call>{"name": "place_order", "arguments": {"side": "long"' in env.system_prompt


def test_step_message_roles_and_info(replay: MarketReplay) -> None:
    env = make_env(replay, episode_decisions=2)
    env.reset(seed=1)
    messages, reward, terminated, truncated, info = env.step(call("get_candles", "Look first.", n=3))
    assert [m["role"] for m in messages] == ["tool"]
    assert messages[0]["content"].startswith("Last 3 bars (time open high low close volume):")
    assert not info["decision_done"] and info["action"] == {"name": "get_candles", "arguments": {"n": 3}}
    assert set(info["reward_components"]) == set(COMPONENTS)
    assert reward == pytest.approx(sum(info["reward_components"].values()))
    messages, reward, terminated, truncated, info = env.step(long(0.5, stop_loss=2))
    assert [m["role"] for m in messages] == ["tool", "user"]
    assert messages[1]["content"].startswith("Decision 2/2 | ")
    assert info["decision_done"] and info["decision_index"] == 0 and len(info["fills"]) == 1
    assert (terminated, truncated) == (False, False)
    messages, reward, terminated, truncated, info = env.step(hold())
    assert [m["role"] for m in messages] == ["tool"]
    assert "Episode over after 2 decisions" in messages[0]["content"]
    assert (terminated, truncated, info["decision_index"]) == (False, True, 1)
    assert info["episode"]["decisions"] == 2
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(hold())


def test_fixed_start_and_reset_option_errors(replay: MarketReplay) -> None:
    env = make_env(replay)
    _, info = env.reset(options={"start": 100, "decisions": 5})
    assert (info["start_bar"], info["decisions"]) == (100, 5)
    assert env.max_decisions(100) == 299
    with pytest.raises(ValueError, match="does not fit"):
        env.reset(options={"start": 395, "decisions": 10})
    with pytest.raises(DataError, match="cannot hold"):
        make_env(replay, warmup_bars=390, episode_decisions=20).reset(seed=0)


# ------------------------------------------------------------------------------------------- determinism


def test_same_seed_same_trajectory_and_different_seed_different_start(replay: MarketReplay) -> None:
    rewards = RewardsConfig(sharpe=0.5)
    runs = [
        run_episode(make_env(replay, rewards, slippage_vol_frac=0.5, fee_bps=10), random_policy, seed=seed)
        for seed in (5, 5, 6)
    ]
    assert runs[0]["transcript"] == runs[1]["transcript"]
    assert runs[0]["transcript"][0] != runs[2]["transcript"][0]  # start bar
    env = make_env(replay)
    assert len({env.reset(seed=seed)[1]["start_bar"] for seed in range(5)}) > 1


def test_slippage_is_seeded_and_random(replay: MarketReplay) -> None:
    def fill_price(seed: int) -> float:
        env = make_env(replay, slippage_bps=2, slippage_vol_frac=1.0)
        env.reset(seed=seed, options={"start": 50})
        return env.step(long(1.0))[4]["fills"][0]["price"]

    assert fill_price(1) == fill_price(1)
    assert fill_price(1) != fill_price(2)
    no_noise = make_env(replay, slippage_bps=2)
    no_noise.reset(seed=1, options={"start": 50})
    price = no_noise.step(long(1.0))[4]["fills"][0]["price"]
    assert price == pytest.approx(replay.open[51] * 1.0002)
    assert fill_price(1) > price  # the random part is always adverse


# ------------------------------------------------------------------------------------------- look-ahead


INFO_CALLS = (call("get_candles", n=24), call("get_indicators"), call("get_sentiment"), call("get_portfolio"))


def _transcript_until(env: TradingEnv, decision: int) -> list[str]:
    """Every message the agent sees up to decision `decision`, including its information tools' answers."""
    seen = [m["content"] for m in env.reset(seed=11, options={"start": 100})[0]]
    trades = [long(0.7, stop_loss=1, take_profit=2), short(0.4), hold(), close(), long(1.0, stop_loss=0.5)]
    for index in range(decision + 1):
        for text in INFO_CALLS:
            seen += [m["content"] for m in env.step(text)[0]]
        if index < decision:
            seen += [m["content"] for m in env.step(trades[index % len(trades)])[0]]
    return seen


def test_no_look_ahead_observations_up_to_t_are_byte_identical() -> None:
    candles = random_candles(300, seed=4, sigma=0.02)
    stamps = pd.date_range(candles.index[0], periods=300 // 6, freq="6h", tz="UTC")
    sentiment = pd.Series(np.random.default_rng(0).uniform(0, 100, len(stamps)), index=stamps)
    decision, every, start = 10, 2, 100
    t = start + decision * every  # the decision bar
    decided_at = candles.index[t] + pd.Timedelta("1h")
    future_candles = candles.copy()
    later = future_candles.index[t + 1 :]
    scale = np.random.default_rng(1).uniform(0.3, 3.0, len(later))
    for column in ("open", "high", "low", "close"):
        future_candles.loc[later, column] *= scale
    future_candles.loc[later, "volume"] *= scale[::-1]
    future_sentiment = sentiment.where(sentiment.index <= decided_at, 100 - sentiment)
    transcripts = []
    for bars, mood in ((candles, sentiment), (future_candles, future_sentiment), (candles, None),
                       (future_candles, None)):
        replay = MarketReplay.build(bars, indicators=ALL_INDICATORS, sentiment=mood)
        env = make_env(replay, indicators=ALL_INDICATORS, observe_indicators=["rsi_14", "adx_14"],
                       decision_every=every, episode_decisions=20, max_tool_calls=5, max_context_turns=6,
                       history_turns=2, fee_bps=10, slippage_bps=3, slippage_vol_frac=0.5)
        transcripts.append(_transcript_until(env, decision))
        after = env.step(hold())[0]
        transcripts[-1].append(after[-1]["content"])  # the next observation: here the futures differ
    with_file, with_file_altered, with_proxy, with_proxy_altered = transcripts
    assert with_file[:-1] == with_file_altered[:-1]
    assert with_proxy[:-1] == with_proxy_altered[:-1]
    assert with_file[-1] != with_file_altered[-1] and with_proxy[-1] != with_proxy_altered[-1]
    assert any("Sentiment" in text and "sentiment data" in text for text in with_file)
    assert any("Earlier turns are omitted" in text for text in with_file)  # context resets happened before t


# ------------------------------------------------------------------------------------------- context


def test_bounded_context_replaces_the_history_and_rollout_view_matches(replay: MarketReplay) -> None:
    env = make_env(replay, episode_decisions=30, max_context_turns=4, history_turns=2, max_tool_calls=3)
    context, _ = env.reset(seed=2)
    rng = np.random.default_rng(0)
    done, resets, longest = False, 0, 0
    while not done:
        text = random_policy(env, rng) if rng.random() < 0.7 else "no call here"
        messages, _, terminated, truncated, info = env.step(text)
        if info["context_reset"]:
            resets += 1
            assert info["decision_done"]
            context = messages
            assert [m["role"] for m in context[:2]] == ["system", "user"]
            assert context[1]["content"].startswith("Earlier turns are omitted.")
            assert sum(m["role"] == "assistant" for m in context) == 2
            assert context[-3]["role"] == "assistant" and context[-3]["content"] == text  # this turn kept
            assert context[-2]["role"] == "tool"
            assert context[-1]["role"] == "user" and context[-1]["content"].startswith("Decision ")
        else:
            context = [*context, {"role": "assistant", "content": text}, *messages]
        assert context == env.messages
        assert all(m["role"] in ROLES for m in context)
        longest = max(longest, sum(m["role"] == "assistant" for m in context))
        done = terminated or truncated
    assert resets >= 5
    assert longest <= 4 + 3 - 1  # max_context_turns, plus the calls of one unfinished decision


def test_summary_after_reset_states_position_and_recent_decisions(replay: MarketReplay) -> None:
    env = make_env(replay, episode_decisions=6, max_context_turns=2, history_turns=1)
    env.reset(seed=0)
    env.step(long(0.5, stop_loss=3))
    env.step(hold("bullish"))
    messages, _, _, _, info = env.step(short(0.25, stop_loss=3))
    assert info["context_reset"]
    summary = messages[1]["content"]
    assert "Decision 4 of 6 comes next" in summary and "Position short 0.25 of equity" in summary
    assert "Recent decisions: #1 long 0.5 (bullish); #2 hold (bullish); #3 short 0.25 (bearish)." in summary
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]


# ------------------------------------------------------------------------------------------- limits


def test_max_tool_calls_forces_a_hold_with_penalty(replay: MarketReplay) -> None:
    env = make_env(replay, max_tool_calls=3)
    env.reset(seed=4)
    env.step(long(0.5, stop_loss=5))
    units = env.portfolio.units
    for left in (2, 1):
        messages, _, _, _, info = env.step(call("get_portfolio"))
        assert not info["decision_done"] and f"({left} tool call" in messages[0]["content"]
    messages, reward, _, _, info = env.step("thinking without a call")
    assert info["decision_done"] and info["forced_hold"]
    assert info["reward_components"]["forced_hold"] == -0.2
    assert info["reward_components"]["format"] == -0.2
    assert "No trade after 3 tool calls: forced hold." in messages[0]["content"]
    assert [m["role"] for m in messages] == ["tool", "user"]
    assert env.portfolio.units == units
    assert info["reward_components"]["pattern"] == 0  # a forced hold states no view


def test_shorting_disabled(replay: MarketReplay) -> None:
    env = make_env(replay, allow_short=False)
    assert "shorting is disabled" in env.system_prompt
    env.reset(seed=0)
    messages, _, _, _, info = env.step(short(0.5))
    assert info["tool_error"].startswith("shorting is disabled") and not info["decision_done"]
    assert info["reward_components"]["tool_error"] == -0.1 and info["reward_components"]["valid_call"] == 0
    assert env.portfolio.units == 0
    env.step(long(0.5, stop_loss=3))
    _, _, _, _, info = env.step(close())
    assert env.portfolio.units == 0 and info["fills"][0]["side"] == "sell"


def test_bankruptcy_terminates_with_the_penalty() -> None:
    candles = ohlc_candles([
        (100, 100, 100, 100), (100, 100, 100, 100), (100, 100, 100, 100),
        (100, 150, 100, 150), (150, 260, 150, 250), (250, 250, 250, 250), (250, 250, 250, 250),
    ])
    env = make_env(candles, max_position_frac=1.0, episode_decisions=4)
    env.reset(options={"start": 2, "decisions": 4})
    _, _, terminated, _, info = env.step(short(1.0))
    assert not terminated and info["equity"] == pytest.approx(5_000)  # 20 000 cash − 100 units × 150
    messages, reward, terminated, truncated, info = env.step(hold("bearish"))
    assert terminated and not truncated
    assert info["equity"] == pytest.approx(-5_000)
    assert info["episode"]["bankrupt"] and "bankrupt, episode over" in messages[0]["content"]
    assert info["reward_components"]["bankruptcy"] == -10.0
    assert info["reward_components"]["pnl"] == pytest.approx(100 * math.log(0.01))
    assert [m["role"] for m in messages] == ["tool"]


def test_oversized_orders_are_clipped(replay: MarketReplay) -> None:
    env = make_env(replay, max_position_frac=0.5, max_leverage=2.0)
    env.reset(seed=0)
    messages, _, _, _, info = env.step(long(1.5, stop_loss=2))
    assert "clipped from 1.5 to the limit 0.5" in messages[0]["content"]
    assert info["order"]["target"] == 0.5
    assert info["reward_components"]["risk_oversize"] == -0.02
    assert abs(info["exposure"] - 0.5) < 0.05


# ------------------------------------------------------------------------------------------- real data


def test_from_config_on_the_real_sample_is_cached_and_prompts_are_compact() -> None:
    config = load_config("btc_momentum")
    first = TradingEnv.from_config(config)
    envs = make_envs(config, 3)
    assert all(env.replay is first.replay for env in envs)
    assert load_replay(config, "train") is first.replay
    assert first.replay.symbol == "BTC/USD" and len(first.replay) == pytest.approx(0.7 * 20_111, abs=2)
    assert len(first.system_prompt) < 2_400
    messages, _ = first.reset(seed=0)
    assert len(messages[1]["content"]) < 600
    rng = np.random.default_rng(0)
    for _ in range(24):
        observation, _, terminated, truncated, _ = first.step(momentum_policy(first, rng))
        assert all(len(m["content"]) < 600 for m in observation if m["role"] == "user")
        if terminated or truncated:
            break
    first.reset(seed=1)
    tool_answers = [first.step(call(name))[0][0]["content"] for name in ("get_indicators", "get_sentiment")]
    assert "RSI14" in tool_answers[0] and "market proxy" in tool_answers[1]


def test_engine_and_env_fill_identically_without_random_slippage() -> None:
    engine = pytest.importorskip("r1trade.backtest.engine")
    candles = random_candles(200, seed=8, sigma=0.02)
    every, start = 3, 20
    env = make_env(candles, fee_bps=10, slippage_bps=5, decision_every=every)
    plan = [0.5, None, -1.0, -1.0, 0.0, 1.0, 0.25, None, -0.5, 0.0, 0.75]
    env.reset(options={"start": start, "decisions": len(plan)})
    target = np.zeros(len(candles))
    current = 0.0
    for index, size in enumerate(plan):
        if size is None:
            env.step(hold())
        elif size == 0.0:
            env.step(close())
        else:
            env.step(long(size) if size > 0 else short(-size))
        current = current if size is None else size
        target[start + index * every :] = current
    result = engine.run_vectorized(candles, pd.Series(target, index=candles.index), initial_cash=10_000,
                                   fee_bps=10, slippage_bps=5)
    curve = env.equity_curve()
    np.testing.assert_allclose(curve.to_numpy(), result.equity.loc[curve.index].to_numpy(), rtol=1e-12)
    engine_fills = result.fills[result.fills["bar"] <= curve.index.size + start]
    env_fills = env.fills
    assert len(env_fills) == len(engine_fills)
    np.testing.assert_allclose([f.units for f in env_fills], engine_fills["units"], rtol=1e-12)
    np.testing.assert_allclose([f.price for f in env_fills], engine_fills["price"], rtol=1e-12)
    np.testing.assert_allclose([f.fee for f in env_fills], engine_fills["fee"], rtol=1e-12)


# ------------------------------------------------------------------------------------------- fuzzing

_FUZZ_ENV = make_env(MarketReplay.build(random_candles(120, seed=9), indicators=["rsi_3", "sma_3"]),
                     episode_decisions=4, slippage_vol_frac=0.3, fee_bps=10)


@given(st.lists(fuzz.turns, min_size=1, max_size=3), st.integers(0, 2**16))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_env_step_never_crashes(seed_texts: list[str], seed: int) -> None:
    env = _FUZZ_ENV
    env.reset(seed=seed)
    for text in (variant for seed_text in seed_texts for variant in fuzz.mutations(seed_text)):
        messages, reward, terminated, truncated, info = env.step(text)
        assert messages and all(m["role"] in ROLES and isinstance(m["content"], str) for m in messages)
        for message in env.messages:
            message["content"].encode("utf-8")
        assert math.isfinite(reward) and set(info["reward_components"]) == set(COMPONENTS)
        assert math.isfinite(info["equity"])
        if terminated or truncated:
            env.reset()


def test_each_decision_reports_whether_its_position_pointed_the_way_the_market_moved() -> None:
    """Worked example, decision_every 2: from bar t the position is filled at open[t+1] and held to close[t+2]."""
    from env_fixtures import flat_then

    # bars 0-2 at 100; then 101, 102 (up), 101, 100 (down), 101, 102 (up), 102, 102 (no move)
    env = make_env(flat_then([101, 102, 101, 100, 101, 102, 102, 102]), decision_every=2, episode_decisions=4)
    env.reset(options={"start": 2, "decisions": 4})
    rights, moves = [], []
    for text in (long(), long(), hold(), short()):  # up: right; down: wrong; held long into up: right; flat move
        *_, info = env.step(text)
        rights.append(info["direction_right"])
        moves.append(info["move_sign"])
    assert rights == [True, False, True, False]
    assert moves == [1, -1, 1, 0]
    env.reset(options={"start": 2, "decisions": 2})
    *_, info = env.step(hold())  # flat into a rise counts as wrong
    assert info["direction_right"] is False
    *_, info = env.step(call("get_candles", n=2))  # no decision yet: nothing to judge
    assert info["direction_right"] is None and info["move_sign"] is None
