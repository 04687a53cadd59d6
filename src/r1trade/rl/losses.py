"""PPO losses and KL estimators over (B, T) token tensors.

Every loss is one mean over the mask-1 tokens of the mask it is given (token-level, via `masked_mean`), or, with
per-token `weights`, a weighted mean (`token_mean`: `sequence_weights` make every episode weigh the same).
The trainer passes the action mask, or the whole valid (attention) mask for the loss-mask ablation.
Inputs outside the mask may hold anything, even NaN or inf: they reach neither the loss nor its gradient.
"""

from __future__ import annotations

from typing import Literal

import torch

from r1trade.rl.masks import masked_mean, zero_outside

KLKind = Literal["k1", "k2", "k3", "abs"]


def token_mean(x: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of `x` over the mask-1 tokens, each weighing `weights` (B, T) (None: 1 each, DAPO's token-level
    mean); 0 where the mask selects nothing."""
    if weights is None:
        return masked_mean(x, mask)
    weights = zero_outside(weights, mask)  # (B, T)
    return (zero_outside(x, mask) * weights).sum() / weights.sum().clamp(min=torch.finfo(x.dtype).tiny)


def sequence_weights(mask: torch.Tensor, trajectory: torch.Tensor) -> torch.Tensor:
    """Each mask-1 token's weight 1 / (its trajectory's mask-1 tokens): in `token_mean` every episode then weighs
    the same however long it is (GRPO's 1/|o| per sequence), where the token-level mean lets long episodes weigh
    more. `mask` is (R, T), `trajectory` (R,) each row's trajectory. -> (R, T), 0 off the mask."""
    keep = mask.bool()  # (R, T)
    counts = torch.zeros(int(trajectory.max()) + 1, device=mask.device).index_add_(0, trajectory, keep.sum(1).float())
    return torch.where(keep, 1.0 / counts[trajectory].clamp(min=1)[:, None], 0.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    *,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, ratio clipped to [1 - clip_low, 1 + clip_high]. -> (loss, stats).

    loss = mean over the mask of max(-A * r, -A * clip(r)), r = exp(logprobs - old_logprobs), weighted by
    `weights` if given (`token_mean`). A larger `clip_high` lets unlikely good tokens grow faster (DAPO's
    clip-higher: 0.2 / 0.28). stats: `clipfrac`, the share of tokens where the clipped term wins (they get no
    gradient); `approx_kl`, KL(old || new) by the k3 estimator, the mean of (r - 1) - log r (unbiased, never
    negative; as CleanRL); `ratio_mean`.
    """
    log_ratio = zero_outside(logprobs - old_logprobs, mask)  # (B, T)
    advantages = zero_outside(advantages, mask)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = -advantages * ratio  # (B, T)
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # (B, T)
    per_token = torch.maximum(unclipped, clipped)  # (B, T)
    loss = token_mean(per_token, mask, weights)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), mask).item(),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss, mean over the mask of 0.5 * max((v - R)^2, (v_clip - R)^2). -> (loss, stats).

    v_clip = old + clip(v - old, -clip_range, clip_range) keeps the critic near the values the advantages
    were computed with (PPO2, CleanRL). `clip_range=None` gives the plain 0.5 * (v - R)^2. stats:
    `clipfrac`, the share of tokens where the clipped term is the larger.
    """
    values = zero_outside(values, mask)  # (B, T)
    old_values = zero_outside(old_values, mask)  # (B, T)
    returns = zero_outside(returns, mask)  # (B, T)
    unclipped = (values - returns) ** 2  # (B, T)
    if clip_range is None:
        return 0.5 * masked_mean(unclipped, mask), {"clipfrac": 0.0}
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)  # (B, T)
    clipped = (clipped_values - returns) ** 2  # (B, T)
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).to(values.dtype), mask).item()
    return loss, {"clipfrac": clipfrac}


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean per-token entropy (B, T) over the mask (weighted as `token_mean`); the trainer subtracts
    `coef * entropy_bonus` from its loss to keep exploring (small models collapse into repeated tokens without it,
    RAGEN's "echo trap").
    """
    return token_mean(entropy, mask, weights)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from tokens sampled by the policy. -> (B, T), unmasked.

    With log r = ref_logprobs - logprobs (Schulman's estimators):
    "k1" = -log r: unbiased, can be negative, the usual reward penalty (REINFORCE++);
    "k2" = 0.5 * (log r)^2: biased, never negative, low variance;
    "k3" = (r - 1) - log r: unbiased, never negative, the usual loss term (GRPO);
    "abs" = |log r|.
    """
    log_ratio = logprobs - ref_logprobs  # (B, T) = -log r
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    if kind == "abs":
        return log_ratio.abs()
    raise ValueError(f"unknown KL estimator {kind!r}; use 'k1', 'k2', 'k3' or 'abs'")
