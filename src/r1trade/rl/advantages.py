"""Advantage estimators: masked GAE (over tokens, or over turns), group baselines (GRPO, Dr. GRPO, RLOO, and
per-decision groups), REINFORCE++, the StarPO-S filter.

Rewards are per token: each turn's process reward sits on that turn's last sampled token, the outcome
reward on the final sampled token, zeros elsewhere. Every trajectory is treated as ending at its last
used token (bootstrap 0). Advantages and returns are training targets, so every estimator runs under
`torch.no_grad()`.
"""

from __future__ import annotations

import math

import torch

from r1trade.rl.masks import masked_var, masked_whiten, zero_outside


def _fold_rewards(rewards: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Move every reward on a mask-0 token onto the closest mask-1 token before it in the same row.

    The rollout puts rewards on sampled tokens, so normally this changes nothing; a reward that lands on an
    observation or injected token belongs to the action that led there. A non-zero reward before a row's first
    mask-1 token has no action to credit: ValueError.
    """
    batch, length = keep.shape
    positions = torch.arange(length, device=keep.device).expand(batch, length)  # (B, T)
    owner = torch.where(keep, positions, -1).cummax(dim=1).values  # (B, T) latest mask-1 index at or before t
    if ((owner < 0) & (rewards != 0)).any():
        raise ValueError("a reward sits before the first token of its row's mask: no action to credit it to")
    return torch.zeros_like(rewards).scatter_add_(1, owner.clamp(min=0), rewards)


def _next_kept(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """For every token, `x` at the next mask-1 token strictly after it in its row, 0 if none. -> (B, T)."""
    batch, length = keep.shape
    positions = torch.arange(length, device=keep.device).expand(batch, length)  # (B, T)
    index = torch.where(keep, positions, length)  # (B, T); `length` points at an appended zero column
    first_at_or_after = index.flip(1).cummin(dim=1).values.flip(1)  # (B, T)
    after_last = index.new_full((batch, 1), length)  # (B, 1)
    strictly_after = torch.cat([first_at_or_after[:, 1:], after_last], dim=1)  # (B, T)
    padded = torch.cat([x, x.new_zeros(batch, 1)], dim=1)  # (B, T + 1)
    return padded.gather(1, strictly_after)


def _discounted_cumsum(x: torch.Tensor, keep: torch.Tensor, discount: float | torch.Tensor) -> torch.Tensor:
    """out_t = x_t + discount_t * out_next over each row's mask-1 tokens, mask-0 tokens skipped and set to 0.

    `discount` is one number, or (B, T): the discount from position t to the next kept one."""
    out = torch.zeros_like(x)  # (B, T)
    running = x.new_zeros(x.shape[0])  # (B,)
    for t in reversed(range(x.shape[1])):
        step = discount[:, t] if isinstance(discount, torch.Tensor) else discount
        running = torch.where(keep[:, t], x[:, t] + step * running, running)
        out[:, t] = running
    return zero_outside(out, keep)


def turn_discounts(decisions: torch.Tensor, gamma: float, turn_gamma: float | None) -> float | torch.Tensor:
    """The discount from each turn to the next: `turn_gamma` between turns of one decision (an information call
    and the trade after it), `gamma` between decisions; just `gamma` when `turn_gamma` is None. -> (N, K).

    `decisions` (N, K) holds each turn's decision index. γ = 1 within a decision with γ = 0 across decisions
    gives an information call the reward of the trade it led to, and no decision the reward of the next.

    >>> turn_discounts(torch.tensor([[0, 0, 1, 1]]), 0.0, 1.0)
    tensor([[1., 0., 1., 0.]])
    """
    if turn_gamma is None:
        return gamma
    same = torch.zeros(decisions.shape, dtype=torch.bool, device=decisions.device)  # (N, K)
    same[:, :-1] = decisions[:, 1:] == decisions[:, :-1]
    return torch.where(same, turn_gamma, gamma).float()


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float,
    advantage_mask: bool = True,
    valid_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the tokens one mask selects. -> (advantages, returns), (B, T).

    `advantage_mask=True` (Agent-R1): the recursion runs over action tokens only, as if the other tokens
    were not there: a token's next value is the value of the next action token in its row, 0 after the
    last one. This equals plain GAE on `compress(·, action_mask)` scattered back.
    `advantage_mask=False` (the ablation): plain GAE over every token of `valid_mask` (the attention mask,
    required then), so observation tokens get advantages and their values bootstrap the action tokens
    before them; padding is skipped. Rewards on tokens outside the used mask are added to the closest used
    token before them. Both outputs are 0 outside the used mask; returns = advantages + values.
    """
    if advantage_mask:
        keep = action_mask.bool()  # (B, T)
    elif valid_mask is None:
        raise ValueError("advantage_mask=False needs valid_mask (the attention mask) so padding stays out")
    else:
        keep = valid_mask.bool()  # (B, T)
    values = zero_outside(values, keep)  # (B, T)
    rewards = _fold_rewards(rewards, keep)  # (B, T)
    deltas = rewards + gamma * _next_kept(values, keep) - values  # (B, T) TD errors
    advantages = _discounted_cumsum(deltas, keep, gamma * lam)  # (B, T)
    return advantages, zero_outside(advantages + values, keep)


def _group_mean_std(scores: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group mean and unbiased std of `scores` (N,), groups indexed 0..G-1; std 0 for a lone sample."""
    num_groups = int(group.max()) + 1
    counts = torch.bincount(group, minlength=num_groups).to(scores.dtype)  # (G,)
    mean = scores.new_zeros(num_groups).index_add_(0, group, scores) / counts  # (G,)
    squares = scores.new_zeros(num_groups).index_add_(0, group, (scores - mean[group]) ** 2)  # (G,)
    return mean, torch.sqrt(squares / (counts - 1).clamp(min=1))


GroupBaseline = str  # "mean_std" (GRPO), "mean" (Dr. GRPO) or "leave_one_out" (RLOO)
GROUP_BASELINES = ("mean_std", "mean", "leave_one_out")


@torch.no_grad()
def group_relative(
    scores: torch.Tensor, group_ids: torch.Tensor, baseline: GroupBaseline = "mean_std", eps: float = 1e-6
) -> torch.Tensor:
    """Each score against the other scores of its group. -> (N,).

    - `mean_std` (GRPO): (s - group mean) / (group std + eps), the unbiased (n - 1) std as `torch.std`;
    - `mean` (Dr. GRPO, arXiv 2503.20783): s - group mean, no std scaling (which over-weights easy groups);
    - `leave_one_out` (RLOO): s minus the mean of the *other* members, = n / (n - 1) × (s - group mean).
    A group with no spread (one member, or all scores equal) gets exactly 0. `group_ids` may be any integers.

    >>> group_relative(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([7, 7, 7]), "leave_one_out")
    tensor([-3.,  0.,  3.])
    """
    if baseline not in GROUP_BASELINES:
        raise ValueError(f"unknown group baseline {baseline!r}: use one of {GROUP_BASELINES}")
    _, group = torch.unique(group_ids, return_inverse=True)  # (N,) dense in 0..G-1
    mean, std = _group_mean_std(scores, group)
    advantages = scores - mean[group]  # (N,)
    if baseline == "leave_one_out":
        counts = torch.bincount(group).to(scores.dtype)[group]  # (N,)
        advantages = torch.where(counts > 1, advantages * counts / (counts - 1).clamp(min=1), 0.0)
    if baseline == "mean_std":
        spread = std[group]  # (N,)
        advantages = torch.where(spread > 0, advantages / (spread + eps), torch.zeros_like(advantages))
    return torch.where(std[group] > 0, advantages, torch.zeros_like(advantages))


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    action_mask: torch.Tensor,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """GRPO: each sample's outcome score against its group's, broadcast over its action tokens. -> (N, T).

    A = (score - group mean) / (group std + eps), with the unbiased (n - 1) std, as `torch.std` and TRL's
    GRPOTrainer use. `scale_by_std=False` gives score - group mean (Dr. GRPO). A group with no spread (one
    sample, or all scores equal) gets exactly 0, even with `eps=0`. `group_ids` (N,) may be any integers;
    equal ids form a group.
    """
    advantages = group_relative(scores, group_ids, "mean_std" if scale_by_std else "mean", eps=eps)  # (N,)
    return zero_outside(advantages[:, None].expand(action_mask.shape), action_mask)


@torch.no_grad()
def decision_group_advantages(
    decision_rewards: torch.Tensor,
    present: torch.Tensor,
    group_ids: torch.Tensor,
    baseline: GroupBaseline = "mean",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-decision group baseline (GiGPO's step-level groups, for a replayed market). -> (N, D).

    Members of a group replay the same window, so at decision k they all face the same bar: the step group of
    (trajectory n, decision k) is every member of n's group that reached decision k. Each decision's reward is
    compared within its step group by `group_relative`'s `baseline`; entries where `present` is 0 are 0.
    `decision_rewards` and `present` are (N, D); `group_ids` is (N,).

    >>> decision_group_advantages(torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([[1, 1], [1, 0]]),
    ...                           torch.tensor([0, 0]))
    tensor([[-1.,  0.],
            [ 1.,  0.]])
    """
    n, d = decision_rewards.shape
    keep = present.bool()  # (N, D)
    step_groups = group_ids[:, None] * d + torch.arange(d, device=group_ids.device)  # (N, D) unique per (g, k)
    out = torch.zeros_like(decision_rewards)
    if keep.any():
        out[keep] = group_relative(decision_rewards[keep], step_groups[keep], baseline, eps=eps)
    return out


@torch.no_grad()
def reinforce_pp_returns(
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    kl: torch.Tensor | None = None,
    kl_coef: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """REINFORCE++ token returns: discounted future rewards over action tokens, KL penalty in. -> (N, T).

    Every action token's reward is reduced by `kl_coef * kl` (per-token KL to the reference policy, e.g.
    `kl_penalty(..., "k1")`, computed without gradient); the discount runs over action tokens only, as in
    `gae`. Rewards on non-action tokens are added to the action token before them. 0 off the action mask.
    """
    keep = action_mask.bool()  # (N, T)
    shaped = _fold_rewards(rewards, keep)  # (N, T)
    if kl is not None:
        shaped = shaped - kl_coef * zero_outside(kl, keep)
    return _discounted_cumsum(shaped, keep, gamma)


@torch.no_grad()
def reinforce_pp_advantages(
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    kl: torch.Tensor | None = None,
    kl_coef: float | torch.Tensor = 0.0,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ advantages: `reinforce_pp_returns` whitened over all action tokens given. -> (N, T).

    The normalisation is global (one mean and std for the whole batch): it is what replaces a critic's
    baseline, so pass the whole rollout batch, not a minibatch.
    """
    returns = reinforce_pp_returns(rewards, action_mask, gamma, kl=kl, kl_coef=kl_coef)  # (N, T)
    return masked_whiten(returns, action_mask, eps=eps)


@torch.no_grad()
def reinforce_pp_turn_advantages(
    turn_rewards: torch.Tensor, present: torch.Tensor, gamma: float | torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """REINFORCE++ with credit per turn: each turn's discounted return over the turns after it, whitened over
    every present turn of the batch (each turn counts once, however many tokens it has). -> (N, K).

    `turn_rewards` and `present` are (N, K). With `gamma=0` a turn is judged by its own reward alone (each
    decision by its own PnL), against the whole batch: unlike a group baseline it keeps a signal when every
    member of a group made the same choice.

    >>> reinforce_pp_turn_advantages(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1, 1], [1, 0]]), 0.0)
    tensor([[-1.,  1.],
            [ 0.,  0.]])
    """
    keep = present.bool()
    returns = _discounted_cumsum(turn_rewards, keep, gamma)  # (N, K)
    return masked_whiten(returns, keep.to(turn_rewards.dtype), eps=eps)


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over mask-1 tokens: 1 is a perfect critic, <= 0 no better
    than a constant. NaN when the returns have no variance (as in Stable-Baselines3): undefined then.
    """
    returns_var = masked_var(returns, mask)
    if returns_var == 0:
        return float("nan")
    return float(1 - masked_var(returns - values, mask) / returns_var)


def keep_top_groups_by_std(scores: torch.Tensor, group_ids: torch.Tensor, keep_frac: float) -> torch.Tensor:
    """StarPO-S filter: keep the samples of the `ceil(keep_frac * G)` groups (at least one) with the
    largest score std. -> bool (N,).

    Groups whose samples all score alike teach nothing under a group baseline; RAGEN keeps the top 25 %.
    Ties go to the smaller group id. Std is the unbiased one, as in `grpo_advantages`.
    """
    if not 0 < keep_frac <= 1:
        raise ValueError(f"keep_frac must be in (0, 1], got {keep_frac}")
    _, group = torch.unique(group_ids, return_inverse=True)  # (N,) dense, ordered like the sorted ids
    _, std = _group_mean_std(scores, group)  # (G,)
    num_keep = max(1, math.ceil(keep_frac * len(std) - 1e-9))
    ranked = torch.sort(std, descending=True, stable=True).indices  # (G,)
    kept_groups = torch.zeros_like(std, dtype=torch.bool)
    kept_groups[ranked[:num_keep]] = True
    return kept_groups[group]
