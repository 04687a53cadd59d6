"""Keep freed memory in the process instead of handing it back to the kernel after every large tensor.

glibc's malloc serves large blocks (above 128 KB at first) with fresh `mmap` calls and unmaps them on free, and
trims the heap whenever its free top passes 128 KB. A model's forward pass allocates and frees tensors of several
MB (activations, attention scores, the rollout's per-layer key/value concatenations), so the next pass touches
fresh pages again: every 4 KB page faults and is zeroed by the kernel. A 16-row rollout prefill spent ~0.5 s of
its 4.8 s in such copies (`docs/benchmarks.md`). Raising the mmap threshold to glibc's maximum (32 MB) and the
trim threshold out of reach keeps those blocks in the heap for reuse; peak memory is unchanged, but it is not
returned to the system until the process ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's upper limit on 64-bit systems
_TOP_PAD = 64 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as above; False (and nothing changed) on other C libraries."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    settings = ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, _TOP_PAD))
    return all(libc.mallopt(option, value) == 1 for option, value in settings)
