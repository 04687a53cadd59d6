"""Advantage estimators against hand-worked numbers, a textbook GAE on compressed rows, and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.rl.advantages import (
    explained_variance,
    gae,
    group_relative,
    keep_top_groups_by_std,
    reinforce_pp_advantages,
    reinforce_pp_returns,
)
from r1trade.rl.masks import masked_mean, masked_var

# One row of four tokens with an observation hole at index 1 (Stable-Baselines3 test_gae.py style).
REWARDS = torch.tensor([[0.0, 0.0, 0.5, 1.0]])
VALUES = torch.tensor([[0.2, 0.7, 0.4, 0.6]])
ACTION_MASK = torch.tensor([[1, 0, 1, 1]])


def _textbook_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Plain GAE on one terminated sequence, written independently of the module under test."""
    advantages = [0.0] * len(rewards)
    next_value, next_advantage = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        next_advantage = delta + gamma * lam * next_advantage
        next_value = values[t]
        advantages[t] = next_advantage
    return advantages


@pytest.mark.parametrize(
    ("gamma", "lam", "advantages"),
    [
        # Action tokens 0, 2, 3: r = 0, 0.5, 1; V = 0.2, 0.4, 0.6; next V = 0.4, 0.6, 0
        # (the obs value 0.7 is skipped). gamma=0.9, lam=0.8: deltas d0 = 0 + 0.9*0.4 - 0.2 = 0.16,
        # d2 = 0.5 + 0.9*0.6 - 0.4 = 0.64, d3 = 1 - 0.6 = 0.4;
        # gamma*lam = 0.72: A3 = 0.4, A2 = 0.64 + 0.72*0.4 = 0.928, A0 = 0.16 + 0.72*0.928 = 0.82816.
        (0.9, 0.8, [0.82816, 0.0, 0.928, 0.4]),
        # gamma=1, lam=1: A = reward-to-go - V: rtg = 1.5, 1.5, 1.0 -> 1.5-0.2, 1.5-0.4, 1.0-0.6.
        (1.0, 1.0, [1.3, 0.0, 1.1, 0.4]),
        # lam=0: A = TD error: 0.16, 0.64, 0.4 (as above).
        (0.9, 0.0, [0.16, 0.0, 0.64, 0.4]),
        # gamma=0.5, lam=1 (Monte-Carlo): G3 = 1, G2 = 0.5 + 0.5*1 = 1, G0 = 0 + 0.5*1 = 0.5
        # -> G - V = 0.3, 0.6, 0.4.
        (0.5, 1.0, [0.3, 0.0, 0.6, 0.4]),
    ],
)
def test_gae_over_action_tokens_by_hand(gamma: float, lam: float, advantages: list[float]) -> None:
    got_advantages, got_returns = gae(REWARDS, VALUES, ACTION_MASK, gamma, lam)
    expected = torch.tensor([advantages])
    torch.testing.assert_close(got_advantages, expected)
    # Returns = A + V on action tokens, 0 on the observation token.
    torch.testing.assert_close(got_returns, (expected + VALUES) * ACTION_MASK)


def test_gae_without_advantage_mask_by_hand_and_padding_skipped() -> None:
    # Ablation: every valid token takes part, so the obs token (V = 0.7) enters the recursion. A 5th
    # padding token with a garbage value 5.0 must change nothing. gamma=0.9, lam=0.8:
    # d3 = 1 - 0.6 = 0.4, d2 = 0.5 + 0.9*0.6 - 0.4 = 0.64, d1 = 0 + 0.9*0.4 - 0.7 = -0.34,
    # d0 = 0 + 0.9*0.7 - 0.2 = 0.43;
    # A3 = 0.4, A2 = 0.928, A1 = -0.34 + 0.72*0.928 = 0.32816, A0 = 0.43 + 0.72*0.32816 = 0.6662752.
    rewards = torch.tensor([[0.0, 0.0, 0.5, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.7, 0.4, 0.6, 5.0]])
    action_mask = torch.tensor([[1, 0, 1, 1, 0]])
    valid_mask = torch.tensor([[1, 1, 1, 1, 0]])
    advantages, returns = gae(
        rewards, values, action_mask, 0.9, 0.8, advantage_mask=False, valid_mask=valid_mask
    )
    expected = torch.tensor([[0.6662752, 0.32816, 0.928, 0.4, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.tensor([[0.8662752, 1.02816, 1.328, 1.0, 0.0]]))


def test_gae_without_advantage_mask_skips_left_padding() -> None:
    left_padded = gae(
        torch.tensor([[0.0, 0.0, 1.0]]),
        torch.tensor([[9.0, 0.5, 0.1]]),
        torch.tensor([[0, 1, 1]]),
        0.9,
        0.8,
        advantage_mask=False,
        valid_mask=torch.tensor([[0, 1, 1]]),
    )[0]
    unpadded, _ = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.1]]), torch.ones(1, 2), 0.9, 0.8)
    torch.testing.assert_close(left_padded[:, 1:], unpadded)
    assert left_padded[0, 0] == 0


def test_gae_without_advantage_mask_needs_valid_mask() -> None:
    with pytest.raises(ValueError, match="valid_mask"):
        gae(REWARDS, VALUES, ACTION_MASK, 0.9, 0.8, advantage_mask=False)


@pytest.mark.parametrize("seed", range(8))
def test_gae_equals_textbook_gae_on_compressed_rows(seed: int) -> None:
    # Agent-R1's recipe: compress the action tokens, run plain GAE, scatter back.
    generator = torch.Generator().manual_seed(seed)
    batch, length = 6, 17
    action_mask = torch.rand(batch, length, generator=generator) < 0.5
    action_mask[0] = False  # a row without action tokens
    action_mask[1] = True  # a row of action tokens only
    rewards = torch.randn(batch, length, generator=generator) * action_mask
    values = torch.randn(batch, length, generator=generator)
    gamma, lam = [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.7, 0.5)][seed % 4]

    advantages, returns = gae(rewards, values, action_mask, gamma, lam)

    expected = torch.zeros(batch, length)
    for row, keep in enumerate(action_mask):  # each row's action tokens alone, then back in their places
        textbook = _textbook_gae(rewards[row, keep].tolist(), values[row, keep].tolist(), gamma, lam)
        expected[row, keep] = torch.tensor(textbook)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(action_mask, expected + values, 0.0))


def test_gae_reward_on_observation_token_goes_to_preceding_action() -> None:
    # 0.3 on the obs token (index 1) counts as the reward of action token 0.
    on_obs = torch.tensor([[0.0, 0.3, 0.5, 1.0]])
    on_action = torch.tensor([[0.3, 0.0, 0.5, 1.0]])
    torch.testing.assert_close(
        gae(on_obs, VALUES, ACTION_MASK, 0.9, 0.8), gae(on_action, VALUES, ACTION_MASK, 0.9, 0.8)
    )
    # Same in the ablation, with the obs token marked as padding so that it is outside the used mask.
    ablation = {"advantage_mask": False, "valid_mask": ACTION_MASK}
    torch.testing.assert_close(
        gae(on_obs, VALUES, ACTION_MASK, 0.9, 0.8, **ablation),
        gae(on_action, VALUES, ACTION_MASK, 0.9, 0.8, **ablation),
    )


def test_gae_reward_before_first_action_token_is_an_error() -> None:
    with pytest.raises(ValueError, match="before the first token"):
        gae(torch.tensor([[1.0, 0.0, 0.0]]), torch.zeros(1, 3), torch.tensor([[0, 1, 1]]), 0.9, 0.8)


def test_gae_all_zero_mask_and_garbage_outside_give_finite_zeros() -> None:
    values = torch.tensor([[float("nan"), float("inf"), 1.0]])
    advantages, returns = gae(torch.zeros(1, 3), values, torch.zeros(1, 3), 0.9, 0.8)
    torch.testing.assert_close(advantages, torch.zeros(1, 3))
    torch.testing.assert_close(returns, torch.zeros(1, 3))


def test_gae_carries_no_gradient() -> None:
    values = VALUES.clone().requires_grad_(True)
    advantages, returns = gae(REWARDS, values, ACTION_MASK, 0.9, 0.8)
    assert not advantages.requires_grad and not returns.requires_grad


def test_grpo_baseline_two_groups_by_hand() -> None:
    # Group 7: scores 1, 0, 2 -> mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1 -> A = 0, -1, 1.
    # Group 3: scores 4, 6 -> mean 5, unbiased std sqrt((1 + 1) / 1) = sqrt(2) -> A = -1/sqrt2, 1/sqrt2
    # (the population std would be 1 and give -1, 1). Group 9: one sample -> 0.
    scores = torch.tensor([1.0, 4.0, 0.0, 5.0, 6.0, 2.0])
    group_ids = torch.tensor([7, 3, 7, 9, 3, 7])
    advantages = group_relative(scores, group_ids, "mean_std", eps=0.0)
    torch.testing.assert_close(advantages, torch.tensor([0.0, -1 / math.sqrt(2), -1.0, 0.0, 1 / math.sqrt(2), 1.0]))
    # Without the std (Dr. GRPO): score - group mean = 0, -1, -1, 0, 1, 1.
    centred = group_relative(scores, group_ids, "mean")
    torch.testing.assert_close(centred, torch.tensor([0.0, -1.0, -1.0, 0.0, 1.0, 1.0]))


def test_grpo_baseline_equal_scores_give_zero() -> None:
    for eps in (1e-6, 0.0):
        advantages = group_relative(torch.tensor([0.1, 0.1, 0.1]), torch.zeros(3, dtype=torch.long), eps=eps)
        assert (advantages == 0).all()


def test_reinforce_pp_returns_by_hand() -> None:
    # Action tokens 0, 1, 3 (index 2 is an observation), outcome reward 1 on the last token, gamma = 0.9:
    # G3 = 1, G1 = 0 + 0.9*1 = 0.9, G0 = 0 + 0.9*0.9 = 0.81.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    action_mask = torch.tensor([[1, 1, 0, 1]])
    torch.testing.assert_close(
        reinforce_pp_returns(rewards, action_mask, 0.9), torch.tensor([[0.81, 0.9, 0.0, 1.0]])
    )
    # KL 0.1, 0.2, (5.0 on the obs token: ignored), 0.1 with kl_coef 0.5 -> shaped rewards -0.05, -0.1, 0.95:
    # G3 = 0.95, G1 = -0.1 + 0.9*0.95 = 0.755, G0 = -0.05 + 0.9*0.755 = 0.6295.
    kl = torch.tensor([[0.1, 0.2, 5.0, 0.1]])
    torch.testing.assert_close(
        reinforce_pp_returns(rewards, action_mask, 0.9, kl=kl, kl_coef=0.5),
        torch.tensor([[0.6295, 0.755, 0.0, 0.95]]),
    )


def test_reinforce_pp_advantages_are_whitened_over_the_batch() -> None:
    # Row 0 returns 0.81, 0.9, 1 (as above); row 1 returns 0, 0 (no reward): five action tokens in all.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    action_mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])
    advantages = reinforce_pp_advantages(rewards, action_mask, 0.9)
    returns = torch.tensor([0.81, 0.9, 1.0, 0.0, 0.0])
    expected = (returns - returns.mean()) / returns.std()
    torch.testing.assert_close(advantages[action_mask.bool()], expected, atol=1e-5, rtol=1e-5)
    assert (advantages[~action_mask.bool()] == 0).all()
    assert masked_mean(advantages, action_mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(advantages, action_mask).item() == pytest.approx(1.0, abs=1e-5)


def test_explained_variance() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == 1.0
    # A constant critic at the mean explains nothing: Var(R - 2) = Var(R).
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    # Errors 1, 0, -1 (variance 1) against returns of variance 1 -> 0; errors 0.5, 0, -0.5 -> 1 - 0.25 = 0.75.
    assert explained_variance(torch.tensor([[1.5, 2.0, 2.5, 0.0]]), returns, mask) == pytest.approx(0.75)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask))


def test_keep_top_groups_by_std() -> None:
    # Group stds (unbiased): g0 [1, 1] -> 0; g1 [0, 2] -> sqrt2; g2 [0, 4] -> 2*sqrt2;
    # g3 [0, 2] -> sqrt2 (a tie with g1).
    scores = torch.tensor([1.0, 1.0, 0.0, 2.0, 0.0, 4.0, 0.0, 2.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])

    def kept(keep_frac: float) -> list[int]:
        return sorted(set(group_ids[keep_top_groups_by_std(scores, group_ids, keep_frac)].tolist()))

    assert kept(0.25) == [2]
    assert kept(0.5) == [1, 2]  # g1 beats g3 on the tie: smaller id
    assert kept(0.6) == [1, 2, 3]  # ceil(0.6 * 4) = 3
    assert kept(0.01) == [2]  # at least one group
    assert kept(1.0) == [0, 1, 2, 3]
    mask = keep_top_groups_by_std(scores, group_ids, 0.25)
    assert mask.dtype == torch.bool and mask.tolist() == [False] * 4 + [True, True] + [False] * 2
    with pytest.raises(ValueError, match="keep_frac"):
        keep_top_groups_by_std(scores, group_ids, 0.0)


def test_keep_top_groups_by_std_tie_order_is_by_id_not_position() -> None:
    # Same scores, groups listed in a different order: the choice must not change.
    scores = torch.tensor([0.0, 2.0, 0.0, 2.0])
    kept = keep_top_groups_by_std(scores, torch.tensor([5, 5, 4, 4]), 0.5)
    assert kept.tolist() == [False, False, True, True]
