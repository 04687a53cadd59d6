"""Which CPU this is: its model and the instruction sets that decide the speed of the model's products.

`cpu_info()` names the CPU and the flags it has among AVX2, AVX-512, AVX-512 BF16 and AMX: the benchmarks print it
in their headers, since their figures hold for one kind of CPU only, and `r1trade.cpu` reads it to choose its paths.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The x86 flags (as /proc/cpuinfo names them) that decide which kernels torch, oneDNN and the decoding kernel use:
AVX-512 (`avx512f`) for oneDNN's float32 speed on AMD, AVX-512 BF16 or AMX for its bfloat16 products."""
ARM_FLAGS = ("asimd", "sve", "bf16")


@dataclass(frozen=True)
class CpuInfo:
    """The CPU model name, the CPUs this process may use, and the relevant instruction-set flags it has."""

    model: str
    cpus: int
    machine: str
    flags: frozenset[str]

    @property
    def relevant_flags(self) -> tuple[str, ...]:
        return ARM_FLAGS if self.machine in ("aarch64", "arm64") else CPU_FLAGS

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    def describe(self) -> str:
        """One line, e.g. `AMD EPYC, 2 CPUs (x86_64): avx2 yes, avx512f no, avx512_bf16 no, amx_bf16 no`."""
        flags = ", ".join(f"{flag} {'yes' if flag in self.flags else 'no'}" for flag in self.relevant_flags)
        return f"{self.model}, {self.cpus} CPUs ({self.machine}): {flags}"


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's CPU, read from /proc/cpuinfo on Linux (elsewhere the model only, no flags)."""
    machine = platform.machine() or "unknown"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    model, flags = platform.processor() or machine, frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return CpuInfo(model, cpus, machine, flags)
    model, flags = parse_cpuinfo(text, default_model=model)
    return CpuInfo(model, cpus, machine, flags)


def cpu_header() -> str:
    """The line a benchmark prints first: the CPU, its relevant flags and, once torch is loaded, the kernel level
    torch picked for it (e.g. `AVX2`, `AVX512`)."""
    line = f"cpu: {cpu_info().describe()}"
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(AttributeError, RuntimeError):
            line += f"; torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}"
    return line


def parse_cpuinfo(text: str, *, default_model: str) -> tuple[str, frozenset[str]]:
    """The model name and the flags of the first processor in a /proc/cpuinfo text."""
    model, flags = default_model, frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and model == default_model and value.strip():
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags
