"""Linear layers on CPU through oneDNN rather than torch's default BLAS.

torch sends a float32 `nn.Linear` on CPU to MKL's SGEMM. On AMD CPUs MKL does not use its AVX-512 kernels: on this
machine's 2 Zen 5 cores SGEMM reaches ~200 GFLOP/s where oneDNN's JIT kernels, also shipped inside torch, reach
~500 (`docs/benchmarks.md`). `OneDNNLinear` is an `nn.Linear` whose products go through oneDNN on CPU:
- with gradients, through an autograd function whose backward is two more oneDNN products;
- without, on the plain weight, or on a copy pre-arranged in oneDNN's blocked layout inside `packed_weights`
  (faster again for the few-row products of decoding steps, which are bound by reading the weights).
Anything else (another device, another dtype, a weight under `MIN_WEIGHT_ELEMENTS`: a oneDNN call costs ~10 µs
more, which small products such as LoRA adapters do not earn back) runs `nn.Linear`'s own forward. Results match
torch's to float32 rounding (products summed in another order).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

_DTYPES = (torch.float32, torch.bfloat16)
MIN_WEIGHT_ELEMENTS = 1 << 16
"""Smallest weight computed by oneDNN (SmolLM2-135M's smallest projection has 110,592 elements)."""


def onednn_available() -> bool:
    """True when this torch build has oneDNN (every official x86 and ARM CPU build does)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` by oneDNN; `weight` is (out, in), plain (any strides) or packed by `_pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in oneDNN's blocked layout: only `onednn_linear` can read the result."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


class _LinearFunction(torch.autograd.Function):
    """`x @ weight.T + bias` with its backward, every product by oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        rows = grad.reshape(-1, grad.shape[-1])  # (N, out)
        if ctx.needs_input_grad[0]:
            grad_x = onednn_linear(grad, weight.t())  # grad @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = onednn_linear(rows.t(), x.reshape(-1, x.shape[-1]).t())  # gradᵀ @ x, (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(dim=0)
        return grad_x, grad_weight, grad_bias


class OneDNNLinear(nn.Linear):
    """`nn.Linear` computed by oneDNN on CPU (same parameters, same state dict)."""

    packed: torch.Tensor | None = None
    """The weight in oneDNN's blocked layout while `packed_weights` is active."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if not _suits_onednn(weight) or weight.dtype != x.dtype:
            return super().forward(x)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or _requires_grad(self.bias)):
            return _LinearFunction.apply(x, weight, self.bias)
        return onednn_linear(x, self.packed if self.packed is not None else weight, self.bias)


def onednn_computes(tensor: torch.Tensor) -> bool:
    """True when oneDNN's products take `tensor`: a float32 or bfloat16 tensor on CPU, in a build with oneDNN."""
    return tensor.device.type == "cpu" and tensor.dtype in _DTYPES and onednn_available()


def has_dense_rows(tensor: torch.Tensor) -> bool:
    """True when every (L, D) block of `tensor` (…, L, D) is dense: each row's D numbers contiguous and the rows
    back to back (a cache buffer's slice is; keys viewed out of a projection, strided across heads, are not)."""
    return tensor.stride(-1) == 1 and (tensor.shape[-2] <= 1 or tensor.stride(-2) == tensor.shape[-1])


def _suits_onednn(weight: torch.Tensor) -> bool:
    return weight.numel() >= MIN_WEIGHT_ELEMENTS and onednn_computes(weight)


def _requires_grad(tensor: torch.Tensor | None) -> bool:
    return tensor is not None and tensor.requires_grad


def use_onednn_linears(model: nn.Module) -> nn.Module:
    """Make every plain `nn.Linear` in `model` a `OneDNNLinear` in place (a no-op without oneDNN); return `model`."""
    if onednn_available():
        for module in model.modules():
            if type(module) is nn.Linear:
                module.__class__ = OneDNNLinear
    return model


@contextmanager
def packed_weights(model: nn.Module) -> Iterator[None]:
    """Inside, `model`'s oneDNN linears compute without gradients from packed copies of their weights.

    Packing all of SmolLM2-135M takes ~0.2 s and as much memory again as its weights; the copies are dropped on
    exit. The weights must not change inside (a rollout or a scoring pass; an optimiser step belongs outside).
    """
    layers = [m for m in model.modules() if isinstance(m, OneDNNLinear) and _suits_onednn(m.weight)]
    try:
        for layer in layers:
            layer.packed = _pack(layer.weight)
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("packed", None)
