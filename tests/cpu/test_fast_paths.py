"""What `r1trade.cpu` gives a loaded model: oneDNN linears and the rollout attention, and the CPU's bfloat16."""

from __future__ import annotations

import pytest
import torch

from r1trade import cpu
from r1trade.cpu.attention import KERNEL_ATTENTION
from r1trade.cpu.onednn import OneDNNLinear, onednn_available
from r1trade.models.loading import build_tiny_model
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.runtime import CpuInfo


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_a_base_model_gets_onednn_linears_and_the_rollout_attention() -> None:
    model = cpu.use_fast_paths(build_tiny_model(build_tiny_tokenizer()))
    assert model.config._attn_implementation == KERNEL_ATTENTION and cpu.shares_prefix(model)
    assert any(isinstance(module, OneDNNLinear) for module in model.modules())


def test_native_bfloat16_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for flags, native in [({"avx2", "avx512f"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_bf16"}, True)]:
        monkeypatch.setattr(cpu, "cpu_info", lambda flags=flags: CpuInfo("cpu", 2, "x86_64", frozenset(flags)))
        assert cpu.native_bfloat16() is (native and cpu.onednn_supports(torch.bfloat16))
