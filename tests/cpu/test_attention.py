"""The rollout attention gives SDPA's results without repeating key/value heads."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from r1trade.cpu import attention
from r1trade.cpu.attention import (
    GROUPED_ATTENTION,
    KERNEL_ATTENTION,
    SharedPrefix,
    grouped_query_attention,
    use_decoding_attention,
)
from r1trade.models.loading import build_tiny_model
from r1trade.models.tokenizer import build_tiny_tokenizer


def _sdpa_reference(query, key, value, mask, scale):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)  # (B, Q, H, D)


@pytest.fixture
def kernel_calls(monkeypatch) -> list[bool]:
    """One entry per decoding step `_kernel_step` was asked for: True where the compiled kernel computed it."""
    calls, step = [], attention._kernel_step

    def counted(*args, **kwargs):
        out = step(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(attention, "_kernel_step", counted)
    return calls


@pytest.mark.parametrize(("dim", "kernel"), [(8, False), (16, True), (8, True)])
def test_one_decoding_step_equals_sdpa_with_repeated_heads(kernel_calls, dim, kernel) -> None:
    torch.manual_seed(0)
    module = torch.nn.Module()
    query = torch.randn(4, 6, 1, dim)  # 6 query heads over 2 key/value heads
    key, value = torch.randn(4, 2, 10, dim), torch.randn(4, 2, 10, dim)
    mask = torch.ones(4, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :3] = False  # left padding in row 0
    mask[2, ..., 5] = False
    with torch.no_grad():
        out, _ = grouped_query_attention(module, query, key, value, mask, scaling=0.3, kernel=kernel)
        unmasked, _ = grouped_query_attention(module, query, key, value, None, scaling=0.3, kernel=kernel)
    torch.testing.assert_close(out, _sdpa_reference(query, key, value, mask, 0.3))
    torch.testing.assert_close(unmasked, _sdpa_reference(query, key, value, None, 0.3))
    # the kernel computes the step where asked and the head size suits it (a multiple of 16), torch elsewhere
    assert kernel_calls == ([dim % 16 == 0] * 2 if kernel else [])


def test_a_bfloat16_decoding_step_goes_to_the_bfloat16_kernel_with_its_mask_in_float32(kernel_calls) -> None:
    """A model run in bfloat16 masks with bfloat16's lowest value; the kernel is handed float32's, so masked
    columns are skipped, and its float32 sums are rounded once: closer to exact than SDPA in bfloat16."""
    torch.manual_seed(1)
    module = torch.nn.Module()
    query = torch.randn(4, 6, 1, 16).bfloat16()
    key, value = torch.randn(4, 2, 10, 16).bfloat16(), torch.randn(4, 2, 10, 16).bfloat16()
    mask = torch.ones(4, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :3] = False
    mask[3] = False  # a row with nothing to attend to: zeros, as the float32 kernel gives
    with torch.no_grad():
        out, _ = grouped_query_attention(module, query, key, value, mask, scaling=0.3, kernel=True)
    assert kernel_calls == [True] and out.dtype == torch.bfloat16
    exact = _sdpa_reference(query[:3].double(), key[:3].double(), value[:3].double(), mask[:3], 0.3)
    assert (out[:3].double() - exact).abs().max() <= exact.abs().max() * 2**-8  # one bfloat16 rounding
    assert torch.equal(out[3], torch.zeros_like(out[3]))


@pytest.mark.parametrize(
    ("scores_per_chunk", "dtype", "projected"),
    [
        (1 << 22, torch.float32, False),  # oneDNN products, all 15 folded queries of a row and head at once
        (12, torch.float32, False),  # one folded query per chunk
        (60, torch.float32, False),  # 5 per chunk: chunks cut across the folded query heads
        (1 << 22, torch.float32, True),  # keys and values viewed out of a projection: rows strided across heads
        (1 << 22, torch.float64, False),  # not a oneDNN type: SDPA
    ],
)
def test_a_masked_prefill_over_a_cache_equals_sdpa_with_repeated_heads(
    monkeypatch, scores_per_chunk, dtype, projected
) -> None:
    monkeypatch.setattr(attention, "_SCORES_PER_CHUNK", scores_per_chunk)
    torch.manual_seed(1)
    query = torch.randn(3, 6, 5, 8, dtype=dtype)  # 5 new tokens per row, 6 query heads over 2 key/value heads
    if projected:  # (B, L, H_kv·D) -> (B, H_kv, L, D) as the model's projections give them
        key, value = (torch.randn(3, 12, 2 * 8).view(3, 12, 2, 8).transpose(1, 2) for _ in range(2))
        assert key.stride(-2) == 16
    else:
        key = torch.randn(3, 2, 12, 8, dtype=dtype)  # 7 cached columns + the 5 new ones
        value = torch.randn(3, 2, 12, 8, dtype=dtype)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    mask = torch.ones(3, 1, 5, 12, dtype=torch.bool)
    mask[..., 7:] = causal
    mask[0, ..., :4] = False  # row 0 has 4 dead cached columns
    mask[1, ..., 7:9] = False  # row 1 is left-padded by 2 in this chunk: no query attends to the padding
    with torch.no_grad():
        out, _ = grouped_query_attention(torch.nn.Module(), query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(out, _sdpa_reference(query, key, value, mask, 0.25))


@pytest.mark.parametrize("kernel", [False, True])
def test_a_step_with_nothing_to_attend_to_stays_finite(kernel) -> None:
    query, key, value = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    with torch.no_grad():
        nothing = torch.zeros(1, 1, 1, 5, dtype=bool)
        out, _ = grouped_query_attention(torch.nn.Module(), query, key, value, nothing, kernel=kernel)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("kernel", [False, True])
def test_model_with_the_decoding_attention_matches_sdpa_in_prefill_decode_and_gradients(kernel_calls, kernel) -> None:
    tokenizer = build_tiny_tokenizer()
    sdpa = build_tiny_model(tokenizer, seed=3)
    grouped = use_decoding_attention(build_tiny_model(tokenizer, seed=3), kernel=kernel)
    assert sdpa.config._attn_implementation == "sdpa"
    assert grouped.config._attn_implementation == (KERNEL_ATTENTION if kernel else GROUPED_ATTENTION)
    ids = torch.randint(3, len(tokenizer), (3, 12))
    attention = torch.ones(3, 12, dtype=torch.long)
    attention[0, :4] = 0
    with torch.no_grad():
        full = sdpa(input_ids=ids, attention_mask=attention).logits[:, -1]
        prefix = grouped(input_ids=ids[:, :11], attention_mask=attention[:, :11], use_cache=True)
        step = grouped(input_ids=ids[:, 11:], attention_mask=attention, past_key_values=prefix.past_key_values)
    torch.testing.assert_close(step.logits[:, -1], full, atol=1e-5, rtol=1e-5)
    assert kernel_calls == ([True] * 2 if kernel else [])  # the decoding step in both layers
    for model in (sdpa, grouped):
        model(input_ids=ids, attention_mask=attention).logits.sum().backward()
    for (name, a), (_, b) in zip(sdpa.named_parameters(), grouped.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_models_with_other_attention_are_left_alone() -> None:
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    assert use_decoding_attention(model).config._attn_implementation == "eager"


def _prefix_case(seed: int, new: int, dim: int = 8):
    """Queries of 3 rows over a 4-column shared prefix and 6 own columns (the last `new` of them just added)."""
    torch.manual_seed(seed)
    query = torch.randn(3, 6, new, dim)  # 6 query heads over 2 key/value heads
    prefix_keys, prefix_values = torch.randn(1, 2, 4, dim), torch.randn(1, 2, 4, dim)
    key, value = torch.randn(3, 2, 6, dim), torch.randn(3, 2, 6, dim)
    prefix_attention = torch.ones(3, 4, dtype=torch.bool)
    prefix_attention[2, 3:] = False  # row 2 shares only 3 of the prefix's columns
    own = torch.ones(3, 1, new, 6, dtype=torch.bool)
    own[..., 6 - new :] = torch.ones(new, new, dtype=torch.bool).tril()
    own[0, ..., :2] = False  # row 0 has two dead own columns
    whole_keys = torch.cat([prefix_keys.expand(3, -1, -1, -1), key], dim=2)
    whole_values = torch.cat([prefix_values.expand(3, -1, -1, -1), value], dim=2)
    whole_mask = torch.cat([prefix_attention[:, None, None, :].expand(3, 1, new, 4), own], dim=-1)
    module = torch.nn.Module()
    module.layer_idx = 0
    shared = SharedPrefix([(prefix_keys, prefix_values)], prefix_attention)
    return module, query, key, value, own, shared, (whole_keys, whole_values, whole_mask)


@pytest.mark.parametrize(("dim", "kernel"), [(8, False), (16, True)])
def test_a_decoding_step_after_a_shared_prefix_equals_sdpa_over_prefix_and_own_columns(kernel_calls, dim, kernel):
    module, query, key, value, own, shared, (keys, values, mask) = _prefix_case(seed=2, new=1, dim=dim)
    with torch.no_grad():
        out, _ = grouped_query_attention(
            module, query, key, value, own, scaling=0.3, shared_prefix=shared, kernel=kernel
        )
    torch.testing.assert_close(out, _sdpa_reference(query, keys, values, mask, 0.3))
    assert kernel_calls == ([True] if kernel else [])


def test_a_prefill_after_a_shared_prefix_equals_sdpa_over_prefix_and_own_columns() -> None:
    module, query, key, value, own, shared, (keys, values, mask) = _prefix_case(seed=3, new=4)
    with torch.no_grad():
        out, _ = grouped_query_attention(module, query, key, value, own, scaling=0.3, shared_prefix=shared)
    torch.testing.assert_close(out, _sdpa_reference(query, keys, values, mask, 0.3))


def test_no_mask_after_a_shared_prefix_means_causal_over_the_own_columns() -> None:
    module, query, key, value, _, shared, _ = _prefix_case(seed=4, new=6)  # a first prefill: all columns are new
    shared.attention[:] = True
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(3, 1, 6, 6)
    with torch.no_grad():
        implicit, _ = grouped_query_attention(module, query, key, value, None, shared_prefix=shared)
        explicit, _ = grouped_query_attention(module, query, key, value, causal, shared_prefix=shared)
    torch.testing.assert_close(implicit, explicit)


def test_a_shared_prefix_is_refused_where_gradients_are_needed() -> None:
    module, query, key, value, own, shared, _ = _prefix_case(seed=5, new=1)
    with pytest.raises(ValueError, match="inference"):
        grouped_query_attention(module, query, key, value, own, shared_prefix=shared)


def test_a_prefill_mask_is_built_once_per_forward_pass_and_dropped_with_it() -> None:
    from r1trade.cpu.attention import _additive, _MaskPerForward

    masks, builds = _MaskPerForward(), []

    def build(mask):
        return lambda: builds.append(mask.shape) or _additive(mask, torch.float32)

    first = torch.tensor([[True, False]])
    derived = masks.get(first, build(first))
    assert derived.tolist() == [[0.0, torch.finfo(torch.float32).min]]
    assert masks.get(first, build(first)) is derived and len(builds) == 1  # the next layer of the same pass
    second = torch.tensor([[True, True]])
    assert masks.get(second, build(second)).tolist() == [[0.0, 0.0]] and len(builds) == 2  # the next pass
    del second
    assert masks._mask is None  # freed with the pass's mask


def test_only_keys_strided_across_heads_are_copied_for_onednn() -> None:
    """oneDNN's products need dense (L, D) blocks; a cache buffer's slice has them and is used as it is."""
    buffer = torch.randn(2, 3, 16, 8)  # (B, H_kv, capacity, D)
    cached = buffer[:, :, :10]
    assert attention._dense_rows(cached) is cached
    projected = torch.randn(2, 10, 3 * 8).view(2, 10, 3, 8).transpose(1, 2)
    dense = attention._dense_rows(projected)
    assert dense is not projected and dense.stride(-2) == 8 and torch.equal(dense, projected)
