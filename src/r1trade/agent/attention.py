"""Attention for decoding steps on CPU: two matrix products instead of the SDPA flash kernel.

A decoding step has one query row per head against a long KV cache. On a 2-core CPU, torch's flash attention
kernel spends ~1.4 ms per layer on that (16 rows, 1,000 cached tokens, SmolLM2's 9 query heads over 3 key/value
heads) where `softmax(q·Kᵀ)·V` as two batched matrix products takes ~1.1 ms (docs/benchmarks.md). The query
heads that share a key/value head are folded into the query axis, `(B, H, 1, D) -> (B, H_kv, G, D)`, so the
cache is read as it is, never repeated per head. Prefill (many query rows, where the flash kernel is faster) and
anything that needs gradients go to transformers' SDPA unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_ATTENTION = "r1trade_grouped"


def grouped_query_attention(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, Q, D)
    key: torch.Tensor,  # (B, H_kv, L, D)
    value: torch.Tensor,  # (B, H_kv, L, D)
    attention_mask: torch.Tensor | None,  # (B, 1, Q, L) bool, True = may attend; None = attend to all
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention output `(B, Q, H, D)` as transformers' attention functions return it."""
    decoding = query.shape[2] == 1 and (attention_mask is None or attention_mask.dtype == torch.bool)
    if not decoding or torch.is_grad_enabled() or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    folded = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # (B, H_kv, G, D): row g is head kv·G + g
    scores = torch.matmul(folded, key.transpose(-1, -2)) * scale  # (B, H_kv, G, L)
    if attention_mask is not None:
        # The dtype's lowest value rather than -inf: a row with nothing to attend to (a padding step) stays finite.
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    out = torch.matmul(scores.softmax(dim=-1), value)  # (B, H_kv, G, D)
    return out.reshape(batch, 1, heads, dim), None


AttentionInterface.register(GROUPED_ATTENTION, grouped_query_attention)
AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)


def use_decoding_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Switch a model that uses SDPA to `grouped_query_attention`; any other attention is left as it is."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(GROUPED_ATTENTION)
    return model
