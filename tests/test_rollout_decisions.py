"""Where a trade turn names its side: the tokens where the Action word and the tool call's side argument part
between long and short, on the tiny tokenizer and on one that spells each side as one token; those tokens in each
turn of a trajectory; the batch's side choices; and the renormalised probability of each choice worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.models.scoring import choice_probability
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.rl.batch import collate
from r1trade.rollout.decisions import SideChoice, side_choices, side_positions
from r1trade.rollout.loop import Segment, Trajectory, Turn


class WholeWords:
    """A tokenizer that spells each side as one token, as SmolLM2's does: ` long` and ` short` after `Action:`
    (986 and 1890), `long` and `short` in the call (5480 and 15539)."""

    TOKENS = {16521: "Action", 42: ":", 986: " long", 1890: " short", 30: ".",
              90: '{"', 476: 'side": "', 5480: "long", 15539: "short", 1002: '"}'}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids, rest = [], text
        while rest:
            token = max((t for t, s in self.TOKENS.items() if rest.startswith(s)), key=lambda t: len(self.TOKENS[t]))
            ids.append(token)
            rest = rest[len(self.TOKENS[token]) :]
        return {"input_ids": ids}

    def decode(self, ids: list[int]) -> str:
        return "".join(self.TOKENS[i] for i in ids)


def test_each_place_that_names_the_side_parts_at_one_token() -> None:
    # the tiny tokenizer spells both values "l" "on" "g" (78 264 73) and "sh" "or" "t" (292 319 86), after
    # "Action:" " " in the Action line
    assert side_choices(build_tiny_tokenizer()) == [
        SideChoice("action_word", "Action: ", (78, 292)), SideChoice("side_argument", '{"side": "', (78, 292)),
    ]
    assert side_choices(WholeWords()) == [
        SideChoice("action_word", "Action:", (986, 1890)), SideChoice("side_argument", '{"side": "', (5480, 15539)),
    ]


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
    found = side_positions(trajectory, side_choices(tokenizer), tokenizer)
    # per long or short turn: the Action word's "l", then the call's "l" or "sh"
    assert [(segment.token_ids[token], place) for _, token, place in found] == [(78, 0), (78, 1), (78, 0), (292, 1)]
    for (_, word, _), (_, side, _), turn in zip(found[::2], found[1::2], (turns[0], turns[3]), strict=True):
        assert turn.start < word < side < turn.end
        assert tokenizer.decode(segment.token_ids[turn.start : word]) == "Action: "
        before = tokenizer.decode(segment.token_ids[turn.start : side])
        assert before.startswith("Action: long.") and before.endswith('{"side": "')  # past the Action word

    batch = collate([trajectory], pad_id=0, sides=[found])
    assert batch.side_choice is not None and int((batch.side_choice >= 0).sum()) == 4
    assert [int(i) for i in (batch.side_choice[0] >= 0).nonzero().squeeze(1)] == [token for _, token, _ in found]
    assert [int(batch.side_choice[0, token]) for _, token, _ in found] == [0, 1, 0, 1]
    assert collate([trajectory], pad_id=0).side_choice is None


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
    # token 1 chooses between tokens 0 and 1, whose logits from state 0 are 0 and ln 3 (token 2's 5.0 left out):
    # P(token 0) = 1 / (1 + 3) = 0.25. Token 3 chooses between tokens 2 and 0 from state 2, logits 5 and 0:
    # P(token 2) = 1 / (1 + e^-5) = 0.99331.
    (1.0, (0.25, 0.99331)),
    # at temperature 2 the logits halve: 1 / (1 + sqrt 3) = 0.36603, and 1 / (1 + e^-2.5) = 0.92414
    (2.0, (0.36603, 0.92414)),
])
def test_each_side_choice_by_hand(temperature: float, expected: tuple[float, float]) -> None:
    model = Head([[0.0, 0.0], [math.log(3), 0.0], [5.0, 0.0]])
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])  # (1, 4, 2)
    choice = torch.tensor([[-1, 0, -1, 1]])  # token 1 between choice 0's pair, token 3 between choice 1's
    first = choice_probability(model, hidden, choice, [(0, 1), (2, 0)], temperature)
    assert first.shape == (1, 4)
    assert first[0, 1].item() == pytest.approx(expected[0], abs=1e-5)
    assert first[0, 3].item() == pytest.approx(expected[1], abs=1e-5)
    assert first[0, 0] == 0 and first[0, 2] == 0
