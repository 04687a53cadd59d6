"""From rollout trajectories to padded training tensors, and the views that lay them out per trajectory and turn.

A trajectory may span several token segments (the environment bounds its context). Rows of the batch are
segments; `TrajectoryView` lays a trajectory's segments end to end, so credit (`r1trade.rl.advantages`) flows
across a context reset exactly as within one context, and `TurnView` gathers its tokens into turns.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from r1trade.rollout.loop import Trajectory


@dataclass
class RolloutBatch:
    """Segments as right-padded rows. Token t's log-prob, value and reward all describe sampling token t."""

    input_ids: torch.Tensor  # (R, T) long
    attention_mask: torch.Tensor  # (R, T) 1 = real token
    action_mask: torch.Tensor  # (R, T) 1 = sampled by the policy
    old_logprobs: torch.Tensor  # (R, T)
    rewards: torch.Tensor  # (R, T)
    trajectory: torch.Tensor  # (R,) index of the trajectory a row belongs to
    group: torch.Tensor  # (R,) start-state group of that trajectory
    turn: torch.Tensor  # (R, T) long: the turn (0, 1, ... within its trajectory) a sampled token belongs to, else -1
    decision: torch.Tensor  # (R, T) long: that turn's decision index (several turns may serve one), else -1
    ref_logprobs: torch.Tensor | None = None  # (R, T)
    old_values: torch.Tensor | None = None  # (R, T)
    advantages: torch.Tensor | None = None  # (R, T)
    returns: torch.Tensor | None = None  # (R, T) value targets, where `value_mask` is 1
    value_mask: torch.Tensor | None = None  # (R, T) tokens whose value the critic is trained on
    anchor: torch.Tensor | None = None  # (R, T) long: the anchor state of that turn (`anchor_states`), else -1
    loss_weight: torch.Tensor | None = None  # (R, T) each token's weight in the loss's mean (None: 1 each)
    side_choice: torch.Tensor | None = None  # (R, T) long: at each token that names a trade's side, its place, else -1
    side_pull: torch.Tensor | None = None  # (R, T) at those tokens the batch's side-balance gradient (`side_pull`)

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on `device`."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return RolloutBatch(**{k: (v.to(device) if v is not None else None) for k, v in moved.items()})

    def micro_batches(self, size: int, *, by_length: bool = False) -> list[torch.Tensor]:
        """Row indices of micro-batches of at most `size` rows: in row order, or `by_length` cut so that each
        pads its rows to a similar length: groups ordered by their longest row and rows within a group by
        length, a group's rows side by side (they share more prefix). Attention over padded columns is most of a
        long row's cost, and the trainer weighs each micro-batch by its share of the tokens, so the cut changes
        only float rounding.

        For example rows of lengths [9, 3, 7, 4] in groups [0, 1, 0, 1] are visited by length as [1, 3, 2, 0]
        (group 1, longest 4: rows of 3 then 4 tokens; group 0, longest 9: 7 then 9), cut by 2 into [1, 3] and
        [2, 0].
        """
        order = torch.arange(self.rows)
        if by_length:
            lengths = self.attention_mask.sum(dim=1).cpu()  # (R,)
            _, group = torch.unique(self.group.cpu(), return_inverse=True)  # (R,) dense ids
            groups = int(group.max()) + 1
            longest = torch.zeros(groups, dtype=lengths.dtype).scatter_reduce(0, group, lengths, "amax")  # (G,)
            order = torch.argsort(lengths, stable=True)
            key = longest[group[order]] * groups + group[order]  # by the group's longest row, then its id
            order = order[torch.argsort(key, stable=True)]
        return [order[start : start + size] for start in range(0, len(order), size)]

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The sub-batch of the given row indices (trailing all-padding columns trimmed)."""
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        picked = RolloutBatch(**{k: (v[rows] if v is not None else None) for k, v in picked.items()})
        used = picked.attention_mask.sum(dim=0).nonzero()
        return picked.through_column(int(used.max()) + 1 if len(used) else 0)

    def through_column(self, width: int) -> RolloutBatch:
        """The batch with every (R, T) tensor cut to its first `width` columns."""
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        return RolloutBatch(**{k: (v[:, :width] if v is not None and v.dim() == 2 else v) for k, v in cut.items()})


def collate(
    trajectories: list[Trajectory], *, pad_id: int, sides: list[list[tuple[int, int, int]]] | None = None
) -> RolloutBatch:
    """Stack every segment of every trajectory as a right-padded row, each sampled token tagged with its turn;
    `sides`, per trajectory (segment, token, place) triples (`r1trade.rollout.decisions.side_positions`), fill
    `side_choice`."""
    segments = [
        (n, i, t.group, seg) for n, t in enumerate(trajectories) for i, seg in enumerate(t.segments) if len(seg)
    ]
    width = max(len(seg) for *_, seg in segments)
    rows = len(segments)
    batch = RolloutBatch(
        input_ids=torch.full((rows, width), pad_id, dtype=torch.long),
        attention_mask=torch.zeros(rows, width, dtype=torch.long),
        action_mask=torch.zeros(rows, width),
        old_logprobs=torch.zeros(rows, width),
        rewards=torch.zeros(rows, width),
        trajectory=torch.tensor([n for n, *_ in segments]),
        group=torch.tensor([g for _, _, g, _ in segments]),
        turn=torch.full((rows, width), -1, dtype=torch.long),
        decision=torch.full((rows, width), -1, dtype=torch.long),
        anchor=torch.full((rows, width), -1, dtype=torch.long),
    )
    for row, (*_, seg) in enumerate(segments):
        length = len(seg)
        batch.input_ids[row, :length] = torch.tensor(seg.token_ids)
        batch.attention_mask[row, :length] = 1
        batch.action_mask[row, :length] = torch.tensor(seg.action_mask, dtype=torch.float)
        batch.old_logprobs[row, :length] = torch.tensor(seg.logprobs)
        batch.rewards[row, :length] = torch.tensor(seg.rewards)
    row_of = {(n, i): row for row, (n, i, _, _) in enumerate(segments)}
    anchor_ids: dict[tuple, int] = {}  # equal anchor states get equal ids, numbered as they first appear
    for n, trajectory in enumerate(trajectories):
        for k, (turn, state) in enumerate(zip(trajectory.turns, anchor_states(trajectory), strict=True)):
            row = row_of[n, turn.segment]
            batch.anchor[row, turn.start : turn.end] = anchor_ids.setdefault(state, len(anchor_ids))
            batch.turn[row, turn.start : turn.end] = k
            batch.decision[row, turn.start : turn.end] = int(turn.info.get("decision_index", k))
    if sides is not None:
        batch.side_choice = torch.full((rows, width), -1, dtype=torch.long)
        for n, tokens in enumerate(sides):
            for segment, token, place in tokens:
                batch.side_choice[row_of[n, segment], token] = place
    return batch


def anchor_states(trajectory: Trajectory) -> list[tuple]:
    """The anchor state each turn was sampled in, GiGPO's key for step-level groups: the start-state group (the
    window), the decision index, the side of the position held (-1, 0, 1) and the tokens of every answer the
    environment gave earlier in the same decision (tool results, error messages).

    Members of a group see the same bar at decision k; their equity and size differ once their trades do, so the
    position counts by its side only. The model's own earlier text is not part of the state (GiGPO anchors on the
    environment's observation), and neither is the observation that opens a decision, which holds the portfolio.
    """
    states: list[tuple] = []
    answers: list[tuple[int, ...]] = []
    position = 0.0
    for k, turn in enumerate(trajectory.turns):
        decision = int(turn.info.get("decision_index", k))
        if k and decision == int(trajectory.turns[k - 1].info.get("decision_index", k - 1)):
            before = trajectory.turns[k - 1]
            start = before.end if before.segment == turn.segment else 0
            answers.append(tuple(trajectory.segments[turn.segment].token_ids[start : turn.start]))
        else:
            answers = []
        side = (position > 0) - (position < 0)
        states.append((trajectory.group, decision, side, tuple(answers)))
        position = float(turn.info.get("position", position))
    return states


class TrajectoryView:
    """Lays each trajectory's segments end to end: (R, T) rows ↔ (N, L) trajectories, valid tokens only."""

    def __init__(self, batch: RolloutBatch) -> None:
        valid = batch.attention_mask.bool()
        self.valid = valid
        self.num_trajectories = int(batch.trajectory.max()) + 1
        lengths = valid.sum(dim=1)  # (R,)
        offset = torch.zeros_like(lengths)
        seen: dict[int, int] = {}
        for row, n in enumerate(batch.trajectory.tolist()):  # rows of a trajectory are in segment order
            offset[row] = seen.get(n, 0)
            seen[n] = seen.get(n, 0) + int(lengths[row])
        self.length = max(seen.values())
        position = offset[:, None] + valid.long().cumsum(dim=1) - 1  # (R, T)
        self.flat_index = batch.trajectory[:, None] * self.length + position  # (R, T)

    def to_trajectories(self, x: torch.Tensor) -> torch.Tensor:
        """(R, T) → (N, L), zeros after each trajectory's end."""
        out = x.new_zeros(self.num_trajectories * self.length)
        out[self.flat_index[self.valid]] = x[self.valid]
        return out.view(self.num_trajectories, self.length)

    def to_rows(self, y: torch.Tensor) -> torch.Tensor:
        """(N, L) → (R, T), zeros on padding."""
        out = y.new_zeros(self.valid.shape)
        out[self.valid] = y.reshape(-1)[self.flat_index[self.valid]]
        return out


def trajectory_scores(batch: RolloutBatch) -> torch.Tensor:
    """Total reward per trajectory. -> (N,)"""
    n = int(batch.trajectory.max()) + 1
    return batch.rewards.new_zeros(n).index_add_(0, batch.trajectory, batch.rewards.sum(dim=1))


class TurnView:
    """(N, L) trajectory tokens ↔ (N, K) turns, for credit per turn.

    `turn` (N, L) holds each sampled token's turn index (-1 elsewhere). A turn's reward is the sum of the rewards
    from its first token up to the next turn (a reward on an observation token belongs to the turn before it);
    its value is the value at its first sampled token, V(the state the turn was sampled in). With
    `advantage_mask=False` every valid token receives an advantage: observation tokens take the turn that follows
    them (they are part of the state that turn acts on), tokens after the last turn take the last turn's.
    """

    def __init__(
        self, turn: torch.Tensor, action: torch.Tensor, valid: torch.Tensor, advantage_mask: bool = True
    ) -> None:
        keep = action.bool() & (turn >= 0)  # (N, L)
        self.num_turns = int(turn.max()) + 1 if keep.any() else 1
        n, length = turn.shape
        positions = torch.arange(length, device=turn.device).expand(n, length)  # (N, L)
        self.turn = turn.clamp(min=0)  # (N, L)
        self.keep = keep
        self.present = action.new_zeros(n, self.num_turns).scatter_add_(1, self.turn, keep.float()) > 0  # (N, K)
        first = turn.new_full((n, self.num_turns), length)
        self.first_position = first.scatter_reduce(1, self.turn, torch.where(keep, positions, length), "amin")
        # the turn each token's reward belongs to: the latest turn at or before it
        self.owner = torch.where(keep, self.turn, -1).cummax(dim=1).values  # (N, L)
        if advantage_mask:
            self.receiver = torch.where(keep, self.turn, -1)  # (N, L)
        else:
            following = torch.where(keep, self.turn, self.num_turns).flip(1).cummin(dim=1).values.flip(1)
            last = self.owner.max(dim=1, keepdim=True).values.expand(n, length)
            self.receiver = torch.where(following < self.num_turns, following, last)
            self.receiver = torch.where(valid.bool(), self.receiver, -1)  # (N, L)

    @classmethod
    def of(cls, batch: RolloutBatch, view: TrajectoryView, advantage_mask: bool = True) -> TurnView:
        """The turns of a batch's trajectories, laid end to end by `view`."""
        turn = view.to_trajectories(batch.turn + 1) - 1  # (N, L), -1 off the sampled tokens
        action = view.to_trajectories(batch.action_mask)
        return cls(turn, action, view.to_trajectories(batch.attention_mask.float()), advantage_mask)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Per turn, the sum of `x` over its tokens and the observation tokens after it. -> (N, K)"""
        if ((self.owner < 0) & (x != 0)).any():
            raise ValueError("a reward sits before the first turn of its trajectory: no action to credit it to")
        out = x.new_zeros(x.shape[0], self.num_turns)
        return out.scatter_add_(1, self.owner.clamp(min=0), torch.where(self.owner >= 0, x, 0.0))

    def first(self, x: torch.Tensor) -> torch.Tensor:
        """`x` at each turn's first sampled token (0 for absent turns). -> (N, K)"""
        at = x.gather(1, self.first_position.clamp(max=x.shape[1] - 1))
        return torch.where(self.present, at, 0.0)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        """A value all of a turn's sampled tokens share (such as its decision index), per turn; 0 for absent
        turns. -> (N, K)"""
        out = x.new_full((x.shape[0], self.num_turns), float("-inf"))
        out = out.scatter_reduce(1, self.turn, torch.where(self.keep, x, float("-inf")), "amax")
        return torch.where(self.present, out, 0.0)

    def broadcast(self, per_turn: torch.Tensor) -> torch.Tensor:
        """Each token receives its turn's entry of `per_turn` (N, K); 0 where no turn. -> (N, L)"""
        at = per_turn.gather(1, self.receiver.clamp(min=0))
        return torch.where(self.receiver >= 0, at, 0.0)

    def at_first_tokens(self, per_turn: torch.Tensor) -> torch.Tensor:
        """`per_turn` (N, K) placed at each turn's first sampled token, 0 elsewhere. -> (N, L)"""
        return self.first_token_mask() * per_turn.gather(1, self.turn)

    def first_token_mask(self) -> torch.Tensor:
        """1 at each turn's first sampled token. -> (N, L) float"""
        positions = torch.arange(self.turn.shape[1], device=self.turn.device).expand_as(self.turn)
        return (self.keep & (self.first_position.gather(1, self.turn) == positions)).float()
