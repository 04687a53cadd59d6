"""Advantage estimators: masked GAE (over tokens, or over turns), group baselines (GRPO, Dr. GRPO, RLOO, per-decision
groups and GiGPO's step-level groups), REINFORCE++, the StarPO-S filter; and `compute_advantages`, which fills a
rollout batch's advantages by the train config, with the KL helpers it shares with the loss.

Rewards are per token: each turn's process reward sits on that turn's last sampled token, the outcome
reward on the final sampled token, zeros elsewhere. Every trajectory is treated as ending at its last
used token (bootstrap 0). Advantages and returns are training targets, so every estimator runs under
`torch.no_grad()`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from r1trade.config import GROUP_ALGORITHMS, TrainConfig
from r1trade.rl.batch import RolloutBatch, TrajectoryView, TurnView
from r1trade.rl.losses import kl_penalty
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
    last one. This equals plain GAE on each row's action tokens alone, put back in their places.
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
    d = decision_rewards.shape[1]
    step_groups = group_ids[:, None] * d + torch.arange(d, device=group_ids.device)  # (N, D) unique per (g, k)
    return step_group_advantages(decision_rewards, present, step_groups, baseline, eps=eps)


@torch.no_grad()
def step_group_advantages(
    step_returns: torch.Tensor,
    present: torch.Tensor,
    states: torch.Tensor,
    baseline: GroupBaseline = "mean",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO's step-level advantage (arXiv 2505.10978): each turn's return against the returns of every turn in the
    batch that faced the same anchor state. -> (N, K).

    `step_returns`, `present` and `states` are (N, K) turn tensors; equal `states` ids form a step group, compared by
    `group_relative`'s `baseline`. A state only one turn faced gets 0, as does every absent turn.

    >>> step_group_advantages(torch.tensor([[1.0, 4.0], [3.0, 2.0]]), torch.ones(2, 2), torch.tensor([[0, 1], [0, 2]]))
    tensor([[-1.,  0.],
            [ 1.,  0.]])
    """
    keep = present.bool()  # (N, K)
    out = torch.zeros_like(step_returns)
    if keep.any():
        out[keep] = group_relative(step_returns[keep], states[keep], baseline, eps=eps)
    return out


@torch.no_grad()
def reinforce_pp_returns(
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
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
    kl_coef: float = 0.0,
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
    Ties go to the smaller group id. Std is the unbiased one, as in `group_relative`.
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


def uses_kl(config: TrainConfig) -> bool:
    """Whether any token pays a KL penalty."""
    return config.kl_coef > 0


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
    token_level_reinforce = config.algorithm == "reinforce_pp" and config.credit == "token"
    if kl is not None and not token_level_reinforce:  # (REINFORCE++ per token shapes its returns with it below)
        rewards = rewards - config.kl_coef * kl * action
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
        if config.decision_advantage_coef > 0 or config.step_groups:
            turns = TurnView.of(batch, view, config.advantage_mask)
        if config.decision_advantage_coef > 0:
            decisions = turns.shared(view.to_trajectories(batch.decision.float())).long()  # (N, K)
            per_turn = _per_decision_advantages(turns.sum(rewards), decisions, turns.present, groups, baseline)
            advantages = advantages + config.decision_advantage_coef * turns.broadcast(per_turn)
        if config.step_groups:
            if batch.anchor is None:
                raise ValueError("step_groups needs the anchor states `collate` records")
            states = turns.shared(view.to_trajectories(batch.anchor.float() + 1)).long() - 1  # (N, K)
            discount = _turn_discounts(batch, view, turns, config)
            returns = _discounted_cumsum(turns.sum(rewards), turns.present, discount)  # (N, K)
            per_turn = step_group_advantages(returns, turns.present, states, baseline)
            advantages = advantages + config.step_group_weight * turns.broadcast(per_turn)
        return replace(batch, advantages=view.to_rows(advantages))
    if config.credit == "turn":
        turns = TurnView.of(batch, view, config.advantage_mask)
        discount = _turn_discounts(batch, view, turns, config)
        per_turn = reinforce_pp_turn_advantages(turns.sum(rewards), turns.present, discount)  # (N, K)
        return replace(batch, advantages=view.to_rows(turns.broadcast(per_turn)))
    advantages = reinforce_pp_advantages(rewards, broadcast, config.gamma, kl=kl, kl_coef=config.kl_coef)
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


def shared_step_group_rate(batch: RolloutBatch) -> float:
    """The share of the batch's step groups (anchor states, `r1trade.rl.batch.anchor_states`) that more than one
    turn faced: only those carry a step-level signal."""
    sampled = (batch.turn >= 0) & (batch.anchor >= 0)  # (R, T)
    trajectory = batch.trajectory[:, None].expand_as(batch.turn)  # (R, T)
    turns = torch.stack([trajectory[sampled], batch.turn[sampled], batch.anchor[sampled]], dim=1).unique(dim=0)
    if len(turns) == 0:
        return 0.0
    _, members = turns[:, 2].unique(return_counts=True)
    return float((members > 1).float().mean())
