"""Where a trade turn chooses its side: the token where the tool call's side argument parts between long and
short on the tiny tokenizer and on one that spells each as one token, and the side token of each turn of a
trajectory; the batch's side mask; and the renormalised entropy of the side choice worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.models.scoring import choice_entropy
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.rl.batch import collate
from r1trade.rollout.decisions import side_positions, side_tokens
from r1trade.rollout.loop import Segment, Trajectory, Turn


class WholeWords:
    """A tokenizer that spells `{"side": "long"}` and `{"side": "short"}` with the side as one token (as SmolLM2's
    does: 5480 and 15539)."""

    CALLS = {'{"side": "long"}': [90, 476, 5480, 1002], '{"side": "short"}': [90, 476, 15539, 1002]}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self.CALLS[text]}


def test_the_side_argument_parts_at_one_token() -> None:
    # the tiny tokenizer spells the values "l" "on" "g" (78 264 73) and "sh" "or" "t" (292 319 86)
    assert side_tokens(build_tiny_tokenizer()) == [78, 292]
    assert side_tokens(WholeWords()) == [5480, 15539]


def call(side: str) -> str:
    return f'<tool_call>{{"name": "place_order", "arguments": {{"side": "{side}", "size": 1.0}}}}</tool_call>'


def turn_of(tokenizer, segment: Segment, text: str, action: dict) -> Turn:
    """Append `text` to `segment` as sampled tokens and return its turn."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = len(segment.token_ids)
    segment.extend(ids, sampled=True)
    info = {"parse_error": None, "tool_error": None, "action": action}
    return Turn(0, start, start + len(ids), text, 0.0, False, info)


def test_each_long_or_short_turn_has_its_side_token_and_no_other_turn_has_one() -> None:
    tokenizer = build_tiny_tokenizer()
    long, short = ({"name": "place_order", "arguments": {"side": side}} for side in ("long", "short"))
    segment = Segment()
    turns = [
        turn_of(tokenizer, segment, f"Action: long.\n{call('long')}", long),
        turn_of(tokenizer, segment, '<tool_call>{"name": "get_changes", "arguments": {}}</tool_call>',
                {"name": "get_changes", "arguments": {}}),
        turn_of(tokenizer, segment, "Action: hold.", {"name": "hold", "arguments": {}}),
        # it names long, then executes short: the executed side is the one that counts
        turn_of(tokenizer, segment, f"Action: long.\n{call('short')}", short),
    ]
    trajectory = Trajectory(seed=0, group=0, segments=[segment], turns=turns)
    found = side_positions(trajectory, tokenizer)
    assert [segment.token_ids[token] for _, token in found] == [78, 292]  # "l" of long, "sh" of short
    for (_, token), turn in zip(found, (turns[0], turns[3]), strict=True):
        assert turn.start < token < turn.end
        before = tokenizer.decode(segment.token_ids[turn.start : token])
        assert before.startswith("Action: long.") and before.endswith('{"side": "')  # past the Action word

    batch = collate([trajectory], pad_id=0, sides=[found])
    assert batch.side_mask is not None and batch.side_mask.sum() == 2
    assert [int(i) for i in batch.side_mask[0].nonzero().squeeze(1)] == [token for _, token in found]
    assert collate([trajectory], pad_id=0).side_mask is None


class Head(torch.nn.Module):
    """A causal LM stand-in whose output embedding is a given matrix."""

    def __init__(self, weight: list[list[float]]) -> None:
        super().__init__()
        self.head = torch.nn.Linear(2, len(weight), bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor(weight))

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.head


@pytest.mark.parametrize(("temperature", "expected"), [
    # logits 0 and ln 3 over tokens 0 and 1 (token 2's 5.0 left out): p = 1/4, 3/4;
    # H = 1/4 ln 4 + 3/4 ln(4/3) = 0.3466 + 0.2158 = 0.5623
    (1.0, 0.5623),
    # at temperature 2 the logits halve: p = 1 / (1 + sqrt 3) = 0.3660 and 0.6340;
    # H = 0.3660 ln(1 / 0.3660) + 0.6340 ln(1 / 0.6340) = 0.3679 + 0.2889 = 0.6568
    (2.0, 0.6568),
])
def test_the_side_entropy_by_hand(temperature: float, expected: float) -> None:
    model = Head([[0.0, 0.0], [math.log(3), 0.0], [5.0, 0.0]])
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])  # (1, 3, 2)
    mask = torch.tensor([[0.0, 1.0, 0.0]])  # token 1, drawn from state 0
    entropy = choice_entropy(model, hidden, mask, [0, 1], temperature)
    assert entropy.shape == (1, 3)
    assert entropy[0, 1].item() == pytest.approx(expected, abs=1e-4)
    assert entropy[0, 0] == 0 and entropy[0, 2] == 0
