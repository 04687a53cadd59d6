"""From rollout trajectories to padded training tensors, and the advantages of each algorithm.

A trajectory may span several token segments (the environment bounds its context). Rows of the batch are
segments; advantages are computed per *trajectory* by laying its segments end to end, so credit flows across a
context reset exactly as within one context.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from r1trade.rollout.loop import Trajectory
from r1trade.config import GROUP_ALGORITHMS, TrainConfig
from r1trade.rl.advantages import (
    decision_group_advantages,
    gae,
    group_relative,
    keep_top_groups_by_std,
    reinforce_pp_advantages,
    reinforce_pp_turn_advantages,
    turn_discounts,
)
from r1trade.rl.losses import kl_penalty
from r1trade.rl.masks import masked_whiten


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
    looking: torch.Tensor | None = None  # (R, T) 1 = sampled in a turn that placed no trade (a look or a bad call)

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on `device`."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return RolloutBatch(**{k: (v.to(device) if v is not None else None) for k, v in moved.items()})

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


def collate(trajectories: list[Trajectory], *, pad_id: int) -> RolloutBatch:
    """Stack every segment of every trajectory as a right-padded row, each sampled token tagged with its turn."""
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
        looking=torch.zeros(rows, width),
    )
    for row, (*_, seg) in enumerate(segments):
        length = len(seg)
        batch.input_ids[row, :length] = torch.tensor(seg.token_ids)
        batch.attention_mask[row, :length] = 1
        batch.action_mask[row, :length] = torch.tensor(seg.action_mask, dtype=torch.float)
        batch.old_logprobs[row, :length] = torch.tensor(seg.logprobs)
        batch.rewards[row, :length] = torch.tensor(seg.rewards)
    row_of = {(n, i): row for row, (n, i, _, _) in enumerate(segments)}
    for n, trajectory in enumerate(trajectories):
        for k, turn in enumerate(trajectory.turns):
            row = row_of[n, turn.segment]
            batch.turn[row, turn.start : turn.end] = k
            batch.decision[row, turn.start : turn.end] = int(turn.info.get("decision_index", k))
            if not turn.info.get("decision_done", True):
                batch.looking[row, turn.start : turn.end] = 1.0
    return batch


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


def filter_top_groups(batch: RolloutBatch, keep_frac: float) -> RolloutBatch:
    """StarPO-S: keep the rows of start-state groups with the largest reward spread."""
    if keep_frac >= 1.0:
        return batch
    scores = trajectory_scores(batch)
    n = scores.shape[0]
    groups = batch.group.new_zeros(n).index_copy_(0, batch.trajectory, batch.group)
    keep_trajectory = keep_top_groups_by_std(scores, groups, keep_frac)  # (N,)
    rows = keep_trajectory[batch.trajectory].nonzero().squeeze(1)
    kept = batch.select(rows)
    # renumber trajectories densely so per-trajectory views stay compact
    _, kept.trajectory = torch.unique(kept.trajectory, return_inverse=True)
    return kept


def kl_coefficients(batch: RolloutBatch, config: TrainConfig) -> float | torch.Tensor:
    """The KL coefficient per token: `kl_coef`, except `look_kl_coef` on the tokens of turns that placed no trade.
    -> float, or (R, T) when the two differ."""
    if config.look_kl_coef is None or batch.looking is None:
        return config.kl_coef
    return config.kl_coef + (config.look_kl_coef - config.kl_coef) * batch.looking


def uses_kl(config: TrainConfig) -> bool:
    """Whether any token pays a KL penalty."""
    return config.kl_coef > 0 or bool(config.look_kl_coef)


def kl_in_loss(config: TrainConfig) -> bool:
    """Whether the KL penalty is a term of the loss rather than of each token's reward (`train.kl_placement`)."""
    if config.kl_placement == "auto":
        return config.algorithm in GROUP_ALGORITHMS
    return config.kl_placement == "loss"


def compute_advantages(batch: RolloutBatch, config: TrainConfig) -> RolloutBatch:
    """Fill `advantages` (and `returns` and `value_mask` for PPO) by `config.algorithm` and the mask switches."""
    view = TrajectoryView(batch)
    action = view.to_trajectories(batch.action_mask)  # (N, L)
    valid = view.to_trajectories(batch.attention_mask.float())  # (N, L)
    rewards = view.to_trajectories(batch.rewards)  # (N, L)
    broadcast = action if config.advantage_mask else valid  # tokens that receive an advantage
    kl = None  # the KL penalty in the reward, where it goes there
    if batch.ref_logprobs is not None and uses_kl(config) and not kl_in_loss(config):
        kl = view.to_trajectories(kl_penalty(batch.old_logprobs, batch.ref_logprobs, kind=config.kl_estimator))
    coefficients = kl_coefficients(batch, config) if kl is not None else 0.0
    if isinstance(coefficients, torch.Tensor):
        coefficients = view.to_trajectories(coefficients)  # (N, L)
    token_level_reinforce = config.algorithm == "reinforce_pp" and config.credit == "token"
    if kl is not None and not token_level_reinforce:  # (REINFORCE++ per token shapes its returns with it below)
        rewards = rewards - coefficients * kl * action
    if config.algorithm == "ppo":
        assert batch.old_values is not None, "PPO needs the critic's values"
        values = view.to_trajectories(batch.old_values)
        if config.credit == "turn":
            turns = TurnView.of(batch, view, config.advantage_mask)
            discount = _turn_discounts(batch, view, turns, config)
            turn_advantages, turn_returns = gae(
                turns.sum(rewards), turns.first(values), turns.present, discount, config.lam
            )  # (N, K) each
            advantages = turns.broadcast(masked_whiten(turn_advantages, turns.present))
            returns = turns.at_first_tokens(turn_returns)
            value_mask = turns.first_token_mask()
        else:
            advantages, returns = gae(
                rewards, values, action, config.gamma, config.lam,
                advantage_mask=config.advantage_mask, valid_mask=valid,
            )
            advantages = masked_whiten(advantages, broadcast)
            value_mask = broadcast
        return replace(
            batch, advantages=view.to_rows(advantages), returns=view.to_rows(returns),
            value_mask=view.to_rows(value_mask),
        )
    if config.algorithm in GROUP_ALGORITHMS:
        groups = batch.group.new_zeros(view.num_trajectories).index_copy_(0, batch.trajectory, batch.group)
        baseline = _GROUP_BASELINE[config.algorithm]
        episode = group_relative(rewards.sum(dim=1), groups, baseline)  # (N,)
        advantages = episode[:, None] * broadcast  # (N, L)
        if config.decision_advantage_coef > 0:
            turns = TurnView.of(batch, view, config.advantage_mask)
            decisions = turns.shared(view.to_trajectories(batch.decision.float())).long()  # (N, K)
            per_turn = _per_decision_advantages(turns.sum(rewards), decisions, turns.present, groups, baseline)
            advantages = advantages + config.decision_advantage_coef * turns.broadcast(per_turn)
        return replace(batch, advantages=view.to_rows(advantages))
    if config.credit == "turn":
        turns = TurnView.of(batch, view, config.advantage_mask)
        discount = _turn_discounts(batch, view, turns, config)
        per_turn = reinforce_pp_turn_advantages(turns.sum(rewards), turns.present, discount)  # (N, K)
        return replace(batch, advantages=view.to_rows(turns.broadcast(per_turn)))
    advantages = reinforce_pp_advantages(rewards, broadcast, config.gamma, kl=kl, kl_coef=coefficients)
    return replace(batch, advantages=view.to_rows(advantages))


_GROUP_BASELINE = {"grpo": "mean_std", "dr_grpo": "mean", "rloo": "leave_one_out"}


def _turn_discounts(
    batch: RolloutBatch, view: TrajectoryView, turns: TurnView, config: TrainConfig
) -> float | torch.Tensor:
    """`gamma`, or per turn `turn_gamma` within a decision and `gamma` between decisions. -> float or (N, K)."""
    if config.turn_gamma is None:
        return config.gamma
    decisions = turns.shared(view.to_trajectories(batch.decision.float())).long()  # (N, K)
    return turn_discounts(decisions, config.gamma, config.turn_gamma)


def _per_decision_advantages(
    turn_rewards: torch.Tensor, decisions: torch.Tensor, present: torch.Tensor, groups: torch.Tensor, baseline: str
) -> torch.Tensor:
    """Each turn's share of the per-decision group term: the reward of the decision it served (the sum over that
    decision's turns) against the group's at the same decision index. (N, K) turn tensors in, (N, K) out."""
    per_decision = turn_rewards.new_zeros(turn_rewards.shape[0], int(decisions.max()) + 1)  # (N, D)
    per_decision.scatter_add_(1, decisions, turn_rewards * present)
    reached = torch.zeros_like(per_decision).scatter_add_(1, decisions, present.float()) > 0  # (N, D)
    return decision_group_advantages(per_decision, reached, groups, baseline).gather(1, decisions)


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
