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

The products are torch's private ops (`torch.ops.mkldnn._linear_pointwise`, `_reorder_linear_weight`), and what
oneDNN can compute depends on the CPU: its bfloat16 products need AVX-512, and a torch release may change
or drop the private ops. So before a dtype's first product, `onednn_supports` tries each op once on a small input
with an exactly known result; where an op is missing, raises or gives another result, that dtype's products (or
just the packed weights) stay with torch's own, and one warning says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from r1trade.runtime import cpu_info

_DTYPES = (torch.float32, torch.bfloat16)
MIN_WEIGHT_ELEMENTS = 1 << 16
"""Smallest weight computed by oneDNN (SmolLM2-135M's smallest projection has 110,592 elements)."""


log = logging.getLogger(__name__)


def _mkldnn_ops() -> object:
    """The namespace of torch's private oneDNN ops (a test replaces it to play a torch build without them)."""
    return torch.ops.mkldnn


def _private_op(name: str) -> Callable | None:
    """torch's private oneDNN op `name`, or None where this torch build has no such op."""
    try:
        return getattr(_mkldnn_ops(), name)
    except (AttributeError, RuntimeError):
        return None


def onednn_available() -> bool:
    """True when this torch build has oneDNN and its linear op (every official x86 and ARM CPU build does); whether
    the CPU can run a given dtype's products is `onednn_supports`."""
    try:
        built = torch.backends.mkldnn.is_available()
    except (AttributeError, RuntimeError):
        return False
    return built and _private_op("_linear_pointwise") is not None


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` by oneDNN; `weight` is (out, in), plain (any strides) or packed by `_pack`.

    Only for a dtype `onednn_supports` (packed weights: `Support.packing`)."""
    return _mkldnn_ops()._linear_pointwise(x, weight, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in oneDNN's blocked layout: only `onednn_linear` can read the result."""
    return _mkldnn_ops()._reorder_linear_weight(weight.detach(), None)


@dataclass(frozen=True)
class Support:
    """What oneDNN computes here in one dtype, as `onednn_support` found by trying it."""

    products: bool
    """`onednn_linear` on plain weights (any strides, with and without bias)."""
    packing: bool
    """`_pack` and `onednn_linear` on its result."""
    reason: str = ""
    """Why not, where one of them is False."""


def onednn_supports(dtype: torch.dtype) -> bool:
    """True when oneDNN's products run here in `dtype` and give the right results (tried once, see the module)."""
    return onednn_support(dtype).products


def onednn_support(dtype: torch.dtype) -> Support:
    """What oneDNN computes here in `dtype`: tried on the first call for each dtype, warned once if not all."""
    support = _SUPPORT.get(dtype)
    if support is not None:
        return support
    with _PROBE_LOCK:
        if dtype not in _SUPPORT:
            _SUPPORT[dtype] = support = _probe(dtype)
            if not support.products:
                log.warning(
                    "oneDNN %s products %s: linear layers and attention use torch's own%s",
                    dtype_name(dtype), support.reason, _bfloat16_hint(dtype),
                )
            elif not support.packing:
                log.warning(
                    "oneDNN %s packed weights %s: linear layers use plain weights", dtype_name(dtype), support.reason
                )
        return _SUPPORT[dtype]


def reset_support() -> None:
    """Forget what `onednn_support` found (tests that replace the ops or the CPU limits)."""
    with _PROBE_LOCK:
        _SUPPORT.clear()


def _probe(dtype: torch.dtype) -> Support:
    """Try each product the layers and attention use on small integers, whose results are exact in float32 and
    bfloat16 alike, and compare them with the known results."""
    if dtype not in _DTYPES or not onednn_available():
        return Support(False, False, "are not in this torch build")
    generator = torch.Generator().manual_seed(0)  # not the global one: trying changes no seeded result
    cpu = {"generator": generator, "device": "cpu"}
    x = torch.randint(-2, 3, (3, 32), **cpu).to(dtype)  # (rows, in)
    weight = torch.randint(-2, 3, (8, 32), **cpu).to(dtype)  # (out, in): not square, so a transposed reading fails
    bias = torch.randint(-2, 3, (8,), **cpu).to(dtype)
    expected = x.double() @ weight.double().T + bias.double()
    strided = weight.T.contiguous().T  # the backward pass's products read a transposed (strided) weight

    def right(out: object, want: torch.Tensor) -> bool:
        same_kind = isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == want.shape
        return same_kind and torch.equal(out.double(), want)

    try:
        plain = right(onednn_linear(x, weight, bias), expected)
        if not (plain and right(onednn_linear(x, strided), expected - bias.double())):
            return Support(False, False, "give wrong results with this torch build")
    except Exception as error:  # noqa: BLE001 (a missing op, a new signature, a CPU oneDNN has no kernel for)
        return Support(False, False, f"fail here ({_first_line(error)})")
    try:
        if not right(onednn_linear(x, _pack(weight), bias), expected):
            return Support(True, False, "give wrong results with this torch build")
    except Exception as error:  # noqa: BLE001
        return Support(True, False, f"fail here ({_first_line(error)})")
    return Support(True, True)


def dtype_name(dtype: torch.dtype) -> str:
    """`bfloat16` for torch.bfloat16, as messages and file names spell it."""
    return str(dtype).removeprefix("torch.")


def _first_line(error: BaseException) -> str:
    """The error's first sentence (oneDNN's messages go on with advice on its verbose mode)."""
    text = (str(error).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _bfloat16_hint(dtype: torch.dtype) -> str:
    if dtype != torch.bfloat16:
        return ""
    cpu = cpu_info()
    if cpu.flags and not {"avx512_bf16", "amx_bf16"} & cpu.flags:
        return f" (slow in bfloat16 on this CPU, {cpu.model} without AVX-512 BF16: float32 is usually faster)"
    return ""


_SUPPORT: dict[torch.dtype, Support] = {}
_PROBE_LOCK = threading.RLock()


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
    """True when oneDNN's products take `tensor`: a float32 or bfloat16 tensor on CPU, in a dtype whose products
    oneDNN runs here (`onednn_supports`)."""
    return tensor.device.type == "cpu" and tensor.dtype in _DTYPES and onednn_supports(tensor.dtype)


def has_dense_rows(tensor: torch.Tensor) -> bool:
    """True when every (L, D) block of `tensor` (…, L, D) is dense: each row's D numbers contiguous and the rows
    back to back (a cache buffer's slice is; keys viewed out of a projection, strided across heads, are not)."""
    return tensor.stride(-1) == 1 and (tensor.shape[-2] <= 1 or tensor.stride(-2) == tensor.shape[-1])


def _suits_onednn(weight: torch.Tensor) -> bool:
    return weight.numel() >= MIN_WEIGHT_ELEMENTS and onednn_computes(weight)


def _requires_grad(tensor: torch.Tensor | None) -> bool:
    return tensor is not None and tensor.requires_grad


def use_onednn_linears(model: nn.Module) -> nn.Module:
    """Make every plain `nn.Linear` in `model` a `OneDNNLinear` in place (a no-op without oneDNN); return `model`.

    The model's CPU dtypes are tried at once (`onednn_support`), so a warning that oneDNN cannot compute them here
    comes when the model is loaded rather than in its first forward pass."""
    if onednn_available():
        dtypes = set()
        for module in model.modules():
            if type(module) is nn.Linear:
                module.__class__ = OneDNNLinear
                if module.weight.device.type == "cpu" and module.weight.dtype in _DTYPES:
                    dtypes.add(module.weight.dtype)
        for dtype in dtypes:
            onednn_support(dtype)
    return model


@contextmanager
def packed_weights(model: nn.Module) -> Iterator[None]:
    """Inside, `model`'s oneDNN linears compute without gradients from packed copies of their weights.

    Packing all of SmolLM2-135M takes ~0.2 s and as much memory again as its weights; the copies are dropped on
    exit. The weights must not change inside (a rollout or a scoring pass; an optimiser step belongs outside).
    """
    layers = [
        m for m in model.modules()
        if isinstance(m, OneDNNLinear) and _suits_onednn(m.weight) and onednn_support(m.weight.dtype).packing
    ]
    try:
        for layer in layers:
            layer.packed = _pack(layer.weight)
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("packed", None)
