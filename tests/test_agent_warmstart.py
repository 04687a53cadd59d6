"""Warm start: rule demonstrations in the exact rollout token format, and a short SFT run through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1trade.agent.model import build_tiny_tokenizer, load_agent_models
from r1trade.agent.rollout import ChatTokens
from r1trade.agent.warmstart import collect_demonstrations, demonstration_turn
from r1trade.cli import main
from r1trade.config import ModelConfig, load_config
from r1trade.env.parsing import parse_tool_call
from r1trade.env.trading_env import make_envs


def env_at(change_pct: float, rsi: float, *, units: float = 0.0, allow_short: bool = True):
    """A real env whose market facts the rule reads are pinned to the given values."""
    config = load_config("smoke", [f"env.allow_short={str(allow_short).lower()}"])
    (env,) = make_envs(config, 1)
    env.reset(seed=0)
    env.replay = type("Replay", (), {"change_pct": lambda self, bar, n: change_pct,
                                     "feature_values": {"rsi_14": [rsi] * 100_000}})()
    env._state.portfolio.units = units
    return env


@pytest.mark.parametrize(
    ("change", "rsi", "units", "short", "expected"),
    [
        (2.0, 55, 0.0, True, ("place_order", "long", "bullish")),
        (2.0, 75, 0.0, True, ("hold", None, "neutral")),  # overbought: no chase
        (-1.5, 45, 0.0, True, ("place_order", "short", "bearish")),
        (-1.5, 45, 0.0, False, ("hold", None, "neutral")),  # shorting disabled
        (-1.5, 25, 0.0, True, ("hold", None, "neutral")),  # oversold: no short
        (0.1, 50, 0.3, True, ("close_position", None, "neutral")),  # faded trend with a position
        (0.5, 50, 0.0, True, ("hold", None, "neutral")),
    ],
)
def test_demonstration_rule(change, rsi, units, short, expected):
    text = demonstration_turn(env_at(change, rsi, units=units, allow_short=short))
    name, side, view = expected
    call = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
    assert call["name"] == name and call["arguments"].get("side") == side and call["arguments"]["view"] == view
    assert f"24 bars {change:+.2f}%" in text


def test_demonstrations_are_valid_calls_in_the_rollout_token_format():
    config = load_config("smoke")
    tokenizer = build_tiny_tokenizer()
    chat = ChatTokens(tokenizer)
    examples = collect_demonstrations(config, chat, episodes=2, seed=0)
    assert len(examples) == 2 * config.env.episode_decisions  # one turn per decision
    (env,) = make_envs(config, 1)
    for example in examples:
        ids, mask = example["input_ids"], example["completion_mask"]
        assert len(ids) == len(mask) and mask[0] == 0
        turn = tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
        assert turn.endswith("<|im_end|>")
        parsed = parse_tool_call(turn.removesuffix("<|im_end|>"), env.registry.parameters)
        assert not hasattr(parsed, "message"), parsed
        prompt = tokenizer.decode(ids[: mask.index(1)], skip_special_tokens=False)
        assert prompt.endswith("<|im_start|>assistant\n")


def test_warmstart_cli_writes_a_model_that_loads(capsys, tmp_path: Path):
    code = main(["warmstart", "--config", "smoke", "--set", f"output_dir={tmp_path}",
                 "--set", "warmstart.max_steps=2", "--set", "warmstart.episodes=1", "--set", "env.episode_decisions=2"])
    assert code == 0
    model_dir = tmp_path / "smoke-warmstart" / "model"
    log = json.loads((tmp_path / "smoke-warmstart" / "warmstart.json").read_text())
    assert log["examples"] == 2 and log["log"]
    models = load_agent_models(ModelConfig(name_or_path=str(model_dir), lora={"enabled": False}), seed=0)
    assert models.tokenizer.chat_template
