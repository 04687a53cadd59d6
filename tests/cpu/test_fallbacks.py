"""Every fast path falls back to plain torch, with one warning, where the CPU or the torch build cannot run it:
oneDNN's products (private ops missing, failing or giving other results; bfloat16 on a CPU without AVX-512) and
the compiled decoding kernel (no compiler, or a kernel that computes wrongly)."""

from __future__ import annotations

import copy
import ctypes
import json
import logging
import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from r1trade.cpu import decode_kernel as kernels
from r1trade.cpu import onednn
from r1trade.cpu.attention import grouped_query_attention
from r1trade.cpu.onednn import OneDNNLinear, packed_weights

WORKER = Path(__file__).parent / "fallback_worker.py"
X86 = platform.machine().lower() in ("x86_64", "amd64")
REAL_OPS = onednn._mkldnn_ops()


@pytest.fixture(autouse=True)
def fresh_support(monkeypatch):
    """Layers of any size go to oneDNN, and what oneDNN supports is found again in each test and after it."""
    monkeypatch.setattr(onednn, "MIN_WEIGHT_ELEMENTS", 0)
    onednn.reset_support()
    yield
    onednn.reset_support()


class Raising:
    """Ops that exist but fail, as they do on a CPU oneDNN has no kernel for; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def _linear_pointwise(self, *args):
        self.calls += 1
        raise RuntimeError("could not create a primitive descriptor for the inner product forward primitive")

    _reorder_linear_weight = _linear_pointwise


def _without_bias(x, weight, bias, *args):
    return REAL_OPS._linear_pointwise(x, weight, None, *args)


OPS = {  # the ops torch might offer instead, and what the warning then says
    "missing": (types.SimpleNamespace, "are not in this torch build"),
    "raising": (Raising, "fail here (RuntimeError: could not create a primitive descriptor"),
    "new signature": (lambda: types.SimpleNamespace(_linear_pointwise=lambda x, weight, bias: x), "fail here (TypeError"),
    "other results": (lambda: types.SimpleNamespace(_linear_pointwise=_without_bias), "give wrong results"),
}


def _pair() -> tuple[nn.Linear, OneDNNLinear]:
    torch.manual_seed(0)
    plain = nn.Linear(24, 40)
    fast = copy.deepcopy(plain)
    fast.__class__ = OneDNNLinear
    return plain, fast


def _sdpa_reference(query, key, value, mask, scale):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def _masked_prefill() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    query, key, value = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    mask = torch.ones(2, 1, 5, 9, dtype=torch.bool)
    mask[..., 4:] = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[0, ..., :3] = False
    return query, key, value, mask


@pytest.mark.parametrize("case", OPS)
def test_private_ops_that_are_missing_fail_or_changed_leave_torch_computing(monkeypatch, caplog, case) -> None:
    make_ops, reason = OPS[case]
    ops = make_ops()
    monkeypatch.setattr(onednn, "_mkldnn_ops", lambda: ops)
    plain, fast = _pair()
    x = torch.randn(3, 7, 24)
    x_plain, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    with caplog.at_level(logging.WARNING, logger=onednn.__name__):
        out_plain, out_fast = plain(x_plain), fast(x_fast)
        assert torch.equal(out_fast, out_plain)  # nn.Linear's own product, bit for bit
        out_plain.sum().backward()
        out_fast.sum().backward()
        assert torch.equal(x_fast.grad, x_plain.grad) and torch.equal(fast.weight.grad, plain.weight.grad)
        with torch.no_grad(), packed_weights(fast):
            assert fast.packed is None
            assert torch.equal(fast(x), plain(x).detach())
        query, key, value, mask = _masked_prefill()
        with torch.no_grad():
            out, _ = grouped_query_attention(nn.Module(), query, key, value, mask, scaling=0.3)
        torch.testing.assert_close(out, _sdpa_reference(query, key, value, mask, 0.3))
    assert not onednn.onednn_supports(torch.float32)
    assert onednn.onednn_available() == (case != "missing")
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith("oneDNN float32 products") and reason in messages[0]
    assert "torch's own" in messages[0]
    if isinstance(ops, Raising):
        assert ops.calls == 1  # tried once; never called again after the first failure


def test_without_the_packing_op_products_stay_with_onednn_on_plain_weights(monkeypatch, caplog) -> None:
    calls = []

    def linear(*args):
        calls.append(1)
        return REAL_OPS._linear_pointwise(*args)

    monkeypatch.setattr(onednn, "_mkldnn_ops", lambda: types.SimpleNamespace(_linear_pointwise=linear))
    plain, fast = _pair()
    x = torch.randn(16, 24)
    with caplog.at_level(logging.WARNING, logger=onednn.__name__), torch.no_grad(), packed_weights(fast):
        assert fast.packed is None
        torch.testing.assert_close(fast(x), plain(x), rtol=1e-5, atol=1e-5)
    support = onednn.onednn_support(torch.float32)
    assert support.products and not support.packing
    assert calls  # the product itself was oneDNN's
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and "float32 packed weights fail here (AttributeError" in messages[0]


def test_the_real_ops_are_tried_once_per_dtype(monkeypatch) -> None:
    calls = []
    probe = onednn._probe
    monkeypatch.setattr(onednn, "_probe", lambda dtype: calls.append(dtype) or probe(dtype))
    for _ in range(3):
        onednn.onednn_supports(torch.float32)
        onednn.onednn_supports(torch.bfloat16)
    assert calls == [torch.float32, torch.bfloat16]
    assert not onednn.onednn_supports(torch.float64)  # not a oneDNN type at all


@pytest.mark.skipif(not onednn.onednn_available(), reason="this torch build has no oneDNN")
def test_on_a_cpu_without_avx512_and_without_a_compiler_everything_runs_on_the_fallbacks(tmp_path) -> None:
    """oneDNN held to AVX2 has no bfloat16 products, whatever this machine's CPU: the bfloat16 model runs on
    torch's, float32 keeps oneDNN, decoding steps stay in torch, and each fallback says so in one line."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "CC": "no-such-compiler", "R1TRADE_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(WORKER)], check=False, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["float32_error"] < 1e-4 and found["bfloat16_finite"] and found["bfloat16_error"] < 0.1
    assert not found["kernel"]
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    kernel_lines = [line for line in warnings if "decoding attention stays with torch" in line]
    assert len(kernel_lines) == 1 and "no C compiler 'no-such-compiler'" in kernel_lines[0]
    if X86:
        assert found["float32_products"] and not found["bfloat16_products"]
        assert len(warnings) == 2, warnings
        assert "oneDNN bfloat16 products fail here" in "\n".join(warnings)


def test_a_kernel_that_computes_wrongly_is_not_used(monkeypatch, caplog) -> None:
    """The first step of a newly loaded kernel is checked against torch: a wrong kernel leaves attention in torch."""

    def zeros(*args):  # writes zeros where the step's output belongs
        ctypes.memset(args[14], 0, args[15] * args[16] * 2 * 16 * 4)
        return 0

    monkeypatch.setattr(kernels, "_KERNELS", {})
    monkeypatch.setattr(kernels, "_WARNED", set())
    monkeypatch.setattr(kernels, "build", lambda groups, head_dim, dtype: Path("unused.so"))
    monkeypatch.setattr(
        kernels, "_load", lambda path, groups, head_dim, dtype: kernels.DecodeKernel(groups, head_dim, zeros, dtype)
    )
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        assert kernels.decode_kernel(2, 16) is None
        assert kernels.decode_kernel(2, 16) is None
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and "gives wrong results on this CPU" in messages[0]


def test_a_kernel_built_here_passes_its_check() -> None:
    kernel = kernels.decode_kernel(3, 64)
    assert kernel is not None, "cc is on this machine: the kernel must build"
    assert kernels._checked(kernel) is kernel
