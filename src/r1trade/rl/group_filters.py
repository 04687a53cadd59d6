"""Which start-state groups an update trains on: DAPO's dynamic sampling and StarPO-S's top groups by reward spread.

Both judge a group by its episodes' total rewards (`trajectory_scores`) and keep or drop whole groups, renumbering
the kept trajectories densely so that per-trajectory views stay compact.
"""

from __future__ import annotations

import torch

from r1trade.rl.advantages import keep_top_groups_by_std
from r1trade.rl.batch import RolloutBatch, trajectory_scores


def _trajectory_groups(batch: RolloutBatch) -> torch.Tensor:
    """The start-state group of each trajectory. -> (N,)"""
    n = int(batch.trajectory.max()) + 1
    return batch.group.new_zeros(n).index_copy_(0, batch.trajectory, batch.group)


def _keep_trajectories(batch: RolloutBatch, keep: torch.Tensor) -> RolloutBatch:
    """The rows of the trajectories `keep` (N,) bool marks, trajectories renumbered 0..N'-1 in order."""
    kept = batch.select(keep[batch.trajectory].nonzero().squeeze(1))
    _, kept.trajectory = torch.unique(kept.trajectory, return_inverse=True)
    return kept


def drop_uniform_groups(batch: RolloutBatch) -> tuple[RolloutBatch, float]:
    """DAPO's dynamic sampling (arXiv 2503.14476): drop the groups whose episodes all scored alike. -> (the batch,
    the share of its groups dropped).

    Under a group baseline such a group's advantages are 0 (`group_relative`), so its tokens only dilute the loss's
    mean. DAPO samples more groups to refill the batch; here the batch is smaller instead. A batch in which
    no group varies is kept whole: an update needs rows, and every process must take its optimiser steps.
    """
    scores = trajectory_scores(batch)  # (N,)
    _, group = torch.unique(_trajectory_groups(batch), return_inverse=True)  # (N,) dense 0..G-1
    num_groups = int(group.max()) + 1
    highest = scores.new_full((num_groups,), -torch.inf).scatter_reduce(0, group, scores, "amax")  # (G,)
    lowest = scores.new_full((num_groups,), torch.inf).scatter_reduce(0, group, scores, "amin")  # (G,)
    varies = highest > lowest  # (G,)
    if not varies.any() or varies.all():
        return batch, 0.0
    return _keep_trajectories(batch, varies[group]), float(1 - varies.float().mean())


def filter_top_groups(batch: RolloutBatch, keep_frac: float) -> RolloutBatch:
    """StarPO-S: keep the rows of start-state groups with the largest reward spread."""
    if keep_frac >= 1.0:
        return batch
    keep_trajectory = keep_top_groups_by_std(trajectory_scores(batch), _trajectory_groups(batch), keep_frac)  # (N,)
    return _keep_trajectories(batch, keep_trajectory)
