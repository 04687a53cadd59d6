"""From rollout trajectories to padded training tensors, and the advantages of each algorithm.

A trajectory may span several token segments (the environment bounds its context). Rows of the batch are
segments; advantages are computed per *trajectory* by laying its segments end to end, so credit flows across a
context reset exactly as within one context.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from r1trade.agent.rollout import Trajectory
from r1trade.config import TrainConfig
from r1trade.rl.advantages import gae, grpo_advantages, keep_top_groups_by_std, reinforce_pp_advantages
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
    ref_logprobs: torch.Tensor | None = None  # (R, T)
    old_values: torch.Tensor | None = None  # (R, T)
    advantages: torch.Tensor | None = None  # (R, T)
    returns: torch.Tensor | None = None  # (R, T)

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
        picked = {k: (v[rows] if v is not None else None) for k, v in picked.items()}
        used = picked["attention_mask"].sum(dim=0).nonzero()
        width = int(used.max()) + 1 if len(used) else 0
        return RolloutBatch(**{k: (v[:, :width] if v is not None and v.dim() == 2 else v) for k, v in picked.items()})


def collate(trajectories: list[Trajectory], *, pad_id: int) -> RolloutBatch:
    """Stack every segment of every trajectory as a right-padded row."""
    segments = [(n, t.group, seg) for n, t in enumerate(trajectories) for seg in t.segments if len(seg)]
    width = max(len(seg) for _, _, seg in segments)
    rows = len(segments)
    batch = RolloutBatch(
        input_ids=torch.full((rows, width), pad_id, dtype=torch.long),
        attention_mask=torch.zeros(rows, width, dtype=torch.long),
        action_mask=torch.zeros(rows, width),
        old_logprobs=torch.zeros(rows, width),
        rewards=torch.zeros(rows, width),
        trajectory=torch.tensor([n for n, _, _ in segments]),
        group=torch.tensor([g for _, g, _ in segments]),
    )
    for row, (_, _, seg) in enumerate(segments):
        n = len(seg)
        batch.input_ids[row, :n] = torch.tensor(seg.token_ids)
        batch.attention_mask[row, :n] = 1
        batch.action_mask[row, :n] = torch.tensor(seg.action_mask, dtype=torch.float)
        batch.old_logprobs[row, :n] = torch.tensor(seg.logprobs)
        batch.rewards[row, :n] = torch.tensor(seg.rewards)
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
    return torch.zeros(n).index_add_(0, batch.trajectory, batch.rewards.sum(dim=1))


def filter_top_groups(batch: RolloutBatch, keep_frac: float) -> RolloutBatch:
    """StarPO-S: keep the rows of start-state groups with the largest reward spread."""
    if keep_frac >= 1.0:
        return batch
    scores = trajectory_scores(batch)
    n = scores.shape[0]
    groups = torch.zeros(n, dtype=torch.long).index_copy_(0, batch.trajectory, batch.group)
    keep_trajectory = keep_top_groups_by_std(scores, groups, keep_frac)  # (N,)
    rows = keep_trajectory[batch.trajectory].nonzero().squeeze(1)
    kept = batch.select(rows)
    # renumber trajectories densely so per-trajectory views stay compact
    _, kept.trajectory = torch.unique(kept.trajectory, return_inverse=True)
    return kept


def compute_advantages(batch: RolloutBatch, config: TrainConfig) -> RolloutBatch:
    """Fill `advantages` (and `returns` for PPO) according to `config.algorithm` and the mask switches."""
    view = TrajectoryView(batch)
    action = view.to_trajectories(batch.action_mask)  # (N, L)
    valid = view.to_trajectories(batch.attention_mask.float())  # (N, L)
    rewards = view.to_trajectories(batch.rewards)  # (N, L)
    kl = None
    if batch.ref_logprobs is not None:
        kl = view.to_trajectories(kl_penalty(batch.old_logprobs, batch.ref_logprobs, kind=config.kl_estimator))
    if config.algorithm == "ppo":
        if kl is not None and config.kl_coef > 0:
            rewards = rewards - config.kl_coef * kl * action
        assert batch.old_values is not None, "PPO needs the critic's values"
        values = view.to_trajectories(batch.old_values)
        advantages, returns = gae(
            rewards, values, action, config.gamma, config.lam,
            advantage_mask=config.advantage_mask, valid_mask=valid,
        )
        whiten_mask = action if config.advantage_mask else valid
        advantages = masked_whiten(advantages, whiten_mask)
        return replace(batch, advantages=view.to_rows(advantages), returns=view.to_rows(returns))
    if config.algorithm == "grpo":
        scores = rewards.sum(dim=1)  # (N,)
        groups = torch.zeros(view.num_trajectories, dtype=torch.long).index_copy_(0, batch.trajectory, batch.group)
        broadcast = action if config.advantage_mask else valid
        return replace(batch, advantages=view.to_rows(grpo_advantages(scores, groups, broadcast)))
    token_mask = action if config.advantage_mask else valid
    advantages = reinforce_pp_advantages(rewards, token_mask, config.gamma, kl=kl, kl_coef=config.kl_coef)
    return replace(batch, advantages=view.to_rows(advantages))
