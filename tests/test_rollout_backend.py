"""The generation engine on the tiny model: the KV cache changes nothing but speed, compaction and a shared prefix
keep each row's columns exactly."""

from __future__ import annotations

import pytest
import torch
from agent_fixtures import ScriptedEnv

from r1trade.models.chat import ChatTokens
from r1trade.rollout.backend import SamplingConfig
from r1trade.rollout.build import transformers_engine


def test_without_cache_reuse_the_trajectories_are_the_same(tiny_agent):
    model, tokenizer = tiny_agent
    def envs():
        return [ScriptedEnv(turns=3), ScriptedEnv(turns=3, reset_every=2)]

    results = []
    for reuse in (True, False):
        engine = transformers_engine(model, tokenizer, SamplingConfig(max_new_tokens=10, greedy=True), reuse_cache=reuse)
        results.append(engine.run(envs(), seeds=[0, 1]))
    for cached, fresh in zip(*results):
        assert [s.token_ids for s in cached.segments] == [s.token_ids for s in fresh.segments]
        for a, b in zip(cached.segments, fresh.segments):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_growing_cache_layer_matches_concatenation():
    """In-place appends (buffer doubling past 256 columns), row selection and repetition equal torch.cat's."""
    from r1trade.rollout.transformers_backend import _GrowingLayer

    torch.manual_seed(0)
    layer, keys, values = _GrowingLayer(), [], []
    for width in (200, 1, 1, 100, 1, 300):  # grows at 302 columns (to 512) and at 603 (to 1024)
        k, v = torch.randn(3, 2, width, 4), torch.randn(3, 2, width, 4)
        keys.append(k)
        values.append(v)
        got_k, got_v = layer.update(k, v)
        assert torch.equal(got_k, torch.cat(keys, dim=2)) and torch.equal(got_v, torch.cat(values, dim=2))
    assert layer.get_seq_length() == 603
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys, torch.cat(keys, dim=2)[[2, 0]])
    layer.batch_repeat_interleave(2)
    assert torch.equal(layer.values, torch.cat(values, dim=2)[[2, 2, 0, 0]])
    k = torch.randn(4, 2, 1, 4)
    assert torch.equal(layer.update(k, k)[0][:, :, -1:], k) and layer.get_seq_length() == 604


def _filled_cache(attention: list[list[int]]):
    """A one-layer `_BatchCache` whose key at (row, column) is row·100 + column, value its negative."""
    from r1trade.rollout.transformers_backend import _BatchCache

    rows, length = len(attention), len(attention[0])
    cache = _BatchCache(rows, torch.device("cpu"))
    keys = (torch.arange(rows)[:, None] * 100 + torch.arange(length)[None, :]).float()  # (R, L)
    keys = keys[:, None, :, None].expand(rows, 1, length, 2).contiguous()  # (R, H_kv=1, L, D=2)
    cache.kv.update(keys, -keys, 0)
    cache.attention = torch.tensor(attention)
    cache.next_position = torch.tensor([7, 8, 9][:rows])
    return cache


def test_compaction_keeps_each_rows_live_columns_in_order_right_aligned():
    cache = _filled_cache([[0, 1, 0, 1, 0, 0], [1, 1, 1, 0, 0, 1], [0, 0, 0, 0, 1, 0]])
    cache.compact({}, None)
    assert cache.attention.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]]
    keys = cache.kv.layers[0].keys[:, 0, :, 0]  # (R, W)
    live = cache.attention.bool()
    assert keys[0][live[0]].tolist() == [1, 3]
    assert keys[1].tolist() == [100, 101, 102, 105]
    assert keys[2][live[2]].tolist() == [204]
    assert torch.equal(cache.kv.layers[0].values, -cache.kv.layers[0].keys)
    assert cache.next_position.tolist() == [7, 8, 9]  # rotary positions travel with the keys: nothing to change
    assert len(cache.kv.layers[0].update(torch.ones(3, 1, 1, 2), torch.ones(3, 1, 1, 2))[0][0, 0]) == 5


def test_compaction_is_skipped_while_few_columns_are_dead():
    cache = _filled_cache([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    cache.compact({}, None)
    assert cache.attention.shape == (2, 5)


def test_a_restarted_row_drops_its_columns_and_starts_from_the_shared_prefix():
    from r1trade.rollout.transformers_backend import _Prefix

    cache = _filled_cache([[1, 1, 1, 1], [1, 1, 1, 1]])
    prefix_keys = torch.full((1, 1, 3, 2), -5.0)
    prefix = _Prefix(ids=[4, 5, 6], layers=[(prefix_keys, -prefix_keys)])
    assert prefix.shared_length([4, 5, 9, 9]) == 2
    assert prefix.shared_length([4, 5, 6]) == 2  # the last token is always left to prefill
    assert prefix.shared_length([8, 5, 6, 1]) == 0
    cache.compact({1: 2}, prefix)
    assert cache.attention.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert cache.kv.layers[0].keys[1, 0, 2:, 0].tolist() == [-5.0, -5.0]
    assert cache.kv.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3]
    assert cache.next_position.tolist() == [7, 2]
    cache.compact({0: 0}, prefix)  # a row whose fresh context shares nothing starts empty at position 0
    assert cache.attention.tolist() == [[0, 0], [1, 1]] and cache.next_position.tolist() == [0, 2]


def test_context_resets_in_a_batch_reuse_the_prefix_and_keep_the_cache_small(tiny_agent):
    """Long episodes with resets: same tokens as without cache reuse, and the cache never outgrows a context."""
    model, tokenizer = tiny_agent
    widths = []
    engine = transformers_engine(model, tokenizer, SamplingConfig(max_new_tokens=8, greedy=True))
    prefill = engine.backend._prefill
    engine.backend._prefill = lambda cache, chunks: (widths.append(cache.attention.shape[1]), prefill(cache, chunks))[1]
    cached = engine.run([ScriptedEnv(turns=9, reset_every=2), ScriptedEnv(turns=9, reset_every=3)], seeds=[0, 1])
    fresh = transformers_engine(model, tokenizer, SamplingConfig(max_new_tokens=8, greedy=True), reuse_cache=False).run(
        [ScriptedEnv(turns=9, reset_every=2), ScriptedEnv(turns=9, reset_every=3)], seeds=[0, 1]
    )
    for a, b in zip(cached, fresh):
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        for x, y in zip(a.segments, b.segments):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    longest_segment = max(len(s) for t in cached for s in t.segments)
    assert max(widths) <= longest_segment + 2 * 8  # live context plus at most one turn of padding per row


@pytest.mark.cpu_kernels
def test_with_a_shared_prefix_a_restarted_row_attends_to_its_part_of_it_and_holds_no_copy():
    from r1trade.cpu.attention import SharedPrefix
    from r1trade.rollout.transformers_backend import _Prefix

    cache = _filled_cache([[1, 1, 1, 1], [1, 1, 1, 1]])
    prefix_keys = torch.full((1, 1, 3, 2), -5.0)
    prefix = _Prefix(ids=[4, 5, 6], layers=[(prefix_keys, -prefix_keys)])
    cache.shared = SharedPrefix(prefix.layers, torch.ones(2, 3, dtype=torch.bool))
    cache.compact({1: 2}, prefix)
    assert cache.attention.tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]  # row 1 keeps nothing of its own
    assert cache.shared.attention.tolist() == [[True, True, True], [True, True, False]]
    assert cache.kv.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3]
    assert cache.next_position.tolist() == [7, 2]
    cache.keep_rows([1])
    assert cache.shared.attention.tolist() == [[True, True, False]] and cache.next_position.tolist() == [2]


@pytest.mark.cpu_kernels
def test_a_shared_prefix_gives_the_same_trajectories_as_a_copy_per_row_and_a_smaller_cache(tiny_agent):
    model, tokenizer = tiny_agent

    def rollout(shared: bool):
        engine = transformers_engine(model, tokenizer, SamplingConfig(max_new_tokens=8, greedy=True))
        backend = engine.backend
        assert backend.shared_prefix  # the tiny model uses the rollout attention
        backend.shared_prefix = shared
        widths, prefill = [], backend._prefill
        backend._prefill = lambda cache, chunks: (widths.append(cache.attention.shape[1]), prefill(cache, chunks))[1]
        envs = [ScriptedEnv(turns=5, reset_every=2), ScriptedEnv(turns=4)]
        return engine.run(envs, seeds=[0, 1]), widths

    (shared, shared_widths), (copied, copied_widths) = rollout(True), rollout(False)
    for a, b in zip(shared, copied):
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        for x, y in zip(a.segments, b.segments):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    prefix = len(ChatTokens(tokenizer).context([{"role": "system", "content": "You trade."}]))
    assert max(shared_widths) < max(copied_widths) - prefix // 2  # the rows' caches do not hold the system prompt
