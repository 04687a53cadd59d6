"""Where a trade turn makes its choice: the action words' tokens, a turn's kind, its decision token and its side
token.

The warm starts teach a trade turn that says `Action: <word>.` before its tool call, so the token after `Action:`
is where the policy first names its trade (`r1trade.eval.action_stats` reads the policy there). The side that is
executed, long or short, is the tool call's `side` argument: its side token is where `"side": "long"` and
`"side": "short"` part (`long` against `short` on SmolLM2's tokenizer, `l` against `sh` on the tiny one). The
trainer's side-entropy bonus (`train.side_entropy_coef`) acts there alone: the entropy of the side given all the
turn wrote before it. Where the call copies a side the turn named earlier, that entropy is near 0, and so is the
bonus's pull.
"""

from __future__ import annotations

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


def side_tokens(tokenizer) -> list[int]:
    """The token where a tool call's side argument parts between long and short: long's, then short's."""
    calls = [tokenizer(f"{{{SIDE_ARGUMENT}{side}\"}}", add_special_tokens=False)["input_ids"] for side in SIDES]
    shared = 0
    while shared < min(map(len, calls)) - 1 and calls[0][shared] == calls[1][shared]:
        shared += 1
    return [ids[shared] for ids in calls]


def decision_position(tokenizer, sampled: list[int]) -> int:
    """Index (into the turn's sampled tokens) of the decision token: the first after `Action:`, else 0."""
    for k in range(1, len(sampled)):
        if tokenizer.decode(sampled[:k]).rstrip().endswith(ACTION_PROMPT):
            return k
    return 0


def side_positions(trajectory: Trajectory, tokenizer) -> list[tuple[int, int]]:
    """(segment, token index) of the side token of each turn that went long or short: the last of its sampled
    tokens that is a side token and follows `SIDE_ARGUMENT`."""
    ids = side_tokens(tokenizer)
    found = []
    for turn in trajectory.turns:
        if classify(turn) in SIDES:
            sampled = trajectory.segments[turn.segment].token_ids[turn.start : turn.end]
            for at in reversed(range(len(sampled))):
                if sampled[at] in ids and tokenizer.decode(sampled[:at]).endswith(SIDE_ARGUMENT):
                    found.append((turn.segment, turn.start + at))
                    break
    return found
