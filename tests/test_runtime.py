"""The CPU description: model, CPUs and the instruction-set flags that decide the kernels."""

from __future__ import annotations

import pytest

from r1trade.runtime import CpuInfo, cpu_header, cpu_info, parse_cpuinfo

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma
processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma
"""
XEON_AMX = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("text", "machine", "described"),
    [
        (EPYC_AVX2, "x86_64", "AMD EPYC, 2 CPUs (x86_64): avx2 yes, avx512f no, avx512_bf16 no, amx_bf16 no"),
        (XEON_AMX, "x86_64",
         "Intel(R) Xeon(R) Platinum 8480+, 2 CPUs (x86_64): avx2 yes, avx512f yes, avx512_bf16 yes, amx_bf16 yes"),
        (GRAVITON, "aarch64", "aarch64, 2 CPUs (aarch64): asimd yes, sve yes, bf16 yes"),
    ],
)
def test_the_cpu_is_described_by_model_and_the_flags_that_decide_the_kernels(text, machine, described):
    model, flags = parse_cpuinfo(text, default_model=machine)
    cpu = CpuInfo(model, 2, machine, flags)
    assert cpu.describe() == described
    assert cpu.avx512 == ("avx512f" in text)


def test_this_machines_cpu_and_torch_kernels_head_a_benchmark():
    import torch

    header = cpu_header()
    assert header.startswith(f"cpu: {cpu_info().model}, ") and cpu_info().cpus >= 1
    assert f"torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}" in header
