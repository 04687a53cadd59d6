"""One decoding step's attention by a small C kernel (`decode_attention.c`), compiled once per machine and shape.

A 16-row decoding step of SmolLM2-135M spends about half its time in attention over the rows' own keys and values
(`docs/benchmarks.md`): ~11.5 MB a layer, which a plain read streams from memory in ~0.3 ms, while every attention
torch offers for the shape takes 0.6-0.8 ms (two batched products and a softmax write and re-read the scores, and
each runs rows × heads small products). The kernel does a step in one pass per row and key/value head: the
group's queries are scored against each key as it streams by, one softmax, then the values are summed with the
weights; the keys and values of masked columns are not read at all. ~0.37 ms a layer, about 2x torch.

It is compiled on first use with the system's C compiler (`$CC`, else `cc`: gcc 12 or later, or clang with
OpenMP) for this machine's CPU (`-march=native`) and the model's head shape, into `<cache>/kernels/`
(`r1trade.cache`), and loaded with ctypes. Loaded after torch, the library's OpenMP runtime is the one torch
already holds, and it runs on torch's thread count. A library built on another CPU is not reused (the build's
name covers the CPU's model and flags), and a loaded kernel first computes a small step whose result torch checks.
Without a compiler, when the build fails, or when that check does not pass, a warning says so once and attention
keeps torch's products (same results to float32 rounding).

A model run in bfloat16 caches its keys and values in bfloat16: for those the kernel is built a second time
(`-DKV_BF16`), reading each number as the upper half of a float, so a step streams half the bytes; the query, the
mask, every sum and the result stay float32 (the result is rounded to bfloat16 only when handed back).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from r1trade.cache import cache_home
from r1trade.cpu.onednn import dtype_name, has_dense_rows

SOURCE = Path(__file__).with_name("decode_attention.c")
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC")
"""`-ffast-math` only when compiling (vectorised `expf`, reordered sums): linked with it, gcc before 13 adds
start-up code to a shared library that flushes denormals to zero for the whole process."""
LINK_FLAGS = ("-shared", "-fopenmp")
LANES = 16
"""The kernel works in vectors of 16 floats: a head's size must be a multiple."""
CACHE_DTYPES = {torch.float32: (), torch.bfloat16: ("-DKV_BF16",)}
"""The key/value dtypes a build reads, with the defines that select them."""
_BUILD_SECONDS = 120

log = logging.getLogger(__name__)


class KernelBuildError(RuntimeError):
    """The kernel could not be compiled or loaded here."""


@dataclass(frozen=True)
class DecodeKernel:
    """The compiled kernel for one shape: `groups` query heads per key/value head, `head_dim` numbers per head,
    keys and values in `dtype`."""

    groups: int
    head_dim: int
    function: ctypes._CFuncPtr
    dtype: torch.dtype = torch.float32

    def __call__(
        self,
        query: torch.Tensor,  # (B, H_kv, G, D): one step's queries, the heads of a group together (float32 or `dtype`)
        keys: torch.Tensor,  # (B, H_kv, L, D) in `dtype`: the rows' own columns, each (L, D) block with dense rows
        values: torch.Tensor,
        mask: torch.Tensor | None,  # (B, P + L) additive (0 or float32's lowest), contiguous; None = attend to all
        scale: float,
        prefix: tuple[torch.Tensor, torch.Tensor] | None = None,  # shared keys, values (1, H_kv, P, D)
    ) -> torch.Tensor:
        """`softmax(q·Kᵀ·scale + mask)·V` over the prefix's columns and then each row's own: (B, H_kv, G, D), in the
        query's dtype."""
        batch, kv_heads, own = keys.shape[0], keys.shape[1], keys.shape[2]
        given_dtype = query.dtype
        query = query.to(torch.float32).contiguous()
        if query.shape != (batch, kv_heads, self.groups, self.head_dim):
            raise ValueError(f"query {tuple(query.shape)} does not fit keys {tuple(keys.shape)}")
        cache = (keys, values, *(prefix or ()))
        if not fits_kernel(*cache) or any(t.dtype != self.dtype for t in cache) or given_dtype not in CACHE_DTYPES:
            raise ValueError(f"this decoding kernel takes {dtype_name(self.dtype)} CPU keys and values with dense "
                             f"(columns, head_dim) blocks and a float32 or {dtype_name(self.dtype)} query")
        prefix_keys, prefix_values = prefix if prefix is not None else (None, None)
        prefix_length = 0 if prefix_keys is None else prefix_keys.shape[2]
        if mask is not None and (mask.dtype != torch.float32 or not mask.is_contiguous()
                                 or mask.numel() != batch * (prefix_length + own)):
            raise ValueError(f"the mask must be contiguous float32 (B, P + L) = ({batch}, {prefix_length + own})")
        out = torch.empty_like(query)
        status = self.function(
            query.data_ptr(),
            _address(prefix_keys),
            _address(prefix_values),
            0 if prefix_keys is None else prefix_keys.stride(1),
            prefix_length,
            keys.data_ptr(),
            keys.stride(0),
            keys.stride(1),
            values.data_ptr(),
            values.stride(0),
            values.stride(1),
            own,
            _address(mask),
            scale,
            out.data_ptr(),
            batch,
            kv_heads,
            torch.get_num_threads(),
        )
        if status:
            raise MemoryError("the decoding kernel could not allocate its scores")
        return out.to(given_dtype)


def fits_kernel(*tensors: torch.Tensor) -> bool:
    """True when a kernel can read these (…, L, D) tensors as they are: all float32 or all bfloat16, on CPU, with
    dense rows (`has_dense_rows`), D a multiple of 16."""
    return len({t.dtype for t in tensors}) <= 1 and all(
        t.dtype in CACHE_DTYPES and t.device.type == "cpu" and t.shape[-1] % LANES == 0 and has_dense_rows(t)
        for t in tensors
    )


def decode_kernel(groups: int, head_dim: int, dtype: torch.dtype = torch.float32) -> DecodeKernel | None:
    """The kernel for this shape and key/value dtype, built or loaded on the first call; None where it cannot be
    (warned once)."""
    key = (groups, head_dim, dtype)
    with _LOCK:
        if key not in _KERNELS:
            try:
                _KERNELS[key] = _checked(_load(build(groups, head_dim, dtype=dtype), groups, head_dim, dtype))
            except KernelBuildError as error:
                if str(error) not in _WARNED:  # e.g. no compiler: said once, not once per dtype
                    _WARNED.add(str(error))
                    log.warning("decoding attention stays with torch: %s", error)
                _KERNELS[key] = None
        return _KERNELS[key]


def build(groups: int, head_dim: int, directory: Path | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """Compile the kernel for this shape and key/value dtype into `directory` (default `<cache>/kernels`) unless a
    build with the same source, compiler, flags and CPU is there already; return the library's path."""
    if groups < 1 or head_dim < LANES or head_dim % LANES:
        raise KernelBuildError(f"no kernel for {groups} query heads per key/value head of size {head_dim}")
    if dtype not in CACHE_DTYPES:
        raise KernelBuildError(f"no kernel for {dtype_name(dtype)} keys and values")
    compiler = _compiler()
    defines = (f"-DGROUPS={groups}", f"-DHEAD_DIM={head_dim}", *CACHE_DTYPES[dtype])
    identity = hashlib.sha256()
    for part in (SOURCE.read_bytes(), *_compiler_identity(compiler), *COMPILE_FLAGS, *LINK_FLAGS, *defines):
        identity.update(part if isinstance(part, bytes) else part.encode())
    identity.update(_cpu_identity())
    directory = directory or cache_home() / "kernels"
    kind = "" if dtype == torch.float32 else f"_{dtype_name(dtype)}"
    library = directory / f"decode_attention_g{groups}_d{head_dim}{kind}_{identity.hexdigest()[:16]}.so"
    if library.is_file():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as work:
        objects, built = Path(work) / "kernel.o", Path(work) / library.name
        _run([compiler, *COMPILE_FLAGS, *defines, "-c", str(SOURCE), "-o", str(objects)])
        _run([compiler, *LINK_FLAGS, str(objects), "-o", str(built), "-lm"])
        os.replace(built, library)  # atomic: a concurrent build of the same kernel ends with one whole file
    return library


def _load(library: Path, groups: int, head_dim: int, dtype: torch.dtype = torch.float32) -> DecodeKernel:
    try:
        function = ctypes.CDLL(str(library)).r1trade_decode_attention
    except (OSError, AttributeError) as error:
        raise KernelBuildError(f"cannot load {library}: {error}") from error
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [
        pointer, pointer, pointer, size, size,  # query, prefix keys, prefix values, prefix head stride, length
        pointer, size, size, pointer, size, size, size,  # keys, values (row and head strides), own length
        pointer, ctypes.c_float, pointer, size, size, ctypes.c_int,  # mask, scale, out, rows, kv heads, threads
    ]
    function.restype = ctypes.c_int
    return DecodeKernel(groups, head_dim, function, dtype)


def _checked(kernel: DecodeKernel) -> DecodeKernel:
    """`kernel` once it gave torch's result on a small step (prefix, masked columns, a strided cache slice)."""
    cpu = {"generator": torch.Generator().manual_seed(0), "device": "cpu"}  # the global generator is left alone
    rows, kv_heads, own, prefix_length, dim = 2, 2, 7, 5, kernel.head_dim
    query = torch.randn(rows, kv_heads, kernel.groups, dim, **cpu)
    keys, values = (torch.randn(rows, kv_heads, own + 3, dim, **cpu).to(kernel.dtype)[:, :, :own] for _ in range(2))
    prefix = tuple(torch.randn(1, kv_heads, prefix_length, dim, **cpu).to(kernel.dtype) for _ in range(2))
    mask = torch.zeros(rows, prefix_length + own, device="cpu")
    mask[0, prefix_length : prefix_length + 2] = mask[1, 1] = torch.finfo(torch.float32).min
    try:
        out = kernel(query, keys, values, mask, 0.25, prefix)
    except (ValueError, MemoryError, ctypes.ArgumentError) as error:
        raise KernelBuildError(f"the compiled kernel failed its check: {error}") from error
    all_keys = torch.cat([prefix[0].expand(rows, -1, -1, -1), keys], dim=2).double()
    all_values = torch.cat([prefix[1].expand(rows, -1, -1, -1), values], dim=2).double()
    scores = query.double() @ all_keys.transpose(-1, -2) * 0.25 + mask.double()[:, None, None, :]
    expected = torch.softmax(scores, dim=-1) @ all_values
    error = (out.double() - expected).abs().max().item() if out.shape == expected.shape else float("inf")
    if not error <= 1e-4:
        raise KernelBuildError(f"the compiled kernel gives wrong results on this CPU (largest error {error:.3g})")
    return kernel


def _compiler() -> str:
    name = os.environ.get("CC") or "cc"
    found = shutil.which(name)
    if found is None:
        raise KernelBuildError(f"no C compiler '{name}' (set CC, or install gcc)")
    return found


def _compiler_identity(compiler: str) -> tuple[str, str]:
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise KernelBuildError(f"cannot run {compiler}: {error}") from error
    return compiler, version


def _cpu_identity() -> bytes:
    """What `-march=native` compiles for: a library built on another CPU (a shared home directory) is not reused."""
    cpu = platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return cpu.encode()
    fields = [line for line in info.splitlines() if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join([cpu, *sorted(set(fields))]).encode()


def _run(command: list[str]) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_SECONDS)
    except (OSError, subprocess.SubprocessError) as error:
        raise KernelBuildError(f"{shlex.join(command)}: {error}") from error
    if result.returncode:
        first = next((line for line in result.stderr.splitlines() if line.strip()), f"exit {result.returncode}")
        raise KernelBuildError(f"{Path(command[0]).name} failed: {first}")


def _address(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()



_KERNELS: dict[tuple[int, int, torch.dtype], DecodeKernel | None] = {}
_WARNED: set[str] = set()
_LOCK = threading.Lock()
