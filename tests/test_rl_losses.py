"""PPO losses, entropy bonus and KL estimators against hand-worked numbers; the loss-mask ablation."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.rl.losses import entropy_bonus, kl_penalty, policy_loss, value_loss

NAN = float("nan")


def test_policy_loss_at_ratio_one_is_minus_mean_advantage() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    advantages = torch.tensor([[1.0, -3.0, 0.5, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = policy_loss(logprobs, logprobs, advantages, mask)
    # -(1 - 3 + 0.5) / 3 = 0.5; the 100 is outside the mask.
    assert loss.item() == pytest.approx(0.5)
    assert stats == {"clipfrac": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}


def _clip_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.0]])
    old_logprobs = torch.full((1, 5), -1.0)
    logprobs = (old_logprobs + ratios.log()).requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0, 2.0, -1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    return logprobs, old_logprobs, advantages, mask


def test_policy_loss_asymmetric_clip_by_hand() -> None:
    # clip_low 0.2, clip_high 0.28: the ratio is clipped to [0.8, 1.28]. Per token max(-A*r, -A*clip(r)):
    #   A=+1, r=1.5: max(-1.5, -1.28) = -1.28  clipped (upper bound)
    #   A=-1, r=0.5: max( 0.5,  0.8 ) =  0.8   clipped (lower bound)
    #   A=+2, r=0.5: max(-1.0, -1.6 ) = -1.0   unclipped (pessimistic side)
    #   A=-1, r=1.5: max( 1.5,  1.28) =  1.5   unclipped
    # loss = (-1.28 + 0.8 - 1.0 + 1.5) / 4 = 0.005; clipfrac = 2 / 4.
    # approx_kl (k3): r=1.5 -> 0.5 - ln 1.5 = 0.0945349; r=0.5 -> -0.5 + ln 2 = 0.1931472; mean 0.1438410.
    logprobs, old_logprobs, advantages, mask = _clip_case()
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(0.005, abs=1e-6)
    assert stats["clipfrac"] == 0.5
    assert stats["approx_kl"] == pytest.approx((2 * (0.5 - math.log(1.5)) + 2 * (-0.5 + math.log(2))) / 4)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    # Clipped tokens get no gradient; unclipped ones get -A * r / 4 (d r / d logprob = r); none outside
    # the mask.
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -2.0 * 0.5 / 4, 1.0 * 1.5 / 4, 0.0]]))


def test_policy_loss_symmetric_clip_differs_only_where_the_bound_moves() -> None:
    # With clip_high 0.2 the first token gives -1.2 instead of -1.28:
    # loss = (-1.2 + 0.8 - 1.0 + 1.5) / 4 = 0.025.
    logprobs, old_logprobs, advantages, mask = _clip_case()
    loss, _ = policy_loss(logprobs, old_logprobs, advantages, mask)
    assert loss.item() == pytest.approx(0.025, abs=1e-6)


def test_policy_loss_ignores_nan_outside_the_mask() -> None:
    # An injected token whose log-prob is NaN or -inf must not poison the loss or its gradient (Agent-R1 #30).
    logprobs = torch.tensor([[-1.0, NAN, -2.0, -float("inf")]], requires_grad=True)
    old_logprobs = torch.tensor([[-1.1, NAN, -1.9, 0.0]])
    advantages = torch.tensor([[1.0, NAN, -1.0, 2.0]])
    mask = torch.tensor([[1, 0, 1, 0]])
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask)
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(value) for value in stats.values())
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad[0, 1] == 0 and logprobs.grad[0, 3] == 0


def test_losses_with_an_all_zero_mask_are_zero_not_nan() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    empty = torch.zeros(2, 3)
    loss, stats = policy_loss(x, x.detach() + 0.3, torch.ones(2, 3), empty)
    v_loss, v_stats = value_loss(x, torch.zeros(2, 3), torch.ones(2, 3), empty)
    (loss + v_loss + entropy_bonus(x, empty)).backward()
    assert loss.item() == 0.0 and v_loss.item() == 0.0
    assert stats == {"clipfrac": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0}
    assert v_stats == {"clipfrac": 0.0}
    assert (x.grad == 0).all()


def test_value_loss_clipped_case_by_hand() -> None:
    # clip_range 0.2, per token 0.5 * max((v - R)^2, (v_clip - R)^2):
    #   old 1, v 1.5, R 2: v_clip = 1.2 -> max(0.25, 0.64) = 0.64 (clipped term larger)
    #   old 1, v 1.5, R 1: v_clip = 1.2 -> max(0.25, 0.04) = 0.25
    #   old 0, v -0.1, R 0: inside the range -> 0.01
    # loss = 0.5 * (0.64 + 0.25 + 0.01) / 3 = 0.15; clipfrac 1 / 3. Without clipping: 0.5 * 0.51 / 3 = 0.085.
    values = torch.tensor([[1.5, 1.5, -0.1, 42.0]], requires_grad=True)
    old_values = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old_values, returns, mask, clip_range=0.2)
    assert loss.item() == pytest.approx(0.15)
    assert stats["clipfrac"] == pytest.approx(1 / 3)
    # The clipped token has no gradient (v_clip is flat there); the others get (v - R) / 3.
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.5 / 3, -0.1 / 3, 0.0]]))
    unclipped, unclipped_stats = value_loss(values, old_values, returns, mask, clip_range=None)
    assert unclipped.item() == pytest.approx(0.085)
    assert unclipped_stats == {"clipfrac": 0.0}


def test_entropy_bonus_is_masked_mean() -> None:
    entropy = torch.tensor([[2.0, 9.0, 1.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    assert entropy_bonus(entropy, mask).item() == pytest.approx(2.0)  # (2 + 1 + 3) / 3


def test_kl_penalty_estimators_by_hand() -> None:
    # Policy prob 0.5, reference 0.25: log(p / p_ref) = ln 2; r = p_ref / p = 0.5.
    # k1 = ln 2 = 0.693147; k2 = 0.5 * ln(2)^2 = 0.240227; k3 = (0.5 - 1) + ln 2 = 0.193147; abs = ln 2.
    # The reverse (p 0.25, p_ref 0.5): k1 = -ln 2, k2 the same, k3 = (2 - 1) - ln 2 = 0.306853, abs = ln 2.
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5)]])
    ln2 = math.log(2)
    expected = {
        "k1": [ln2, -ln2],
        "k2": [0.5 * ln2**2, 0.5 * ln2**2],
        "k3": [-0.5 + ln2, 1 - ln2],
        "abs": [ln2, ln2],
    }
    for kind, values in expected.items():
        torch.testing.assert_close(kl_penalty(logprobs, ref_logprobs, kind), torch.tensor([values]))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logprobs, ref_logprobs, "k4")  # type: ignore[arg-type]


def test_k1_and_k3_are_unbiased_estimators_of_kl() -> None:
    # Sample tokens from p; the mean of k1 and k3 approaches the exact KL(p || q).
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    exact = float((p * (p / q).log()).sum())
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=generator)
    logprobs, ref_logprobs = p.log()[tokens][None], q.log()[tokens][None]
    assert kl_penalty(logprobs, ref_logprobs, "k1").mean().item() == pytest.approx(exact, rel=0.03)
    k3 = kl_penalty(logprobs, ref_logprobs, "k3")
    assert k3.mean().item() == pytest.approx(exact, rel=0.03)
    assert (k3 >= 0).all()


class _TinyLM(torch.nn.Module):
    """Embedding -> linear: next-token logits from the current token; real logits to differentiate."""

    def __init__(self, vocab: int = 11, width: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))  # (B, T, V)


@pytest.mark.parametrize("which", ["action", "valid"])
def test_loss_mask_keeps_observation_tokens_out_of_the_gradient(which: str) -> None:
    # Tokens of a 2-row trajectory: prompt | action | observation | action | padding. Masks are over the
    # predicted tokens (input_ids[:, 1:]). With the action mask, observation logits get exactly zero
    # gradient; with the valid (attention) mask they get some (the loss-mask ablation; RAGEN issue #54).
    torch.manual_seed(0)
    model = _TinyLM()
    input_ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0], [1, 8, 9, 4, 5, 10, 0, 0]])
    targets = input_ids[:, 1:]  # (B, T)
    action_mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 1, 0, 0]])
    valid_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
    observation = (valid_mask == 1) & (action_mask == 0)  # (B, T)

    logits = model(input_ids[:, :-1])  # (B, T, V)
    logits.retain_grad()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)  # (B, T)
    advantages = torch.linspace(-1.0, 1.0, targets.numel()).view_as(targets)  # non-zero on every token
    mask = action_mask if which == "action" else valid_mask
    loss, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask)
    loss.backward()

    observation_grad = logits.grad[observation].abs().sum()  # over (tokens, V)
    action_grad = logits.grad[action_mask.bool()].abs().sum()
    padding_grad = logits.grad[valid_mask == 0].abs().sum()
    assert action_grad > 0
    assert padding_grad == 0
    if which == "action":
        assert observation_grad == 0
    else:
        assert observation_grad > 0
