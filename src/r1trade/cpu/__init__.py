"""r1trade's CPU fast paths: what `model.cpu_kernels: auto` adds to plain transformers and torch.

- `onednn`: linear layers through oneDNN rather than torch's default BLAS, with packed weights for rollouts;
- `attention`: the rollout attention, grouped key/value heads never repeated, a shared prefix held once per batch;
- `decode_kernel` (and its C source `decode_attention.c`): a decoding step's attention by a compiled kernel;
- `memory`: glibc's malloc keeps freed blocks for the next forward pass.
Each checks the CPU and the torch build first and falls back to torch's own computation, with one warning.
The package is a leaf: `model.cpu_kernels` decides whether it runs (`r1trade.models.loading.cpu_kernels`; with
the switch off it is not even imported), and only the agent's loading and engine call it, through the functions
here.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from r1trade.cpu.attention import ROLLOUT_ATTENTIONS, use_decoding_attention
from r1trade.cpu.memory import keep_freed_memory
from r1trade.cpu.onednn import onednn_supports, packed_weights, use_onednn_linears
from r1trade.runtime import cpu_info

__all__ = [
    "native_bfloat16",
    "packed_weights",
    "shares_prefix",
    "use_fast_paths",
    "use_onednn_linears",
]


def use_fast_paths(model: PreTrainedModel) -> PreTrainedModel:
    """`model` (a base model as transformers loaded it) with oneDNN linear layers and, if it uses SDPA, the rollout
    attention with decoding steps by the compiled kernel; changed in place and returned. glibc's malloc is tuned
    for the forward passes to come (`keep_freed_memory`)."""
    keep_freed_memory()
    use_onednn_linears(model)
    return use_decoding_attention(model, kernel=True)


def native_bfloat16() -> bool:
    """True when this CPU multiplies bfloat16 in hardware (AMX or AVX-512 BF16) and oneDNN runs those products."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_info().flags) and onednn_supports(torch.bfloat16)


def shares_prefix(model: nn.Module) -> bool:
    """True when `model` attends through the rollout attention, which holds a `SharedPrefix` once for the batch."""
    return model.config._attn_implementation in ROLLOUT_ATTENTIONS
