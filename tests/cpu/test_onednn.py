"""oneDNN linear layers: same outputs and gradients as `nn.Linear`, packed weights only inside their context."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from r1trade.config import ModelConfig
from r1trade.cpu import onednn
from r1trade.cpu.onednn import OneDNNLinear, onednn_available, packed_weights, use_onednn_linears
from r1trade.models.loading import load_agent_models

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture(autouse=True)
def small_weights_too(request, monkeypatch):
    """The test layers are small: let oneDNN compute them anyway (except where a test checks the size rule)."""
    if "size_rule" not in request.node.name:
        monkeypatch.setattr(onednn, "MIN_WEIGHT_ELEMENTS", 0)


def pair(bias: bool = True, seed: int = 0) -> tuple[nn.Linear, OneDNNLinear]:
    torch.manual_seed(seed)
    plain = nn.Linear(24, 40, bias=bias)
    fast = use_onednn_linears(nn.Sequential(copy.deepcopy(plain)))[0]
    assert type(fast) is OneDNNLinear
    return plain, fast


@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_gradients_match_nn_linear(bias, monkeypatch):
    onednn.onednn_supports(torch.float32)  # the first use tries the products once: not counted below
    calls = []
    product = onednn.onednn_linear
    monkeypatch.setattr(onednn, "onednn_linear", lambda *args: calls.append(1) or product(*args))
    plain, fast = pair(bias)
    x = torch.randn(3, 7, 24)  # (batch, tokens, features): the weight gradient sums over both leading axes
    x_plain, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    grad = torch.randn(3, 7, 40)
    out_plain, out_fast = plain(x_plain), fast(x_fast)
    torch.testing.assert_close(out_fast, out_plain, rtol=1e-5, atol=1e-5)
    out_plain.backward(grad)
    out_fast.backward(grad)
    torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(fast.bias.grad, plain.bias.grad, rtol=1e-5, atol=1e-5)
    assert len(calls) == 3  # the forward product and the two of the backward pass were oneDNN's


def test_gradient_flows_to_the_input_of_a_frozen_layer():
    """LoRA freezes the base weights; the input still needs its gradient and the weight gets none."""
    plain, fast = pair()
    for layer in (plain, fast):
        layer.requires_grad_(False)
    x_plain, x_fast = torch.randn(5, 24, requires_grad=True), torch.randn(5, 24, requires_grad=True)
    with torch.no_grad():
        x_fast.copy_(x_plain)
    plain(x_plain).square().sum().backward()
    fast(x_fast).square().sum().backward()
    torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=1e-5, atol=1e-5)
    assert fast.weight.grad is None


def test_packed_weights_give_the_same_outputs_and_are_dropped_on_exit():
    plain, fast = pair()
    model = nn.Sequential(fast)
    x = torch.randn(16, 24)
    with torch.no_grad(), packed_weights(model):
        assert fast.packed is not None
        packed_out = fast(x)
        with torch.enable_grad():  # a gradient pass inside still uses (and differentiates) the real weight
            x_grad = x.clone().requires_grad_()
            fast(x_grad).sum().backward()
    assert fast.packed is None and "packed" not in fast.__dict__
    torch.testing.assert_close(packed_out, plain(x).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x_grad.grad, plain.weight.sum(dim=0).detach().expand(16, -1), rtol=1e-5, atol=1e-5)


def test_packed_weights_are_dropped_when_the_body_raises():
    _, fast = pair()
    with pytest.raises(RuntimeError, match="boom"), packed_weights(fast):
        raise RuntimeError("boom")
    assert fast.packed is None


def test_size_rule_small_weights_stay_with_nn_linear():
    """Below `MIN_WEIGHT_ELEMENTS` (LoRA adapters, the value head) oneDNN's call overhead outweighs its speed."""
    plain, fast = pair()
    x = torch.randn(4, 24)
    assert torch.equal(fast(x), plain(x))  # torch's own product, bit for bit
    with torch.no_grad(), packed_weights(fast):
        assert fast.packed is None  # nothing to pack either


def test_other_dtypes_fall_back_to_nn_linear():
    plain, fast = pair()
    plain.double(), fast.double()
    x = torch.randn(4, 24, dtype=torch.float64)
    assert torch.equal(fast(x), plain(x))  # float64 is not a oneDNN type here: torch's own product, bit for bit


def test_tiny_agent_with_and_without_the_cpu_kernels_agrees():
    """Same logits and same gradients, and the state dict (hence checkpoints) is unchanged."""
    config = ModelConfig(name_or_path="tiny-random", lora={"enabled": False})
    fast = load_agent_models(config, seed=0)
    plain = load_agent_models(config.model_copy(update={"cpu_kernels": "off"}), seed=0)
    assert any(isinstance(m, OneDNNLinear) for m in fast.policy.modules())
    assert not any(isinstance(m, OneDNNLinear) for m in plain.policy.modules())
    assert fast.policy.state_dict().keys() == plain.policy.state_dict().keys()
    ids = torch.randint(3, len(fast.tokenizer), (2, 12))
    logits = {}
    for name, models in (("fast", fast), ("plain", plain)):
        out = models.policy(input_ids=ids).logits
        out.logsumexp(dim=-1).sum().backward()
        logits[name] = out.detach()
    torch.testing.assert_close(logits["fast"], logits["plain"], rtol=1e-4, atol=1e-5)
    for (name, p_fast), p_plain in zip(fast.policy.named_parameters(), plain.policy.parameters(), strict=True):
        torch.testing.assert_close(p_fast.grad, p_plain.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_lora_adapters_and_value_head_are_onednn_too():
    models = load_agent_models(ModelConfig(name_or_path="tiny-random"), seed=0)
    names = {name for name, m in models.policy.named_modules() if isinstance(m, OneDNNLinear)}
    assert any("lora_A" in name for name in names) and any("base_layer" in name for name in names)
    assert not any(type(m) is nn.Linear for m in models.critic.modules())
