"""Where a trade turn makes its choice: the action words' tokens, a turn's kind, its decision token and its side
token.

The warm starts teach a trade turn that ends `Action: <word>.`, so the token after `Action:` is where the policy
chooses among the trade actions (`r1trade.eval.action_stats` reads the policy there). The side, long or short,
is chosen at the token where those two words part (the first of each on SmolLM2's tokenizer; the tiny
tokenizer spells both with a space first): the trainer's side-entropy bonus (`train.side_entropy_coef`) acts there
alone.
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


def side_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """Where the words long and short part, as they follow `Action:`: the tokens they share first, and the token
    of each there (long's, then short's)."""
    words = [tokenizer(f" {side}", add_special_tokens=False)["input_ids"] for side in SIDES]
    shared = 0
    while shared < min(map(len, words)) - 1 and words[0][shared] == words[1][shared]:
        shared += 1
    return words[0][:shared], [ids[shared] for ids in words]


def decision_position(tokenizer, sampled: list[int]) -> int:
    """Index (into the turn's sampled tokens) of the decision token: the first after `Action:`, else 0."""
    for k in range(1, len(sampled)):
        if tokenizer.decode(sampled[:k]).rstrip().endswith(ACTION_PROMPT):
            return k
    return 0


def side_positions(trajectory: Trajectory, tokenizer) -> list[tuple[int, int]]:
    """(segment, token index) of the side token of each turn that went long or short: where the two words part
    after `Action:`, when the turn spelt its side there as the words are tokenised."""
    shared, ids = side_tokens(tokenizer)
    found = []
    for turn in trajectory.turns:
        if classify(turn) in SIDES:
            sampled = trajectory.segments[turn.segment].token_ids[turn.start : turn.end]
            offset = decision_position(tokenizer, sampled)
            at = offset + len(shared)
            if offset > 0 and sampled[offset:at] == shared and at < len(sampled) and sampled[at] in ids:
                found.append((turn.segment, turn.start + at))
    return found
