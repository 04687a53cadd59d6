"""glibc's malloc keeps freed blocks for reuse once tuned."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from r1trade.cpu.memory import keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

PROBE = """
import ctypes, sys
from r1trade.cpu.memory import keep_freed_memory

class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes, libc.mallinfo.restype = ctypes.c_void_p, [ctypes.c_void_p], MallInfo
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
block = libc.malloc(16 << 20)
print(libc.mallinfo().hblkhd >= 16 << 20)  # the block was mapped on its own (and is unmapped when freed)
libc.free(block)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
@pytest.mark.parametrize(("mode", "mapped"), [("default", "True"), ("tuned", "False")])
def test_a_16_mb_block_comes_from_the_heap_once_tuned(mode, mapped):
    """By default glibc maps a 16 MB block by itself and unmaps it on free, so its pages fault in again next time."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    assert out.strip() == mapped


def test_keep_freed_memory_is_safe_to_call_again():
    assert keep_freed_memory() == GLIBC
    assert keep_freed_memory() == GLIBC
