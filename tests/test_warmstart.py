"""Warm start: rule demonstrations in the exact rollout token format, and a short SFT run through the CLI."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from r1trade import warmstart
from r1trade.cli import main
from r1trade.config import ModelConfig, load_config
from r1trade.env.demonstrations import demonstration_turn
from r1trade.env.parsing import parse_tool_call
from r1trade.env.trading_env import make_envs
from r1trade.errors import ConfigError
from r1trade.models import loading
from r1trade.models.chat import ChatTokens
from r1trade.models.loading import load_agent_models
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.warmstart import check_turns_fit, collect_demonstrations, longest_turn, warm_start_seed


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
    assert len(examples) == 2  # one example per episode: the system prompt is paid for once
    (env,) = make_envs(config, 1)
    turns = 0
    for example in examples:
        ids, mask = example["input_ids"], example["completion_mask"]
        assert len(ids) == len(mask) and mask[0] == 0 and mask[-1] == 0
        runs = [(start, end) for start, end in _runs_of_ones(mask)]
        turns += len(runs)
        for start, end in runs:
            turn = tokenizer.decode(ids[start:end], skip_special_tokens=False)
            assert turn.endswith("<|im_end|>")
            parsed = parse_tool_call(turn.removesuffix("<|im_end|>"), env.registry.parameters)
            assert not hasattr(parsed, "message"), parsed
            before = tokenizer.decode(ids[:start], skip_special_tokens=False)
            assert before.endswith("<|im_start|>assistant\n")  # each turn follows a generation prompt
        observations = tokenizer.decode(ids[runs[0][1] : runs[1][0]], skip_special_tokens=False)
        assert "Decision 2/" in observations  # the next observation sits between turns, as mask 0
    assert turns == 2 * config.env.episode_decisions  # one turn per decision


def _runs_of_ones(mask: list[int]):
    start = None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            yield start, i
            start = None


def test_a_warm_start_draw_other_than_0_plays_other_demonstrations():
    assert doctest.testmod(warmstart).failed == 0  # draw 0 is the seed itself: configs without a draw are unchanged
    config = load_config("demo_tools")
    chat = ChatTokens(build_tiny_tokenizer())
    own = collect_demonstrations(config, chat, episodes=4, seed=warm_start_seed(3, 0))
    assert own == collect_demonstrations(config, chat, episodes=4, seed=3)
    assert collect_demonstrations(config, chat, episodes=4, seed=warm_start_seed(3, 1)) != own


def test_the_longest_turn_counts_sampled_tokens_up_to_the_call_not_the_end_of_turn():
    examples = [{"completion_mask": [0, 1, 1, 1, 0, 0, 1, 1]}, {"completion_mask": [0, 0, 1, 1, 1, 1, 1, 0]}]
    assert longest_turn(examples) == 4  # the 5-token run is 4 tokens of turn and the end-of-turn token
    check_turns_fit(examples, 4)
    with pytest.raises(ConfigError, match="take up to 4 tokens but rollout.max_new_tokens is 3"):
        check_turns_fit(examples, 3)


def test_warmstart_refuses_demonstrations_the_rollout_would_cut_off(capsys, tmp_path: Path):
    # the tiny tokenizer spells a trade call in ~106 tokens; smoke.yaml decodes 32 a turn
    code = main(["warmstart", "--config", "smoke", "--set", f"output_dir={tmp_path}", "--set", "warmstart.episodes=4"])
    err = capsys.readouterr().err
    assert code != 0 and "rollout.max_new_tokens is 32" in err and "Traceback" not in err
    assert not (tmp_path / "smoke-warmstart" / "model").exists()


@pytest.mark.parametrize("lora_auto", [False, True])
def test_warmstart_cli_writes_a_model_that_loads(capsys, tmp_path: Path, monkeypatch, lora_auto: bool):
    extra = []
    if lora_auto:  # bfloat16 hardware and LoRA: the warm start still loads and saves float32 weights
        monkeypatch.setattr(loading, "native_bfloat16", lambda model_config: True)
        extra = ["--set", "model.lora.enabled=true", "--set", "model.dtype=auto", "--set", "warmstart.draw=1"]
    runs = tmp_path / "a[/b]"  # a folder whose name reads as Rich markup is printed as it is
    code = main(["warmstart", "--config", "smoke", "--set", f"output_dir={runs}",
                 "--set", "rollout.max_new_tokens=128",
                 "--set", "warmstart.max_steps=2", "--set", "warmstart.episodes=1", "--set", "env.episode_decisions=2",
                 *extra])
    assert code == 0
    model_dir = runs / "smoke-warmstart" / "model"
    assert "".join(f"warm-started model: {model_dir}".split()) in "".join(capsys.readouterr().out.split())
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "float32"
    log = json.loads((runs / "smoke-warmstart" / "warmstart.json").read_text())
    assert log["examples"] == 1 and log["log"]  # one two-decision episode
    assert log["seed"] == (warm_start_seed(0, 1) if lora_auto else 0)  # the draw seeds the demonstrations and SFT
    models = load_agent_models(ModelConfig(name_or_path=str(model_dir), lora={"enabled": False}), seed=0)
    assert models.tokenizer.chat_template
