"""The format-only warm start: random trade demonstrations that claim nothing, and how a policy's actions are read."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from r1trade.config import load_config
from r1trade.env.demonstrations import ACTION_PROMPT, observed_changes, random_turn
from r1trade.env.trading_env import make_envs
from r1trade.errors import ConfigError
from r1trade.models.chat import ChatTokens
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.rollout.decisions import classify, decision_position
from r1trade.rollout.loop import Turn
from r1trade.warmstart import collect_demonstrations

CHANGE = r"(\d+) bars ([+-]\d+\.\d\d%|n/a)"
LINE = re.compile(rf"^{CHANGE}, {CHANGE}\. Action: (long|short|hold|close)\.$")


def play_random(config, decisions: int, seed: int = 0):
    """Random demonstration turns through a real env: (observation, turn text, step info) per decision."""
    (env,) = make_envs(config, 1)
    rng = np.random.default_rng(seed)
    messages, _ = env.reset(seed=seed)
    played = []
    for _ in range(decisions):
        observation = messages[-1]["content"]
        text = random_turn(env, rng)
        messages, _, terminated, truncated, info = env.step(text)
        played.append((observation, text, info))
        if terminated or truncated:
            messages, _ = env.reset(seed=seed + len(played))
    return played


def test_the_reasoning_restates_only_what_the_observation_shows() -> None:
    config = load_config("smoke", ["env.episode_decisions=4"])
    for observation, text, _ in play_random(config, 24):
        reasoning, call = text.split("\n", 1)
        match = LINE.match(reasoning)
        assert match, reasoning
        every = config.env.decision_every
        assert (int(match[1]), int(match[3])) == (every, 6 * every)
        # both figures appear in the observation's "Change:" line exactly as written there
        change_line = next(line for line in observation.splitlines() if line.startswith("Change:"))
        assert f"{every} bars {match[2]}" in change_line and f"{6 * every} bars {match[4]}" in change_line
        assert call.startswith("<tool_call>") and call.endswith("</tool_call>")


def test_every_random_call_is_accepted_and_does_what_its_line_says() -> None:
    config = load_config("smoke", ["env.episode_decisions=4"])
    played = play_random(config, 80)
    actions = Counter()
    for _, text, info in played:
        assert info["parse_error"] is None and info["tool_error"] is None, text
        said = LINE.match(text.split("\n", 1)[0])[5]
        turn = Turn(0, 0, 1, text, 0.0, False, info)
        assert classify(turn) == said
        actions[said] += 1
    # uniform over the four actions: each within 4 standard deviations of 80 / 4 = 20 (std sqrt(80 * 3/16) = 3.9)
    assert set(actions) == {"long", "short", "hold", "close"}
    assert all(abs(n - 20) < 4 * math.sqrt(80 * 3 / 16) for n in actions.values()), actions


def test_without_shorting_random_demonstrations_never_short() -> None:
    config = load_config("smoke", ["env.episode_decisions=4", "env.allow_short=false"])
    said = {LINE.match(text.split("\n", 1)[0])[5] for _, text, _ in play_random(config, 40)}
    assert said == {"long", "hold", "close"}


def test_the_policy_switch_picks_the_demonstrations() -> None:
    tokenizer = build_tiny_tokenizer()
    chat = ChatTokens(tokenizer)
    config = load_config("smoke", ["warmstart.policy=random"])
    examples = collect_demonstrations(config, chat, episodes=2, seed=0)
    text = tokenizer.decode([i for e in examples for i, m in zip(e["input_ids"], e["completion_mask"]) if m])
    assert text.count(ACTION_PROMPT) >= 2
    rule = collect_demonstrations(load_config("smoke"), chat, episodes=2, seed=0)
    rule_text = tokenizer.decode([i for e in rule for i, m in zip(e["input_ids"], e["completion_mask"]) if m])
    assert ACTION_PROMPT not in rule_text
    plain = load_config("smoke", ["warmstart.policy=random", "warmstart.orders=plain", "warmstart.actions=[long]"])
    examples = collect_demonstrations(plain, chat, episodes=2, seed=0)
    plain_text = tokenizer.decode([i for e in examples for i, m in zip(e["input_ids"], e["completion_mask"]) if m])
    assert plain_text.count('"size": 1.0') >= 2 and "stop_loss" not in plain_text and "take_profit" not in plain_text


def test_observed_changes_read_the_replay_at_the_decision_bar() -> None:
    config = load_config("smoke")
    (env,) = make_envs(config, 1)
    env.reset(seed=3)
    every = config.env.decision_every
    expected = env.replay.change_pct(env.bar, every)
    assert observed_changes(env).startswith(f"{every} bars {expected:+.2f}%")


def test_the_decision_token_follows_action_or_is_the_first() -> None:
    tokenizer = build_tiny_tokenizer()
    ids = tokenizer("4 bars +1.00%, 24 bars -2.00%. Action: hold.", add_special_tokens=False)["input_ids"]
    k = decision_position(tokenizer, ids)
    assert tokenizer.decode(ids[:k]).endswith("Action:") and tokenizer.decode(ids[k:]).startswith(" hold")
    other = tokenizer("Uptrend: go long.", add_special_tokens=False)["input_ids"]
    assert decision_position(tokenizer, other) == 0
    malformed = Turn(0, 0, 1, "x", 0.0, False, {"parse_error": "no call", "tool_error": None, "action": None})
    info_call = Turn(0, 0, 1, "x", 0.0, False, {"parse_error": None, "tool_error": None,
                                                  "action": {"name": "get_candles", "arguments": {}}})
    assert classify(malformed) == "malformed" and classify(info_call) == "info"


def test_warmstart_actions_narrow_the_random_choice() -> None:
    config = load_config("smoke", ["env.episode_decisions=4"])
    (env,) = make_envs(config, 1)
    rng = np.random.default_rng(3)
    env.reset(seed=3)
    said = Counter()
    for _ in range(60):
        text = random_turn(env, rng, ["long", "short"])
        said[LINE.match(text.split("\n", 1)[0])[5]] += 1
        _, _, terminated, truncated, _ = env.step(text)
        if terminated or truncated:
            env.reset(seed=4)
    assert set(said) == {"long", "short"} and min(said.values()) >= 20  # both drawn, about equally (60 draws)
    no_shorts = load_config("smoke", ["env.allow_short=false"])
    (env,) = make_envs(no_shorts, 1)
    env.reset(seed=0)
    try:
        random_turn(env, rng, ["short"])
    except ConfigError as error:
        assert "warmstart.actions" in str(error)
    else:
        raise AssertionError("a choice of nothing must be refused")


def test_plain_orders_vary_only_the_direction() -> None:
    config = load_config("smoke", ["env.episode_decisions=4", "env.max_position_frac=0.8"])
    (env,) = make_envs(config, 1)
    rng = np.random.default_rng(5)
    env.reset(seed=5)
    calls = []
    for _ in range(20):
        text = random_turn(env, rng, ["long", "short"], plain=True)
        _, _, terminated, truncated, info = env.step(text)
        assert info["parse_error"] is None and info["tool_error"] is None, text
        calls.append(info["action"]["arguments"])
        if terminated or truncated:
            env.reset(seed=6)
    sides = {"long": "bullish", "short": "bearish"}
    assert all(call == {"side": call["side"], "size": 0.8, "view": sides[call["side"]]} for call in calls), calls
    assert {call["side"] for call in calls} == {"long", "short"}
