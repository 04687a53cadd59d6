"""Scoring: token log-probs and entropy equal a full log-softmax, in chunks, with padding, gradients and a value head
sharing the policy's forward pass."""

from __future__ import annotations

import pytest
import torch
from agent_fixtures import TEXTS, TOOL_CALL, batch, perturb_trainable, tiny_config

from r1trade.models.agent_models import trainable_parameters
from r1trade.models.loading import load_agent_models
from r1trade.models.scoring import backbone_hidden, causal_lm, token_logprobs, token_logprobs_and_entropy


def naive_logprobs(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-vocabulary log_softmax and gather on an unpadded batch, and the entropy. -> (B, T), (B, T)"""
    logits = model(input_ids=input_ids).logits[:, :-1].float()  # (B, T-1, V)
    logps = logits.log_softmax(-1)  # (B, T-1, V)
    picked = logps.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    entropy = -(logps.exp() * logps).sum(-1)  # (B, T-1)
    pad = torch.nn.functional.pad
    return pad(picked, (1, 0)), pad(entropy, (1, 0))


# --------------------------------------------------------------------------- token log-probs


@pytest.mark.parametrize("chunk_size", [1, 7, 10_000])
def test_token_logprobs_equal_a_full_log_softmax_gather(chunk_size: int) -> None:
    models = load_agent_models(tiny_config(), seed=0)
    perturb_trainable(models.policy)
    ids = models.tokenizer(TOOL_CALL, return_tensors="pt")["input_ids"][0]
    ids = torch.stack([ids, ids.flip(0)])  # (2, T), no padding
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected, expected_entropy = naive_logprobs(models.policy, ids)
        logprobs, entropy = token_logprobs_and_entropy(models.policy, ids, mask, chunk_size=chunk_size)
        only = token_logprobs(models.policy, ids, mask, chunk_size=chunk_size)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-5)
    torch.testing.assert_close(only, logprobs, rtol=0, atol=0)
    assert logprobs.shape == ids.shape and (logprobs[:, 0] == 0).all()


def test_token_mask_and_temperature() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    ids, mask = batch(models, TEXTS)
    token_mask = torch.zeros_like(mask)
    token_mask[:, -4:] = 1
    with torch.no_grad():
        full = token_logprobs(models.policy, ids, mask)
        some = token_logprobs(models.policy, ids, mask, token_mask=token_mask, chunk_size=3)
        hot = token_logprobs(models.policy, ids, mask, temperature=2.0)
        logits = models.policy(input_ids=ids[:1]).logits[0, -2].float()  # row 0 is the longest: no padding
    torch.testing.assert_close(some[:, -4:], full[:, -4:], rtol=0, atol=1e-6)
    assert (some[:, :-4] == 0).all()
    expected_hot = (logits / 2.0).log_softmax(-1)[ids[0, -1]]
    torch.testing.assert_close(hot[0, -1], expected_hot, rtol=0, atol=1e-5)


def test_left_padding_changes_no_logprob_or_value() -> None:
    models = load_agent_models(tiny_config(critic="separate"), seed=0)
    perturb_trainable(models.policy)
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        padded = token_logprobs(models.policy, ids, mask)
        padded_values = models.critic(ids, mask)
        for row, text in enumerate(TEXTS):
            alone = models.tokenizer(text, return_tensors="pt")["input_ids"]
            n = alone.shape[1]
            ones = torch.ones_like(alone)
            torch.testing.assert_close(padded[row, -n:], token_logprobs(models.policy, alone, ones)[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(padded_values[row, -n:], models.critic(alone, ones)[0], atol=1e-5, rtol=0)
            assert (padded[row, :-n] == 0).all()


def test_chunked_gradients_equal_the_naive_gradients() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    perturb_trainable(models.policy)
    ids = models.tokenizer([TOOL_CALL], return_tensors="pt")["input_ids"]
    params = trainable_parameters(models)["policy"]

    naive, _ = naive_logprobs(models.policy, ids)
    expected = torch.autograd.grad(naive.sum(), params)
    logprobs, entropy = token_logprobs_and_entropy(models.policy, ids, torch.ones_like(ids), chunk_size=5)
    grads = torch.autograd.grad(logprobs.sum(), params)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert entropy.requires_grad


@pytest.mark.parametrize("share_prefix", [False, True])
def test_gradient_checkpointing_recomputes_each_layer_and_gives_the_same_gradients(share_prefix: bool) -> None:
    """The policy stays in eval mode, as the trainer keeps it: checkpointing must still happen (each layer's
    attention runs again in the backward pass) and leave the gradients as they were."""
    grads, calls = [], []
    for checkpointing in (False, True):
        models = load_agent_models(tiny_config(gradient_checkpointing=checkpointing), seed=0)
        perturb_trainable(models.policy)
        assert not models.policy.training
        ids, mask = batch(models, TEXTS)
        attention = causal_lm(models.policy).get_decoder().layers[0].self_attn
        count = []
        hook = attention.register_forward_hook(lambda *_: count.append(1))
        loss = token_logprobs(models.policy, ids, mask, share_prefix=share_prefix).sum()
        grads.append(torch.autograd.grad(loss, trainable_parameters(models)["policy"]))
        hook.remove()
        calls.append(len(count))
        assert not any(m.training for m in models.policy.modules())  # eval mode is left as it was
    assert calls == [1, 2]  # checkpointed: the forward pass, then its recomputation in the backward pass
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, checkpointed, rtol=1e-5, atol=1e-7)


def test_value_head_critic_shares_the_policy_forward() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        hidden = backbone_hidden(models.policy, ids, mask)  # (B, T, H)
        values = models.critic(ids, mask)
        shared = models.critic(ids, mask, hidden=hidden)
    assert models.critic.shares_policy_backbone
    assert hidden.shape == (*ids.shape, 64)
    assert values.shape == ids.shape and values.dtype == torch.float32
    torch.testing.assert_close(values, shared, rtol=0, atol=0)
    assert list(models.critic.state_dict()) == ["head.weight", "head.bias"]
