"""The fixed-shape decoding step (the one CUDA captures as a graph), run eagerly on the CPU: it gives the growing
cache's turns, token for token, and keeps its workspaces only while the weights stay where they were."""

from __future__ import annotations

import pytest
import torch
from agent_fixtures import ScriptedEnv, tiny_config

from r1trade.models.chat import ChatTokens
from r1trade.models.prefix import cache_keyword
from r1trade.rollout.backend import SamplingConfig, sampling_from_config
from r1trade.rollout.loop import STOP_TEXT, RolloutEngine
from r1trade.rollout.static_step import StepWorkspaces, column_bucket, row_bucket
from r1trade.rollout.transformers_backend import TransformersBackend


@pytest.fixture(scope="module")
def plain_agent():
    """The tiny random policy with the model's own attention (the CPU fast paths off)."""
    from r1trade.models.loading import load_agent_models

    models = load_agent_models(tiny_config(cpu_kernels="off"), seed=0)
    return models.policy, models.tokenizer


def _rollouts(model, tokenizer, sampling: SamplingConfig, *, fixed_step: bool, stop_every: int = 0, seed: int = 5):
    chat = ChatTokens(tokenizer)
    stop_ids = chat.stop_ids | (set(range(0, len(tokenizer), stop_every)) if stop_every else set())
    backend = TransformersBackend(model, tokenizer, sampling, stop_ids=stop_ids, stop_text=STOP_TEXT,
                                  fixed_step=fixed_step)
    envs = [ScriptedEnv(turns=3), ScriptedEnv(turns=4, reset_every=2), ScriptedEnv(turns=2), ScriptedEnv(turns=3)]
    generator = None if sampling.greedy else torch.Generator().manual_seed(seed)
    return RolloutEngine(backend, tokenizer).run(envs, seeds=[0, 1, 2, 3], generator=generator), backend


def _assert_same(runs_a, runs_b, atol: float = 1e-5) -> None:
    for a, b in zip(runs_a, runs_b, strict=True):
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        for x, y in zip(a.segments, b.segments, strict=True):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=0)


def test_buckets_are_powers_of_two():
    assert [row_bucket(n) for n in (1, 2, 3, 4, 5, 48, 64, 65)] == [1, 2, 4, 4, 8, 64, 64, 128]
    assert [column_bucket(n) for n in (1, 256, 257, 700, 1024, 1025)] == [256, 256, 512, 1024, 1024, 2048]


def test_greedy_turns_equal_the_growing_caches(plain_agent):
    """Multi-turn episodes, contexts reset, turns ended at scattered lengths: every token and log-prob equal."""
    model, tokenizer = plain_agent
    sampling = SamplingConfig(max_new_tokens=16, greedy=True, compact_below=0.0)
    growing, _ = _rollouts(model, tokenizer, sampling, fixed_step=False, stop_every=11)
    fixed, backend = _rollouts(model, tokenizer, sampling, fixed_step=True, stop_every=11)
    assert backend.workspaces._spaces  # the steps ran in workspaces
    _assert_same(growing, fixed)


def test_sampled_turns_with_rows_set_apart_equal_the_growing_caches_and_repeat(plain_agent):
    """Sampled, finished rows set apart into a smaller bucket's workspace: the same draws as the growing cache,
    and the same again from the same seed."""
    model, tokenizer = plain_agent
    sampling = SamplingConfig(max_new_tokens=24, temperature=1.0, compact_below=0.5)
    growing, _ = _rollouts(model, tokenizer, sampling, fixed_step=False, stop_every=9)
    fixed, backend = _rollouts(model, tokenizer, sampling, fixed_step=True, stop_every=9)
    again, _ = _rollouts(model, tokenizer, sampling, fixed_step=True, stop_every=9)
    row_buckets = {rows for rows, _ in backend.workspaces._spaces}
    assert max(row_buckets) == 4 and min(row_buckets) < 4  # all four rows, and the rows set apart
    _assert_same(growing, fixed)
    _assert_same(fixed, again, atol=0.0)


def test_a_workspace_writes_one_column_a_step_and_hands_back_what_the_steps_added(plain_agent):
    """Two rows loaded with 3 cached columns (row 1 left-padded by one): a step where both decode, then one where
    row 1 has stopped. The added mask is each row's live bits, positions advance only for live rows, the written
    keys land in columns 3 and 4, and the padding row of the bucket (rows 2-3) is never read."""
    model, tokenizer = plain_agent
    pool = StepWorkspaces(model, pad_id=0, cache_keyword=cache_keyword(model), capture=False)
    config = model.config
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    layers = [(torch.randn(3, heads, 3, dim), torch.randn(3, heads, 3, dim)) for _ in range(config.num_hidden_layers)]
    space = pool.get(layers, rows=3, columns=3 + 2)
    assert space.attends.shape == (4, 256)
    attention, positions = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 1, 1]]), torch.tensor([3, 2, 3])
    space.load(layers, attention, positions)
    first = space.step(torch.tensor([5, 6, 7]), torch.tensor([True, True, True]))
    second = space.step(torch.tensor([8, 9, 10]), torch.tensor([True, False, True]))
    assert first.shape == second.shape == (3, config.vocab_size)
    added_layers, added_attention, next_position = space.added()
    assert added_attention.tolist() == [[1, 1], [1, 0], [1, 1]]
    assert next_position.tolist() == [5, 3, 5]
    assert added_layers[0][0].shape == (3, heads, 2, dim)
    assert torch.equal(space.kv.layers[0].keys[:3, :, :3], layers[0][0])  # the loaded columns, untouched
    assert not space.attends[3, 1:].any()  # the padding row attends to its one column only


def test_workspaces_are_reused_the_last_used_kept_and_all_dropped_when_the_weights_move(plain_agent):
    model, _ = plain_agent
    pool = StepWorkspaces(model, pad_id=0, cache_keyword=cache_keyword(model), capture=False)
    pool.KEPT = 2
    layers = [(torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8))]
    pool.check_weights()
    first = pool.get(layers, rows=3, columns=100)
    assert pool.get(layers, rows=4, columns=200) is first  # the same bucket (4 rows, 256 columns)
    pool.get(layers, rows=9, columns=100)
    pool.get(layers, rows=2, columns=100)
    assert list(pool._spaces) == [(16, 256), (2, 256)]  # the least recently used went
    pool.check_weights()
    assert len(pool._spaces) == 2  # the weights have not moved
    original = [p.data for p in model.parameters()]
    try:
        for p in model.parameters():
            p.data = p.data.clone()
        pool.check_weights()
        assert not pool._spaces
    finally:
        for p, data in zip(model.parameters(), original, strict=True):
            p.data = data


def test_the_fixed_step_is_on_by_default_only_on_cuda(plain_agent):
    from r1trade.config import RolloutConfig

    model, tokenizer = plain_agent
    assert sampling_from_config(RolloutConfig(cuda_graphs=False)).cuda_graphs is False
    chat = ChatTokens(tokenizer)
    backend = TransformersBackend(model, tokenizer, SamplingConfig(), stop_ids=chat.stop_ids, stop_text=STOP_TEXT)
    assert backend.workspaces is None  # on the CPU, by default
