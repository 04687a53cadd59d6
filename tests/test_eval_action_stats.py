"""Reading a policy's decision: whole action words, and the direction accuracy it expects to get."""

from __future__ import annotations

import math

import torch

from r1trade.env.demonstrations import TRADE_ACTIONS
from r1trade.eval.action_stats import _decision_token, word_logprob
from r1trade.models.loading import build_tiny_model
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.rollout.decisions import action_word_ids
from r1trade.rollout.loop import Segment, Trajectory, Turn


def _tiny():
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, seed=3), tokenizer


def _sequence_logprob(model, prefix: list[int], ids: list[int]) -> float:
    """log P(ids | prefix), one token at a time: the reference for `word_logprob`."""
    total, context = 0.0, list(prefix)
    for token in ids:
        logits = model(input_ids=torch.tensor([context])).logits[0, -1]
        total += float(torch.log_softmax(logits, dim=-1)[token])
        context.append(token)
    return total


@torch.no_grad()
def test_action_words_are_scored_as_whole_token_sequences() -> None:
    model, tokenizer = _tiny()
    words = action_word_ids(tokenizer)
    assert len(words["long"]) > 1 and words["long"][0] == words["short"][0]  # the tiny tokenizer splits them
    prefix = tokenizer("4 bars +1.00%. Action:", add_special_tokens=False)["input_ids"]
    first = torch.log_softmax(model(input_ids=torch.tensor([prefix])).logits[0, -1], dim=-1)
    for action, ids in words.items():
        got = word_logprob(model, torch.tensor([prefix]), first, ids, 1.0)
        assert math.isclose(got, _sequence_logprob(model, prefix, ids), rel_tol=1e-4, abs_tol=1e-5), action
    # disjoint continuations: their probabilities cannot add up to more than 1 (first tokens alone would: 2 x P(" "))
    total = sum(math.exp(word_logprob(model, torch.tensor([prefix]), first, ids, 1.0)) for ids in words.values())
    assert total <= 1.0 + 1e-6


@torch.no_grad()
def test_expected_direction_accuracy_is_the_probability_of_the_right_side() -> None:
    model, tokenizer = _tiny()
    text = "4 bars +1.00%. Action: long."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    segment = Segment()
    segment.extend(ids, sampled=True)
    for move, right in ((1, "long"), (-1, "short"), (0, None)):
        turn = Turn(0, 0, len(ids), text, 0.0, False, {
            "parse_error": None, "tool_error": None, "move_sign": move, "direction_right": move == 1,
            "action": {"name": "place_order", "arguments": {"side": "long"}},
        })
        trajectory = Trajectory(seed=0, group=0, segments=[segment], turns=[turn])
        record = _decision_token(model, tokenizer, trajectory, turn, action_word_ids(tokenizer), 1.0)
        p = record["probabilities"]
        assert record["after_action_prompt"] and set(p) == set(TRADE_ACTIONS)
        expected = p[right] / sum(p.values()) if right else 0.0  # an unchanged market: no side is right
        assert math.isclose(record["expected_direction_accuracy"], expected, rel_tol=1e-9)
        assert record["direction_right"] is (move == 1) and record["move_sign"] == move
