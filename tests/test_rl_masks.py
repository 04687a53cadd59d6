"""Masked reductions and whitening, checked by hand and on random masks."""

from __future__ import annotations

import pytest
import torch

from r1trade.rl.masks import masked_mean, masked_sum, masked_var, masked_whiten

NAN = float("nan")


def _x_and_mask() -> tuple[torch.Tensor, torch.Tensor]:
    # Row 0 keeps 1, 2, 3 (the 100 is an observation token); row 1 keeps only 4.
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, -7.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    return x, mask


def test_masked_sum_and_mean_by_hand() -> None:
    x, mask = _x_and_mask()
    # All kept entries: 1 + 2 + 3 + 4 = 10 over 4 entries.
    assert masked_sum(x, mask).item() == 10.0
    assert masked_mean(x, mask).item() == 2.5
    # Per row: (1 + 2 + 3) / 3 = 2 and 4 / 1 = 4.
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([2.0, 4.0]))
    # Per column: (1 + 4) / 2, 2 / 1, 3 / 1, nothing -> 0.
    torch.testing.assert_close(masked_mean(x, mask, dim=0), torch.tensor([2.5, 2.0, 3.0, 0.0]))


def test_bool_and_float_masks_agree() -> None:
    x, mask = _x_and_mask()
    assert masked_mean(x, mask.bool()).item() == masked_mean(x, mask.float()).item() == 2.5


def test_masked_var_biased_and_unbiased_by_hand() -> None:
    x, mask = _x_and_mask()
    row0 = mask.clone()
    row0[1] = 0
    # 1, 2, 3: mean 2, squared deviations 1 + 0 + 1 = 2 -> unbiased 2 / 2 = 1, biased 2 / 3.
    assert masked_var(x, row0).item() == pytest.approx(1.0)
    assert masked_var(x, row0, unbiased=False).item() == pytest.approx(2 / 3)


def test_masked_whiten_by_hand() -> None:
    x, mask = _x_and_mask()
    mask[1] = 0
    # 1, 2, 3 have mean 2 and unbiased variance 1 -> -1, 0, 1; everything outside the mask -> 0.
    expected = torch.tensor([[-1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(masked_whiten(x, mask), expected, atol=1e-6, rtol=0)
    # shift_mean=False adds the mean 2 back: 1, 2, 3.
    expected_unshifted = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    unshifted = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(unshifted, expected_unshifted, atol=1e-6, rtol=0)


def test_masked_whiten_random_gives_mean_zero_variance_one() -> None:
    generator = torch.Generator().manual_seed(0)
    x = 5 + 3 * torch.randn(6, 20, generator=generator)
    mask = torch.rand(6, 20, generator=generator) < 0.4
    whitened = masked_whiten(x, mask)
    assert masked_mean(whitened, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(whitened, mask).item() == pytest.approx(1.0, abs=1e-5)
    assert (whitened[~mask] == 0).all()


def test_all_zero_mask_gives_zeros_not_nan() -> None:
    x, _ = _x_and_mask()
    empty = torch.zeros_like(x)
    assert masked_sum(x, empty).item() == 0.0
    assert masked_mean(x, empty).item() == 0.0
    torch.testing.assert_close(masked_mean(x, empty, dim=1), torch.zeros(2))
    assert masked_var(x, empty).item() == 0.0
    assert masked_var(x, empty, unbiased=False).item() == 0.0
    torch.testing.assert_close(masked_whiten(x, empty), torch.zeros_like(x))


def test_single_entry_variance_is_zero_and_whitens_to_zero() -> None:
    x = torch.tensor([[3.0, 8.0]])
    mask = torch.tensor([[0, 1]])
    assert masked_var(x, mask).item() == 0.0
    torch.testing.assert_close(masked_whiten(x, mask), torch.zeros_like(x))


def test_nan_and_inf_outside_the_mask_reach_neither_value_nor_gradient() -> None:
    # A padded log-prob can be -inf and an injected token's value NaN (Agent-R1 issue #30).
    x = torch.tensor([[1.0, NAN, 3.0, -float("inf")]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1, 0]])
    total = masked_mean(x, mask) + masked_var(x, mask) + masked_whiten(x, mask).pow(2).sum()
    total.backward()
    assert torch.isfinite(total)
    assert torch.isfinite(x.grad).all()
    assert x.grad[0, 1] == 0 and x.grad[0, 3] == 0
