"""The compiled decoding kernel: attention against a float64 reference, the build cache and the fallbacks."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest
import torch

from r1trade.cpu import decode_kernel as kernels
from r1trade.cpu.decode_kernel import KernelBuildError, build, decode_kernel, fits_kernel

LOWEST = torch.finfo(torch.float32).min


def _reference(query, keys, values, mask, scale, prefix=None):
    """`softmax(q·Kᵀ·scale + mask)·V` in float64 over the prefix's columns and then the own ones: (B, H_kv, G, D)."""
    if prefix is not None:
        rows = keys.shape[0]
        keys = torch.cat([prefix[0].expand(rows, -1, -1, -1), keys], dim=2)
        values = torch.cat([prefix[1].expand(rows, -1, -1, -1), values], dim=2)
    scores = torch.einsum("bhgd,bhld->bhgl", query.double(), keys.double()) * scale
    if mask is not None:
        scores = scores + mask.double()[:, None, None, :]
    return torch.softmax(scores, dim=-1) @ values.double()


def _case(groups: int, dim: int, prefix_length: int, own: int, *, seed: int = 0, rows: int = 4, kv_heads: int = 3):
    """A step as a rollout hands it over: own keys/values are the filled part of a cache buffer with spare room
    (rows and heads strided), the prefix is shared, and the mask rules out some columns per row."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, kv_heads, groups, dim, generator=generator)
    buffers = [torch.randn(rows, kv_heads, own + 19, dim, generator=generator) for _ in range(2)]
    keys, values = (buffer[:, :, :own] for buffer in buffers)
    prefix = None
    if prefix_length:
        prefix = tuple(torch.randn(1, kv_heads, prefix_length, dim, generator=generator) for _ in range(2))
    mask = torch.zeros(rows, prefix_length + own)
    mask[0, prefix_length : prefix_length + 5] = LOWEST  # row 0: 5 dead own columns (left padding)
    mask[1, :3] = LOWEST  # row 1 shares fewer of the prefix's columns
    mask[2, -2] = LOWEST  # a masked column between attended ones
    return query, keys, values, mask, prefix


@pytest.mark.parametrize(
    ("groups", "dim", "prefix_length", "own"),
    [
        (3, 64, 37, 45),  # SmolLM2-135M's shape; column counts that are not multiples of 16
        (2, 16, 0, 70),  # the tiny test model's shape, no prefix
        (1, 32, 16, 1),  # one query head per key/value head; a single own column
    ],
)
def test_the_kernel_matches_attention_in_float64(groups, dim, prefix_length, own) -> None:
    query, keys, values, mask, prefix = _case(groups, dim, prefix_length, own)
    kernel = decode_kernel(groups, dim)
    assert kernel is not None, "cc is on this machine: the kernel must build"
    out = kernel(query, keys, values, mask, 0.125, prefix)
    assert out.shape == query.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(query, keys, values, mask, 0.125, prefix), atol=2e-6, rtol=1e-5)
    unmasked = kernel(query, keys, values, None, 0.125, prefix)
    torch.testing.assert_close(unmasked.double(), _reference(query, keys, values, None, 0.125, prefix), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
def test_the_bfloat16_build_reads_bfloat16_keys_and_values_and_sums_in_float32(query_dtype) -> None:
    """The keys and values of a model run in bfloat16: each read exactly, every sum in float32, so the result is
    float32 attention over those numbers, rounded to the query's dtype."""
    query, keys, values, mask, prefix = _case(3, 64, 37, 45, seed=3)
    keys, values = keys.bfloat16(), values.bfloat16()
    prefix = tuple(t.bfloat16() for t in prefix)
    query = query.to(query_dtype)
    kernel = decode_kernel(3, 64, torch.bfloat16)
    assert kernel is not None and kernel.dtype == torch.bfloat16
    out = kernel(query, keys, values, mask, 0.125, prefix)
    assert out.shape == query.shape and out.dtype == query_dtype
    expected = _reference(query, keys, values, mask, 0.125, prefix)
    if query_dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    else:  # rounded once, to bfloat16's 8 bits
        assert torch.equal(out, expected.float().bfloat16()) or (out.double() - expected).abs().max() < 1e-2
        torch.testing.assert_close(out.double(), expected, atol=4e-3, rtol=4e-3)
    with pytest.raises(ValueError, match="bfloat16 CPU keys"):  # a float32 cache goes to the float32 build
        kernel(query, keys.float(), values.float(), mask, 0.125, tuple(t.float() for t in prefix))
    with pytest.raises(ValueError, match="float32 CPU keys"):
        decode_kernel(3, 64)(query, keys, values, mask, 0.125, prefix)


def test_a_row_that_attends_to_nothing_gets_zeros_and_the_others_are_unaffected() -> None:
    query, keys, values, mask, prefix = _case(3, 64, 20, 30)
    mask[3] = LOWEST
    out = decode_kernel(3, 64)(query, keys, values, mask, 0.125, prefix)
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    expected = _reference(query[:3], keys[:3], values[:3], mask[:3], 0.125, prefix)
    torch.testing.assert_close(out[:3].double(), expected, atol=2e-6, rtol=1e-5)


def test_the_result_does_not_depend_on_the_thread_count() -> None:
    """Each row and head is computed whole by one thread, so splitting the work differently changes no bit."""
    query, keys, values, mask, prefix = _case(3, 64, 40, 200, rows=5)
    kernel = decode_kernel(3, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel(query, keys, values, mask, 0.125, prefix)
        torch.set_num_threads(3)  # 5 rows over 3 threads: the work splits unevenly
        shared = kernel(query, keys, values, mask, 0.125, prefix)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(shared, alone)


def test_inputs_the_kernel_cannot_read_are_refused() -> None:
    query, keys, values, mask, prefix = _case(2, 16, 4, 8)
    kernel = decode_kernel(2, 16)
    projected = torch.randn(4, 8, 3 * 16).view(4, 8, 3, 16).transpose(1, 2)  # rows strided across heads
    assert fits_kernel(keys) and not fits_kernel(projected) and not fits_kernel(keys.double())
    assert fits_kernel(keys.bfloat16(), values.bfloat16()) and not fits_kernel(keys.bfloat16(), values)
    assert not fits_kernel(torch.randn(4, 3, 8, 8))  # a head size that is not a multiple of 16
    with pytest.raises(ValueError, match="dense"):
        kernel(query, projected, values, mask, 0.125, prefix)
    with pytest.raises(ValueError, match="does not fit"):
        kernel(query[:, :, :1], keys, values, mask, 0.125, prefix)
    with pytest.raises(ValueError, match="mask"):
        kernel(query, keys, values, mask[:, 1:], 0.125, prefix)


def test_a_build_is_kept_per_shape_and_reused(tmp_path, monkeypatch) -> None:
    first = build(2, 16, tmp_path)
    other = build(3, 16, tmp_path)
    assert first.is_file() and other.is_file() and first != other
    bfloat16 = build(2, 16, tmp_path, dtype=torch.bfloat16)
    assert "g2_d16" in first.name and "g3_d16" in other.name and "g2_d16_bfloat16" in bfloat16.name
    monkeypatch.setattr(kernels, "_run", lambda command: pytest.fail(f"rebuilt: {command}"))
    assert build(2, 16, tmp_path) == first and build(2, 16, tmp_path, dtype=torch.bfloat16) == bfloat16
    with pytest.raises(KernelBuildError, match="float16 keys"):
        build(2, 16, tmp_path, dtype=torch.float16)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no build directory left behind


def _has_avx2() -> bool:
    try:
        return platform.machine() == "x86_64" and " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx2(), reason="builds for x86-64-v3 (AVX2) and runs the result")
def test_the_kernel_is_right_on_cpus_without_avx512_too(tmp_path, monkeypatch) -> None:
    """On AVX2 the compiler splits each 16-float vector and its shuffles in two: same results."""
    flags = tuple("-march=x86-64-v3" if flag == "-march=native" else flag for flag in kernels.COMPILE_FLAGS)
    monkeypatch.setattr(kernels, "COMPILE_FLAGS", flags)
    query, keys, values, mask, prefix = _case(3, 64, 37, 45, seed=1)
    for dtype in (torch.float32, torch.bfloat16):
        kernel = kernels._load(build(3, 64, tmp_path, dtype=dtype), 3, 64, dtype)
        keys, values, prefix = keys.to(dtype), values.to(dtype), tuple(t.to(dtype) for t in prefix)
        out = kernel(query, keys, values, mask, 0.125, prefix)
        expected = _reference(query, keys, values, mask, 0.125, prefix)
        torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("compiler", "message"),
    [("no-such-compiler", "no C compiler 'no-such-compiler'"), ("false", "false failed: exit 1")],
)
def test_without_a_working_compiler_attention_stays_with_torch_and_says_so_once(
    tmp_path, monkeypatch, caplog, compiler, message
) -> None:
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("R1TRADE_CACHE", str(tmp_path))
    monkeypatch.setattr(kernels, "_KERNELS", {})
    monkeypatch.setattr(kernels, "_WARNED", set())
    with pytest.raises(KernelBuildError, match=message):
        build(2, 16, tmp_path)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        assert decode_kernel(2, 16) is None
        assert decode_kernel(2, 16) is None
        assert decode_kernel(2, 16, torch.bfloat16) is None  # the same reason is not said again for bfloat16
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "stays with torch" in warnings[0] and message in warnings[0]


def test_a_head_size_the_kernel_does_not_take_is_not_built() -> None:
    with pytest.raises(KernelBuildError, match="size 24"):
        build(2, 24)
