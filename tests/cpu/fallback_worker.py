"""Run by tests/cpu/test_fallbacks.py in a fresh process, with oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`,
as on a CPU without AVX-512) and no C compiler (`CC=no-such-compiler`, so no decoding kernel): the tiny model runs in
float32 and bfloat16 with the rollout attention and the kernel asked for, and is compared with plain SDPA models.
Prints what it found as one JSON line; warnings go to stderr, one line each.
"""

import json
import logging

import torch

from r1trade.cpu import onednn
from r1trade.cpu.attention import use_decoding_attention
from r1trade.cpu.decode_kernel import decode_kernel
from r1trade.cpu.onednn import OneDNNLinear, use_onednn_linears
from r1trade.models.loading import build_tiny_model
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.quiet import quiet_third_party

logging.basicConfig(level=logging.WARNING, format="WARNING %(name)s: %(message)s")
quiet_third_party()  # as the CLI does: the only warnings left are r1trade's
onednn.MIN_WEIGHT_ELEMENTS = 0  # the tiny model's layers are small: let oneDNN take them where it can


def logits(dtype: torch.dtype, *, fast: bool) -> torch.Tensor:
    """Last-position logits of a prefill (left padding in row 0) and one decoding step after it, (2, 3, V)."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=3, dtype=dtype)
    if fast:
        use_onednn_linears(use_decoding_attention(model, kernel=True))
        assert any(isinstance(m, OneDNNLinear) for m in model.modules())
    ids = torch.randint(3, len(tokenizer), (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        prefill = model(input_ids=ids[:, :11], attention_mask=mask[:, :11], use_cache=True)
        step = model(input_ids=ids[:, 11:], attention_mask=mask, past_key_values=prefill.past_key_values)
    return torch.stack([prefill.logits[:, -1], step.logits[:, -1]]).float()


found = {
    "float32_products": onednn.onednn_supports(torch.float32),
    "bfloat16_products": onednn.onednn_supports(torch.bfloat16),
    "kernel": decode_kernel(2, 16) is not None,
}
reference = logits(torch.float32, fast=False)
found["float32_error"] = (logits(torch.float32, fast=True) - reference).abs().max().item()
bfloat16 = logits(torch.bfloat16, fast=True)
found["bfloat16_error"] = (bfloat16 - logits(torch.bfloat16, fast=False)).abs().max().item()
found["bfloat16_finite"] = bool(torch.isfinite(bfloat16).all())
print(json.dumps(found))
