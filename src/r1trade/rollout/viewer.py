"""A debug view of one trajectory: sampled tokens highlighted, masked tokens dimmed, each turn's rewards."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from transformers import PreTrainedTokenizerBase

from r1trade.rollout.loop import Trajectory

SAMPLED_STYLE = "bold green"
MASKED_STYLE = "dim"


def render_tokens(tokenizer: PreTrainedTokenizerBase, token_ids: list[int], action_mask: list[int]) -> Text:
    """The segment's text with every run of mask-1 tokens in `SAMPLED_STYLE` and mask-0 tokens dimmed."""
    text = Text()
    start = 0
    for end in range(1, len(token_ids) + 1):
        if end == len(token_ids) or action_mask[end] != action_mask[start]:
            piece = tokenizer.decode(token_ids[start:end], skip_special_tokens=False)
            text.append(piece, style=SAMPLED_STYLE if action_mask[start] else MASKED_STYLE)
            start = end
    return text


def render_trajectory(tokenizer: PreTrainedTokenizerBase, trajectory: Trajectory) -> RenderableType:
    """Every segment's tokens, then a table of turns with their reward components."""
    parts: list[RenderableType] = []
    for index, segment in enumerate(trajectory.segments):
        sampled = sum(segment.action_mask)
        parts.append(Text(f"── segment {index}: {len(segment)} tokens, {sampled} sampled ──", style="bold"))
        parts.append(render_tokens(tokenizer, segment.token_ids, segment.action_mask))
    table = Table(title="turns", title_justify="left")
    for column, justify in (("turn", "right"), ("tokens", "right"), ("reward", "right"), ("components", "left")):
        table.add_column(column, justify=justify)
    for number, turn in enumerate(trajectory.turns, start=1):
        components = turn.info.get("reward_components", {})
        shown = ", ".join(f"{name} {value:+.3f}" for name, value in components.items() if value)
        flag = " (truncated)" if turn.truncated else ""
        table.add_row(f"{number}{flag}", str(turn.end - turn.start), f"{turn.reward:+.4f}", shown or "-")
    parts.append(table)
    ending = "terminated" if trajectory.terminated else "truncated" if trajectory.truncated else "running"
    parts.append(Text(f"episode {ending}; total reward {trajectory.total_reward:+.4f}"))
    return Group(*parts)
