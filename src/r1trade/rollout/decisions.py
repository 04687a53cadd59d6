"""Where a trade turn makes its choice: the action words' tokens, a turn's kind, its decision token and the tokens
that name its side.

The warm starts teach a trade turn that says `Action: <word>.` before its tool call, so the token after `Action:`
is where the policy first names its trade (`r1trade.eval.action_stats` reads the policy there). The side that is
executed, long or short, is the tool call's `side` argument. A side is named in two places, and a model may choose
in either: SmolLM2's call copies the word its `Action:` line wrote, while the tiny model's call can choose again.
`side_choices` finds, for each place, the token where long and short part (` long` against ` short` after
`Action:` on SmolLM2's tokenizer, `long` against `short` in the call; `l` against `sh` in both on the tiny one). The
trainer's side balance (`train.side_balance_coef`, `r1trade.rl.side_balance`) acts at each of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from r1trade.env.demonstrations import ACTION_PROMPT, TRADE_ACTIONS
from r1trade.rollout.loop import Trajectory, Turn


def classify(turn: Turn) -> str:
    """long, short, hold, close, info (an information tool) or malformed (a refused or unparsable call)."""
    info = turn.info
    if info.get("parse_error") is not None or info.get("tool_error") is not None:
        return "malformed"
    action = info.get("action") or {}
    name = action.get("name")
    if name == "place_order":
        return str(action.get("arguments", {}).get("side"))
    if name == "close_position":
        return "close"
    if name == "hold":
        return "hold"
    return "info"


def action_word_ids(tokenizer) -> dict[str, list[int]]:
    """The tokens of each action word as it follows `Action:` (with its leading space)."""
    return {a: tokenizer(f" {a}", add_special_tokens=False)["input_ids"] for a in TRADE_ACTIONS}


SIDES = ("long", "short")
SIDE_ARGUMENT = '"side": "'
"""What the tool call writes before the side it executes (the warm start's JSON, as `json.dumps` spells it)."""


@dataclass(frozen=True)
class SideChoice:
    """A place where a trade turn names its side: the token where long and short part there (long's, then
    short's), and the text every turn writes right before that token."""

    place: str
    lead: str
    ids: tuple[int, int]


SIDE_PLACES = {
    # place: (text before the side word, text after it), as the warm start writes them
    "action_word": (f"{ACTION_PROMPT} ", "."),
    "side_argument": (f"{{{SIDE_ARGUMENT}", '"}'),
}


def side_choices(tokenizer) -> list[SideChoice]:
    """Each place's side choice, in `SIDE_PLACES` order, found by tokenizing the place with each side."""
    choices = []
    for place, (before, after) in SIDE_PLACES.items():
        spelled = [tokenizer(f"{before}{side}{after}", add_special_tokens=False)["input_ids"] for side in SIDES]
        shared = 0
        while shared < min(map(len, spelled)) - 1 and spelled[0][shared] == spelled[1][shared]:
            shared += 1
        lead = tokenizer.decode(spelled[0][:shared])
        choices.append(SideChoice(place, lead, (spelled[0][shared], spelled[1][shared])))
    return choices


def decision_position(tokenizer, sampled: list[int]) -> int:
    """Index (into the turn's sampled tokens) of the decision token: the first after `Action:`, else 0."""
    for k in range(1, len(sampled)):
        if tokenizer.decode(sampled[:k]).rstrip().endswith(ACTION_PROMPT):
            return k
    return 0


def side_positions(trajectory: Trajectory, choices: list[SideChoice], tokenizer) -> list[tuple[int, int, int]]:
    """(segment, token index, index into `choices`) of each token that names the side of a turn that went long or
    short: per place, the last of the turn's sampled tokens that is one of that place's two and follows its lead."""
    found = []
    for turn in trajectory.turns:
        if classify(turn) not in SIDES:
            continue
        sampled = trajectory.segments[turn.segment].token_ids[turn.start : turn.end]
        for index, choice in enumerate(choices):
            for at in reversed(range(len(sampled))):
                if sampled[at] in choice.ids and tokenizer.decode(sampled[:at]).endswith(choice.lead):
                    found.append((turn.segment, turn.start + at, index))
                    break
    return found
