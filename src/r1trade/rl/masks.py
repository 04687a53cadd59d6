"""Masked reductions and whitening of (B, T) token tensors.

A mask is binary (bool, or a 0/1 float/int tensor; any non-zero entry counts as 1). Entries outside the
mask are never read: they may hold anything, even NaN or inf (a padded log-prob, an injected token), and
neither the result nor its gradient sees them. Reductions over an empty mask return 0 instead of NaN, so a
batch with no action tokens contributes nothing to a loss rather than poisoning it.
"""

from __future__ import annotations

import torch


def zero_outside(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`x` with mask-0 entries replaced by 0, so later arithmetic (and its gradient) never meets them."""
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over mask-1 entries, over everything (`dim=None`) or along `dim`."""
    kept = zero_outside(x, mask)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over mask-1 entries; 0 where the mask selects nothing."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the mask-1 entries of `x` (a scalar).

    `unbiased=True` divides by n - 1 (Bessel). Defined as 0 when there are too few entries to measure a
    spread: n = 0, or n = 1 with `unbiased=True`.
    """
    x = zero_outside(x, mask)
    mean = masked_mean(x, mask)
    sum_sq = masked_sum((x - mean) ** 2, mask)
    count = mask.bool().sum()
    denominator = count - 1 if unbiased else count
    return sum_sq / denominator.clamp(min=1).to(x.dtype)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise the mask-1 entries of `x` to mean 0 and unbiased variance 1; other entries become 0.

    Statistics come from the mask-1 entries only, so padding and observation tokens cannot skew them.
    `shift_mean=False` keeps the original mean (scales the spread only). An all-zero mask gives zeros.
    """
    x = zero_outside(x, mask)
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return zero_outside(whitened, mask)
