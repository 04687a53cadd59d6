"""Information behind a tool: the price_only observation, get_changes, the information process reward, the
information statistics, and warm-start demonstrations that look before a random trade."""

from __future__ import annotations

import re

import numpy as np
import pytest
from env_fixtures import call, long

from r1trade.config import load_config
from r1trade.env.demonstrations import random_decision
from r1trade.env.information import accuracy_by_decision, information_use
from r1trade.env.parsing import ParseError, parse_tool_call
from r1trade.env.trading_env import make_envs
from r1trade.errors import ConfigError
from r1trade.models.chat import ChatTokens
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.warmstart import collect_demonstrations

PRICE_ONLY = ["env.observation=price_only", "env.episode_decisions=3", "env.max_tool_calls=4"]
CHANGES = re.compile(r"^Change: 1 bar [+-]\d+\.\d\d% \| 4 bars [+-]\d+\.\d\d% \| 24 bars [+-]\d+\.\d\d%$")


def test_the_price_only_observation_shows_no_change_or_indicator() -> None:
    config = load_config("smoke", PRICE_ONLY)
    (env,) = make_envs(config, 1)
    messages, _ = env.reset(seed=3)
    observation = messages[-1]["content"]
    assert observation.splitlines()[0].startswith("Decision 1/3 | ") and "Position flat" in observation
    assert "Change" not in observation and "%" not in observation.splitlines()[0]
    assert not [name for name in ("RSI", "SMA", "MACD", "ATR", "EMA", "BB", "VolZ") if name in observation]
    assert "get_changes()" in messages[0]["content"]  # the tool that now carries the changes is offered

    full = make_envs(load_config("smoke", ["env.episode_decisions=3"]), 1)[0]
    shown = full.reset(seed=3)[0][-1]["content"]
    assert "get_changes" not in full.system_prompt  # the full observation keeps its tools and text
    change_line = next(line for line in shown.splitlines() if line.startswith("Change:"))
    reply = env.step(call("get_changes"))[0][0]["content"]
    assert CHANGES.match(reply.splitlines()[0]) and reply.splitlines()[0] == change_line  # the same figures


def test_the_information_reward_pays_a_trade_that_looked_first_and_the_trade_lists_the_tools() -> None:
    config = load_config("smoke", [*PRICE_ONLY, "env.episode_decisions=3", "rewards.info_call=0.3"])
    (env,) = make_envs(config, 1)
    env.reset(seed=0)
    infos = [env.step(turn)[-1] for turn in (call("get_changes"), call("get_candles", n=2), call("get_portfolio"))]
    *_, trade = env.step(long(1.0))
    assert [info["reward_components"]["info_call"] for info in infos] == [0.0, 0.0, 0.0]
    assert trade["reward_components"]["info_call"] == pytest.approx(0.3)  # once, on the trade
    assert infos[0]["info_tools"] is None and trade["info_tools"] == ["get_changes", "get_candles"]
    assert infos[0]["info_tools_offered"] is None and trade["info_tools_offered"] == sorted(env.info_tools)
    *_, bare = env.step(long(1.0))  # the next decision trades without looking
    assert bare["info_tools"] == [] and bare["reward_components"]["info_call"] == 0.0
    for _ in range(4):  # the last decision only looks, until its budget runs out: a forced hold earns nothing
        *_, stalled = env.step(call("get_changes"))
    assert stalled["forced_hold"] and stalled["reward_components"]["info_call"] == 0.0
    assert stalled["info_tools"] == ["get_changes"] * 4


def test_information_use_by_hand() -> None:
    infos = [
        {"info_tools": ["get_changes"], "direction_right": True},
        {"info_tools": ["get_sentiment", "get_changes"], "direction_right": True},
        {"info_tools": ["get_sentiment"], "direction_right": False},
        {"info_tools": [], "info_tools_offered": ["get_candles", "get_changes", "get_sentiment"],
         "direction_right": True},
        {"info_tools": None, "direction_right": None},  # an information turn, not a decision
    ]
    use = information_use(infos)
    assert use["info_call_rate"] == 3 / 4
    assert use["tool_rates"] == {"get_candles": 0.0, "get_changes": 2 / 4, "get_sentiment": 2 / 4}
    assert use["accuracy_with_signal"] == 1.0 and use["accuracy_without_signal"] == 1 / 2
    assert information_use([]) == {
        "info_call_rate": 0.0, "tool_rates": {}, "accuracy_with_signal": None, "accuracy_without_signal": None
    }


def test_accuracy_by_decision_index_by_hand() -> None:
    infos = [
        {"decision_index": 0, "direction_right": True},
        {"decision_index": 1, "direction_right": True},
        {"decision_index": 0, "direction_right": False},
        {"decision_index": 1, "direction_right": True},
        {"decision_index": 2, "direction_right": False},
        {"decision_index": 2, "direction_right": None},  # an information turn
    ]
    assert accuracy_by_decision(infos) == {0: 0.5, 1: 1.0, 2: 0.0}


def test_random_decisions_look_zero_to_two_times_then_trade_restating_only_what_the_tools_returned() -> None:
    config = load_config("smoke", [*PRICE_ONLY, "env.episode_decisions=1"])
    rng = np.random.default_rng(0)
    looks, signal_seen = [], []
    for seed in range(60):
        (env,) = make_envs(config, 1)
        env.reset(seed=seed)
        turns = random_decision(env, rng, ["long", "short"], plain=True, max_info_calls=2)
        *information, trade = turns
        names = [parse_tool_call(turn, env.registry.parameters).name for turn in information]
        assert len(set(names)) == len(names) and set(names) <= env.info_tools
        replies = [env.step(turn)[0][0]["content"] for turn in information]
        reasoning = trade.split("\n", 1)[0]
        *facts, action = reasoning.split(". ")
        assert re.fullmatch(r"Action: (long|short)\.", action), reasoning
        assert len(facts) == len(names)  # one restated line per tool, in the order called, nothing else
        for name, fact, reply in zip(names, facts, replies, strict=True):
            if name == "get_changes":  # the restated changes are the ones the tool returned
                assert all(part in reply.splitlines()[0] for part in fact.split(", ")), (fact, reply)
            else:
                assert fact in reply.splitlines(), (fact, reply)
        *_, info = env.step(trade)
        assert info["parse_error"] is None and info["tool_error"] is None and info["info_tools"] == names
        looks.append(len(names))
        signal_seen.append("get_changes" in names)
    assert set(looks) == {0, 1, 2}
    assert 0.1 < np.mean(signal_seen) < 0.45  # 1/3 * 1/4 + 1/3 * 1/2 = 0.25 in expectation


def test_always_call_comes_first_and_restate_none_leaves_only_the_action() -> None:
    config = load_config("smoke", [*PRICE_ONLY, "env.episode_decisions=1"])
    rng = np.random.default_rng(0)
    for seed in range(20):
        (env,) = make_envs(config, 1)
        env.reset(seed=seed)
        *information, trade = random_decision(env, rng, ["long", "short"], plain=True, max_info_calls=2,
                                              always_call=["get_changes"], restate="none")
        names = [parse_tool_call(turn, env.registry.parameters).name for turn in information]
        assert names[0] == "get_changes" and names.count("get_changes") == 1 and 1 <= len(names) <= 3
        assert re.fullmatch(r"Action: (long|short)\.", trade.split("\n", 1)[0]), trade  # nothing restated


def test_an_always_call_that_is_no_information_tool_is_refused() -> None:
    config = load_config("smoke", [*PRICE_ONLY, "warmstart.policy=random", "warmstart.always_call=[place_order]"])
    with pytest.raises(ConfigError, match="always_call names 'place_order'"):
        collect_demonstrations(config, ChatTokens(build_tiny_tokenizer()), episodes=1, seed=0)


def test_warm_start_demonstrations_parse_as_valid_calls() -> None:
    config = load_config("smoke", [*PRICE_ONLY, "warmstart.policy=random", "warmstart.max_info_calls=2"])
    chat = ChatTokens(build_tiny_tokenizer())
    examples = collect_demonstrations(config, chat, episodes=6, seed=0)
    (env,) = make_envs(config, 1)
    turns = 0
    for example in examples:
        ids, mask = example["input_ids"], example["completion_mask"]
        spans, start = [], None
        for i, bit in enumerate([*mask, 0]):
            if bit and start is None:
                start = i
            elif not bit and start is not None:
                spans.append((start, i - 1))  # the last sampled token is the end of turn
                start = None
        for first, end in spans:
            text = chat.tokenizer.decode(ids[first:end])
            parsed = parse_tool_call(text, env.registry.parameters)
            assert not isinstance(parsed, ParseError), text
            turns += 1
    assert turns > 6 * 3  # more turns than decisions: information calls were demonstrated


def test_more_information_calls_than_the_call_budget_allows_is_refused() -> None:
    config = load_config("smoke", [*PRICE_ONLY, "env.max_tool_calls=2", "warmstart.policy=random",
                                   "warmstart.max_info_calls=2"])
    with pytest.raises(ConfigError, match="max_info_calls"):
        collect_demonstrations(config, ChatTokens(build_tiny_tokenizer()), episodes=1, seed=0)
