"""Attention for rollouts on CPU with grouped key/value heads, never repeating the cache per query head.

transformers' SDPA path copies every key/value head once per query head (`repeat_kv`) whenever a mask is given,
which is every rollout call: left padding and per-row cache columns. SmolLM2 has 9 query heads over 3 key/value
heads, so a prefill of 16 rows over 1,000 cached tokens copies ~80 MB per layer. Here the query heads that share a
key/value head are folded into the query axis instead, `(B, H, Q, D) -> (B, H_kv, G·Q, D)` (row g·Q + q is query
q of head kv·G + g), and the cache is read as it is:
- a decoding step (one query) is fused into one pass over the cache by a compiled C kernel
  (`r1trade.cpu.decode_kernel`, with the `KERNEL_ATTENTION` implementation; ~2x faster than torch here), else
  two batched matrix products, `softmax(q·Kᵀ)·V` (on a 2-core CPU torch's flash kernel spends ~1.4 ms per layer
  on a step of 16 rows over 1,000 cached tokens, the two products ~1.1 ms);
- a prefill with a mask attends with the folded query, the mask repeated for each folded group and made
  additive (0 or the dtype's lowest value) once per forward pass (given a boolean mask, SDPA converts it to that
  form in every layer: ~0.06 s a layer for 16 rows × 560 new tokens over 1,400 columns). On CPU the products go
  through oneDNN row by row and head by head (`_explicit_attention`, ~1.6x faster than SDPA's masked kernel
  here), elsewhere through SDPA.
Anything that needs gradients, or has no mask, goes to transformers' SDPA unchanged (a causal prefill without a
mask is faster there: its kernel skips the masked half of the scores).

A rollout's rows all start with the same system prompt. Passed as `shared_prefix` (a model keyword argument that
transformers hands on to the attention function), its keys and values are stored once for the whole batch instead
of once per row, and a decoding step reads them once ("cascade" attention): the scores over the prefix are one
matrix product for all rows per key/value head, and one softmax runs over prefix and own columns together, so the
result is the attention over the row's whole context.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from r1trade.cpu.decode_kernel import decode_kernel, fits_kernel
from r1trade.cpu.onednn import has_dense_rows, onednn_computes, onednn_linear

GROUPED_ATTENTION = "r1trade_grouped"
KERNEL_ATTENTION = "r1trade_grouped_kernel"
"""`grouped_query_attention` with decoding steps by the compiled kernel where it applies."""
ROLLOUT_ATTENTIONS = (GROUPED_ATTENTION, KERNEL_ATTENTION)


@dataclass
class SharedPrefix:
    """Key/value columns that come before every row's own cache, stored once for the batch."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per decoder layer: keys, values (1, H_kv, P, D)
    attention: torch.Tensor  # (B, P) bool: the prefix columns each row attends to


def grouped_query_attention(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, Q, D)
    key: torch.Tensor,  # (B, H_kv, L, D)
    value: torch.Tensor,  # (B, H_kv, L, D)
    attention_mask: torch.Tensor | None,  # (B, 1, Q, L) bool, True = may attend; None = attend to all (or causal)
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    shared_prefix: SharedPrefix | None = None,
    kernel: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention output `(B, Q, H, D)` as transformers' attention functions return it; with `kernel`, decoding
    steps go to the compiled kernel where it applies (float32 or bfloat16 on CPU, a head size that is a multiple
    of 16)."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    boolean_mask = attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1)
    decoding = length == 1
    scale = scaling if scaling is not None else dim**-0.5
    if shared_prefix is not None:
        if torch.is_grad_enabled() or dropout or not boolean_mask:
            raise ValueError("a shared prefix is for inference with boolean masks only")
        out = _attention_after_prefix(module, query, key, value, attention_mask, shared_prefix, scale, kernel)
    elif torch.is_grad_enabled() or dropout or not boolean_mask or (attention_mask is None and not decoding):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    elif decoding:
        mask = None
        if attention_mask is not None:
            mask = _MASKS.get(attention_mask, lambda: _additive(attention_mask, query.dtype))  # (B, 1, 1, L)
        out = _kernel_step(query, key, value, mask, scale) if kernel else None
        if out is None:
            folded = query.reshape(batch, kv_heads, groups, dim) * scale  # (B, H_kv, G, D): scaled before the product
            scores = torch.matmul(folded, key.transpose(-1, -2))  # (B, H_kv, G, L)
            if mask is not None:
                scores.add_(mask)
            out = torch.matmul(torch.softmax(scores, dim=-1, out=scores), value)  # (B, H_kv, G, D)
    else:
        out = _folded_prefill(query, key, value, attention_mask, lambda: attention_mask, scale)
    out = out.reshape(batch, heads, length, dim)  # (B, H, Q, D)
    return out.transpose(1, 2).contiguous(), None


def _folded_prefill(
    query: torch.Tensor,  # (B, H, Q, D)
    key: torch.Tensor,  # (B, H_kv, L, D)
    value: torch.Tensor,
    source_mask: torch.Tensor | None,  # the forward pass's mask object, if any: the folded mask is built once for it
    boolean_mask: Callable[[], torch.Tensor],  # (B, 1, Q, L) bool
    scale: float,
) -> torch.Tensor:
    """Attention of the folded query `(B, H_kv, G·Q, D)`, the mask repeated for each group and made additive, by
    oneDNN's products on CPU (`_explicit_attention`) where oneDNN runs the dtype here (`onednn_computes`: not
    bfloat16 on a CPU without AVX-512, for one), and by SDPA elsewhere."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads

    def folded_mask() -> torch.Tensor:  # (B, 1, G·Q, L)
        return _additive(boolean_mask().repeat(1, 1, groups, 1), query.dtype)

    mask = _MASKS.get(source_mask, folded_mask) if source_mask is not None else folded_mask()
    folded = query.reshape(batch, kv_heads, groups * length, dim)
    if onednn_computes(query):
        return _explicit_attention(folded, key, value, mask.expand(batch, -1, -1, -1), scale)
    return nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scale)


def _explicit_attention(
    query: torch.Tensor,  # (B, H_kv, N, D)
    key: torch.Tensor,  # (B, H_kv, L, D)
    value: torch.Tensor,
    mask: torch.Tensor,  # (B, 1, N, L) additive
    scale: float,
) -> torch.Tensor:
    """`softmax(q·Kᵀ·scale + mask)·V` per row and key/value head, both products by oneDNN, in chunks of queries.

    With a mask, torch's CPU attention kernel multiplies at ~170 GFLOP/s here; oneDNN's products run at ~500, so
    this is ~1.6x faster for a rollout's prefill (16 rows × 582 folded queries over 1,091 columns: 30 vs 50 ms a
    layer) even though it writes the scores out, at most `_SCORES_PER_CHUNK` of them at a time.
    """
    # oneDNN needs each (L, D) block dense: fresh keys are often a view across heads (row stride H_kv·D), and
    # oneDNN's fallback for other strides is ~1,000x slower
    key, value = _dense_rows(key), _dense_rows(value)
    out = torch.empty_like(query)
    chunk = max(1, _SCORES_PER_CHUNK // key.shape[2])
    for row in range(query.shape[0]):
        for head in range(query.shape[1]):
            keys, values_t = key[row, head], value[row, head].t()  # (L, D), (D, L)
            for start in range(0, query.shape[2], chunk):
                part = slice(start, start + chunk)
                scores = onednn_linear(query[row, head, part], keys).mul_(scale).add_(mask[row, 0, part])
                torch.softmax(scores, dim=-1, out=scores)
                out[row, head, part] = onednn_linear(scores, values_t)
    return out


def _dense_rows(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (..., L, D) with every (L, D) block dense: itself if it is (a cache buffer's slice is), else a copy."""
    return tensor if has_dense_rows(tensor) else tensor.contiguous()


def _kernel_step(
    query: torch.Tensor,  # (B, H, 1, D)
    key: torch.Tensor,  # (B, H_kv, L, D)
    value: torch.Tensor,
    mask: torch.Tensor | None,  # (B, 1, 1, P + L) additive
    scale: float,
    prefix: tuple[torch.Tensor, torch.Tensor] | None = None,  # (1, H_kv, P, D) each
) -> torch.Tensor | None:
    """A decoding step by the compiled kernel, folded `(B, H_kv, G, D)`; None where the kernel does not apply."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    if torch.is_grad_enabled() or not fits_kernel(query, key, value, *(prefix or ())):
        return None
    kernel = decode_kernel(heads // kv_heads, dim, key.dtype)
    if kernel is None:
        return None
    if mask is not None and mask.dtype != torch.float32:  # the kernel adds float32 masks (skips float32's lowest)
        lowest = torch.finfo(mask.dtype).min
        mask = _KERNEL_MASKS.get(mask, lambda: _additive(mask != lowest, torch.float32))
    return kernel(query.reshape(batch, kv_heads, heads // kv_heads, dim), key, value, mask, scale, prefix)


def _attention_after_prefix(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, Q, D)
    key: torch.Tensor,  # (B, H_kv, L, D): the rows' own columns, after the prefix
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # (B, 1, Q, L) bool over the own columns; None = causal (all, if Q = 1)
    prefix: SharedPrefix,
    scale: float,
    kernel: bool = False,
) -> torch.Tensor:
    """Attention over `prefix` followed by each row's own columns, output `(B, H_kv, G·Q, D)` (folded)."""
    batch, heads, length, dim = query.shape
    kv_heads, own = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    prefix_keys, prefix_values = prefix.layers[module.layer_idx]  # (1, H_kv, P, D)
    given_mask = attention_mask
    if attention_mask is None:  # transformers leaves out a mask that would only be causal
        attention_mask = torch.ones(length, own, dtype=torch.bool, device=query.device).tril(own - length)
        attention_mask = attention_mask.expand(batch, 1, length, own)
    prefix_mask = prefix.attention[:, None, None, :].expand(batch, 1, length, prefix.attention.shape[1])
    if length > 1:  # a prefill: compute-bound, so the prefix is copied per row and `_folded_prefill` does the rest
        keys = torch.cat([prefix_keys.expand(batch, -1, -1, -1), key], dim=2)
        values = torch.cat([prefix_values.expand(batch, -1, -1, -1), value], dim=2)

        def whole_mask() -> torch.Tensor:  # (B, 1, Q, P + L)
            return torch.cat([prefix_mask, attention_mask], dim=-1)

        return _folded_prefill(query, keys, values, given_mask, whole_mask, scale)

    # a decoding step: memory-bound, so the prefix is read once for all rows (the kernel reads it per row and
    # head, but from the CPU's caches: it is small next to the rows' own columns)
    def additive_mask() -> torch.Tensor:  # (B, 1, 1, P + L), built by the forward pass's first layer
        return _additive(torch.cat([prefix_mask, attention_mask], dim=-1), query.dtype)

    mask = _MASKS.get(given_mask, additive_mask) if given_mask is not None else additive_mask()
    if kernel and (out := _kernel_step(query, key, value, mask, scale, (prefix_keys, prefix_values))) is not None:
        return out
    folded = query.reshape(batch, kv_heads, groups, dim) * scale  # (B, H_kv, G, D): scaled before the products
    by_head = folded.transpose(0, 1).reshape(kv_heads, batch * groups, dim)  # (H_kv, B·G, D)
    prefix_scores = torch.matmul(by_head, prefix_keys[0].transpose(-1, -2))  # (H_kv, B·G, P)
    prefix_scores = prefix_scores.reshape(kv_heads, batch, groups, -1).transpose(0, 1)  # (B, H_kv, G, P)
    own_scores = torch.matmul(folded, key.transpose(-1, -2))  # (B, H_kv, G, L)
    scores = torch.cat([prefix_scores, own_scores], dim=-1)
    weights = torch.softmax(scores.add_(mask), dim=-1, out=scores)
    prefix_weights, own_weights = weights.split([prefix_scores.shape[-1], own], dim=-1)
    prefix_weights = prefix_weights.transpose(0, 1).reshape(kv_heads, batch * groups, -1)  # (H_kv, B·G, P)
    from_prefix = torch.matmul(prefix_weights, prefix_values[0]).reshape(kv_heads, batch, groups, dim)
    return from_prefix.transpose(0, 1) + torch.matmul(own_weights, value)  # (B, H_kv, G, D)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = may attend) as the float mask SDPA adds to the scores; the lowest finite value rather
    than -inf keeps a row with nothing to attend to (a padding query) finite."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


class _MaskPerForward:
    """A mask derived from a forward pass's boolean mask, built by the first layer and reused by the others.

    transformers hands every layer the same mask object; the derived mask is kept only while that object lives.
    """

    def __init__(self) -> None:
        self._source: weakref.ref | None = None
        self._mask: torch.Tensor | None = None

    def get(self, source: torch.Tensor, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._source is None or self._source() is not source:
            self._mask = build()
            self._source = weakref.ref(source, self._drop)
        return self._mask

    def _drop(self, ref: weakref.ref) -> None:
        if ref is self._source:
            self._source = self._mask = None


_MASKS = _MaskPerForward()
_KERNEL_MASKS = _MaskPerForward()  # `_MASKS`'s mask in float32, where the model runs in another dtype
_SCORES_PER_CHUNK = 1 << 22
"""Attention scores `_explicit_attention` holds at once for one row and head (16 MB in float32)."""


AttentionInterface.register(GROUPED_ATTENTION, grouped_query_attention)
AttentionInterface.register(KERNEL_ATTENTION, functools.partial(grouped_query_attention, kernel=True))
for _name in ROLLOUT_ATTENTIONS:
    AttentionMaskInterface.register(_name, sdpa_mask)


def use_decoding_attention(model: PreTrainedModel, *, kernel: bool = True) -> PreTrainedModel:
    """Switch a model that uses SDPA (or the other rollout attention) to `grouped_query_attention`, with decoding
    steps by the compiled kernel if `kernel`; any other attention is left as it is."""
    if model.config._attn_implementation in ("sdpa", *ROLLOUT_ATTENTIONS):
        model.set_attn_implementation(KERNEL_ATTENTION if kernel else GROUPED_ATTENTION)
    return model
