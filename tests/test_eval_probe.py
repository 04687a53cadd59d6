"""The held-out direction probe: its decision points read the market right, its probabilities are the model's."""

from __future__ import annotations

import doctest
import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from env_fixtures import call

from r1trade.config import load_config
from r1trade.env.trading_env import make_envs
from r1trade.errors import UsageError
from r1trade.eval import probe as probe_module
from r1trade.eval.action_stats import action_word_ids
from r1trade.eval.probe import CALL_PREFIX, ProbePoint, carried_out, discrimination, probe, probe_points
from r1trade.models.loading import build_tiny_model
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.rollout.backend import Generation
from r1trade.rollout.loop import RolloutEngine

PLANTED = ["data.synthetic.bars=1500", "env.prompt=compact"]


def test_points_sit_on_the_grid_end_with_action_and_know_the_next_move() -> None:
    config = load_config("planted_edge", PLANTED)
    tokenizer = build_tiny_tokenizer()
    points = probe_points(config, tokenizer, split="test", count=12)
    (env,) = make_envs(config, 1, "test")
    replay, every = env.replay, config.env.decision_every
    grid = replay.decision_grid
    assert len(points) == 12 and len({p.bar for p in points}) == 12
    for point in points:
        assert (point.bar - grid.first) % grid.every == 0 and point.bar >= config.env.warmup_bars
        move = replay.close[point.bar + every] - replay.open[point.bar + 1]  # held from the next open
        assert point.move_sign == int(np.sign(move))
        assert tokenizer.decode(point.input_ids).endswith("Action:")
        for side in ("long", "short"):  # the same context on through the stated side to the order's side
            assert tokenizer.decode(point.call_ids[side]) == tokenizer.decode(point.input_ids) + f" {side}.\n{CALL_PREFIX}"
    assert {p.move_sign for p in points} >= {1, -1}


def _brute_force(model, ids: list[int], word: list[int]) -> float:
    total, context = 0.0, list(ids)
    for token in word:
        total += float(torch.log_softmax(model(input_ids=torch.tensor([context])).logits[0, -1], dim=-1)[token])
        context.append(token)
    return math.exp(total)


@torch.no_grad()
def test_probabilities_are_the_models_whatever_the_batching_and_accuracies_follow_from_them() -> None:
    config = load_config("planted_edge", PLANTED)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=1)
    points = probe_points(config, tokenizer, split="test", count=5)
    # unchanged market, other lengths
    points.append(ProbePoint(bar=0, move_sign=0, input_ids=points[0].input_ids[:-3], call_ids=points[1].call_ids))
    one, batched = probe(model, tokenizer, points, batch_size=1), probe(model, tokenizer, points, batch_size=4)
    words = action_word_ids(tokenizer)
    side_ids = {side: tokenizer(side, add_special_tokens=False)["input_ids"] for side in ("long", "short")}
    follows = []
    for point, p, q, w in zip(points, one.probabilities, batched.probabilities, one.word_probabilities, strict=True):
        word = {action: _brute_force(model, point.input_ids, tokens) for action, tokens in words.items()}
        sides = {stated: {side: _brute_force(model, point.call_ids[stated], tokens) for side, tokens in side_ids.items()}
                 for stated in ("long", "short")}
        reference = carried_out(word, sides)
        for action in words:
            assert math.isclose(w[action], word[action], rel_tol=1e-4)
            assert math.isclose(p[action], reference[action], rel_tol=1e-4)
            assert math.isclose(q[action], reference[action], rel_tol=1e-4)
        agree = sum(word[s] * sides[s][s] / (sides[s]["long"] + sides[s]["short"]) for s in ("long", "short"))
        follows.append(agree / (word["long"] + word["short"]))
    assert math.isclose(one.call_follows_word, sum(follows) / 6, rel_tol=1e-4)
    right = {1: "long", -1: "short"}
    expected = [p[right[pt.move_sign]] / sum(p.values()) if pt.move_sign else 0.0
                for pt, p in zip(points, one.probabilities, strict=True)]
    greedy = [float(pt.move_sign != 0 and max(p, key=p.get) == right[pt.move_sign])
              for pt, p in zip(points, one.probabilities, strict=True)]
    assert math.isclose(one.expected_direction_accuracy, sum(expected) / 6, rel_tol=1e-9)
    assert one.greedy_direction_accuracy == sum(greedy) / 6
    assert one.points == 6 and math.isclose(batched.long_share, one.long_share, rel_tol=1e-4)
    assert one.up_share == sum(pt.move_sign > 0 for pt in points) / 6
    p_long = [p["long"] / sum(p.values()) for p in one.probabilities]
    rose = [q for q, pt in zip(p_long, points, strict=True) if pt.move_sign > 0]
    fell = [q for q, pt in zip(p_long, points, strict=True) if pt.move_sign < 0]
    assert math.isclose(one.discrimination, sum(rose) / len(rose) - sum(fell) / len(fell), rel_tol=1e-9)


def test_the_call_carries_out_the_direction_whatever_the_stated_word() -> None:
    # A policy that states "long" or "short" at random (0.45 each, hold 0.1) but whose call goes long after "long"
    # with P 0.2 and after "short" with P 0.8: it goes long with 0.45 * 0.2 + 0.45 * 0.8 = 0.45, short 0.45.
    p = carried_out({"long": 0.45, "short": 0.45, "hold": 0.1, "close": 0.0},
                    {"long": {"long": 0.2, "short": 0.8}, "short": {"long": 0.8, "short": 0.2}})
    assert all(math.isclose(p[a], q) for a, q in {"long": 0.45, "short": 0.45, "hold": 0.1, "close": 0.0}.items())
    # The side's probabilities are renormalised over long and short: 0.3 and 0.1 read as 0.75 and 0.25.
    p = carried_out({"long": 1.0, "short": 0.0, "hold": 0.0, "close": 0.0},
                    {"long": {"long": 0.3, "short": 0.1}, "short": {"long": 0.5, "short": 0.5}})
    assert math.isclose(p["long"], 0.75) and math.isclose(p["short"], 0.25)
    assert doctest.testmod(probe_module).failed == 0


def test_discrimination_is_zero_for_a_policy_blind_to_the_market_whatever_its_lean() -> None:
    # Always 90 % long: P(long) 0.9 where the market rose and where it fell -> 0, though expected accuracy on a split
    # that rose 3 times in 4 is 0.75 * 0.9 + 0.25 * 0.1 = 0.7.
    blind = [{"long": 0.9, "short": 0.1, "hold": 0.0, "close": 0.0}] * 4
    assert discrimination(blind, [1, 1, 1, -1]) == 0.0
    # Reads the market: P(long) 0.8, 0.6 where it rose (mean 0.7), 0.2 where it fell -> 0.5; hold and close share
    # the mass but P(long) is renormalised over the four words (0.3 / 0.6 = 0.5 at the last point).
    reads = [{"long": 0.8, "short": 0.2}, {"long": 0.6, "short": 0.4}, {"long": 0.2, "short": 0.8},
             {"long": 0.3, "short": 0.1, "hold": 0.2}]
    assert math.isclose(discrimination(reads, [1, 1, -1, 0]), 0.5)
    assert math.isclose(discrimination(reads, [1, 1, -1, -1]), 0.7 - 0.35)
    assert discrimination(reads, [1, 1, 1, 0]) is None  # no fall: undefined


class ScriptedBackend:
    """Generates each conversation's turns from a script, as token ids the policy 'sampled' (the engine's real loop
    steps the env and builds the contexts around them)."""

    def __init__(self, tokenizer, script) -> None:
        self.tokenizer, self.script, self.turns = tokenizer, script, {}

    @contextmanager
    def session(self):
        yield

    def generate(self, prompts, generator):
        out = []
        for prompt in prompts:
            turn = self.turns.get(prompt.key, 0)
            self.turns[prompt.key] = turn + 1
            ids = tuple(self.tokenizer(self.script(prompt.key)[turn], add_special_tokens=False)["input_ids"])
            out.append(Generation(ids, (0.0,) * len(ids), (1,) * len(ids), stopped=True))
        return out


def play_scripted(monkeypatch, tokenizer, script) -> None:
    """Make the probe's rollout engine generate from `script` (key -> the conversation's turns)."""

    def scripted_engine(model, tokenizer_, sampling) -> RolloutEngine:
        return RolloutEngine(ScriptedBackend(tokenizer, script), tokenizer_)

    monkeypatch.setattr(probe_module, "transformers_engine", scripted_engine)


SIGNAL_SCRIPT = [call("get_changes"),
                 call("place_order", "Up. Action: long.\n", side="long", size=1.0, view="bullish")]
BLIND_SCRIPT = [call("place_order", "Action: short.\n", side="short", size=1.0, view="bearish")]


def test_a_price_only_probe_reads_the_policy_after_its_own_tool_turns(monkeypatch) -> None:
    """Even points call get_changes first, odd ones trade at once: each point's context is that episode up to its
    trade turn's `Action:`, and the information figures count who looked."""
    config = load_config("planted_edge", [*PLANTED, "env.observation=price_only", "env.episode_decisions=1"])
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=1)

    play_scripted(monkeypatch, tokenizer, lambda key: SIGNAL_SCRIPT if key % 2 == 0 else BLIND_SCRIPT)
    points = probe_points(config, tokenizer, split="test", count=6, policy=model)
    (env,) = make_envs(config, 1, "test")
    replay, every = env.replay, config.env.decision_every
    assert len(points) == 6
    for k, point in enumerate(points):
        text = tokenizer.decode(point.input_ids)
        move = replay.close[point.bar + every] - replay.open[point.bar + 1]
        assert point.move_sign == int(np.sign(move))
        assert point.info_tools == (["get_changes"] if k % 2 == 0 else [])
        assert ("Change: 1 bar" in text) == (k % 2 == 0)  # get_changes' answer lies in the context only where it was called
        assert text.endswith("Up. Action:" if k % 2 == 0 else "Action:")
        for side in ("long", "short"):
            assert tokenizer.decode(point.call_ids[side]) == text + f" {side}.\n{CALL_PREFIX}"

    result = probe(model, tokenizer, points)
    expected = [p[{1: "long", -1: "short"}[pt.move_sign]] / sum(p.values()) if pt.move_sign else 0.0
                for pt, p in zip(points, result.probabilities, strict=True)]
    assert result.info_call_rate == 0.5 and result.signal_call_rate == 0.5
    assert math.isclose(result.expected_accuracy_with_signal, np.mean(expected[0::2]), rel_tol=1e-9)
    assert math.isclose(result.expected_accuracy_without_signal, np.mean(expected[1::2]), rel_tol=1e-9)
    assert result.expected_accuracy_by_decision == {0: result.expected_direction_accuracy}
    with pytest.raises(UsageError, match="policy's own turns"):
        probe_points(config, tokenizer, count=2)


def test_a_multi_decision_probe_reads_every_decision_of_the_policys_windows(monkeypatch) -> None:
    """Windows of two decisions: the first looks at get_changes and goes long, the second goes short at once. A
    point per decision, the second's context holding the whole first decision, and accuracy per decision index."""
    config = load_config("planted_edge", [*PLANTED, "env.observation=price_only", "env.episode_decisions=2"])
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=1)

    play_scripted(monkeypatch, tokenizer, lambda key: SIGNAL_SCRIPT + BLIND_SCRIPT)
    points = probe_points(config, tokenizer, split="test", count=6, policy=model)
    (env,) = make_envs(config, 1, "test")
    replay, every = env.replay, config.env.decision_every
    assert [p.decision for p in points] == [0, 1] * 3
    for first, second in zip(points[0::2], points[1::2], strict=True):
        assert second.bar == first.bar + every and first.info_tools == ["get_changes"] and second.info_tools == []
        assert second.input_ids[: len(first.input_ids)] == first.input_ids  # the first decision lies in its context
        assert tokenizer.decode(second.input_ids).endswith("Action:")
        for point in (first, second):
            move = replay.close[point.bar + every] - replay.open[point.bar + 1]
            assert point.move_sign == int(np.sign(move))
    result = probe(model, tokenizer, points)
    expected = [p[{1: "long", -1: "short"}[pt.move_sign]] / sum(p.values()) if pt.move_sign else 0.0
                for pt, p in zip(points, result.probabilities, strict=True)]
    assert result.expected_accuracy_by_decision.keys() == {0, 1}
    assert math.isclose(result.expected_accuracy_by_decision[0], np.mean(expected[0::2]), rel_tol=1e-9)
    assert math.isclose(result.expected_accuracy_by_decision[1], np.mean(expected[1::2]), rel_tol=1e-9)


def test_information_figures_by_hand() -> None:
    # three points: get_changes then right at 0.8; get_candles, falling market, P(short) 0.7; nothing, 0.5
    points = [ProbePoint(0, 1, [], {}, ["get_changes"]), ProbePoint(0, -1, [], {}, ["get_candles"]),
              ProbePoint(0, 1, [], {}, [])]
    calls = [{"long": 0.8, "short": 0.2}, {"long": 0.3, "short": 0.7}, {"long": 0.5, "short": 0.5}]
    figures = probe_module._information(points, calls)
    assert math.isclose(figures["info_call_rate"], 2 / 3) and math.isclose(figures["signal_call_rate"], 1 / 3)
    assert math.isclose(figures["expected_accuracy_with_signal"], 0.8)
    assert math.isclose(figures["expected_accuracy_without_signal"], (0.7 + 0.5) / 2)
    points[0].info_tools = None  # a probe without tool turns has no information figures
    assert set(probe_module._information(points, calls).values()) == {None}
