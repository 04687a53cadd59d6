"""Rollout engine on the tiny model: masks select exactly the model's words, rewards sit where they belong,
the KV cache changes nothing but speed."""

from __future__ import annotations

import torch
from agent_fixtures import tiny_agent  # noqa: F401  (fixture)

from r1trade.agent.rollout import ChatTokens, RolloutEngine, SamplingConfig, Trajectory


class ScriptedEnv:
    """A text env with a fixed number of turns; resets its context every `reset_every` turns."""

    def __init__(self, turns: int = 3, reset_every: int = 0) -> None:
        self.turns, self.reset_every = turns, reset_every
        self.t = 0
        self.seen: list[str] = []

    def reset(self, seed=None, options=None):
        self.t, self.seed = 0, seed
        return [{"role": "system", "content": "You trade."}, {"role": "user", "content": f"Start {seed}: price 100"}], {}

    def step(self, text):
        self.seen.append(text)
        self.t += 1
        done = self.t >= self.turns
        info = {"turn": self.t, "context_reset": bool(self.reset_every) and self.t % self.reset_every == 0}
        if info["context_reset"]:
            messages = [{"role": "system", "content": "You trade."}, {"role": "user", "content": f"Summary {self.t}"}]
        else:
            messages = [{"role": "tool", "content": f"result {self.t}"}, {"role": "user", "content": f"price {100 + self.t}"}]
        return messages, float(self.t), done, False, info


def decode_masked(tokenizer, trajectory: Trajectory, bit: int) -> str:
    return "".join(
        tokenizer.decode([t for t, m in zip(seg.token_ids, seg.action_mask) if m == bit], skip_special_tokens=False)
        for seg in trajectory.segments
    )


def run(agent, envs, *, greedy=False, max_new_tokens=12, seed=0):
    model, tokenizer = agent
    engine = RolloutEngine(model, tokenizer, SamplingConfig(max_new_tokens=max_new_tokens, greedy=greedy))
    generator = torch.Generator().manual_seed(seed)
    return engine.run(envs, seeds=list(range(len(envs))), generator=generator)


def test_mask_one_tokens_are_exactly_the_sampled_turns(tiny_agent):
    model, tokenizer = tiny_agent
    envs = [ScriptedEnv(turns=3), ScriptedEnv(turns=2), ScriptedEnv(turns=4, reset_every=2)]
    trajectories = run(tiny_agent, envs)
    for trajectory in trajectories:
        sampled_ids = []
        for turn in trajectory.turns:
            seg = trajectory.segments[turn.segment]
            assert all(seg.action_mask[turn.start : turn.end])
            sampled_ids.append(seg.token_ids[turn.start : turn.end])
        flat = [t for ids in sampled_ids for t in ids]
        masked = [t for seg in trajectory.segments for t, m in zip(seg.token_ids, seg.action_mask) if m]
        assert masked == flat
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in sampled_ids] == [
            turn.text for turn in trajectory.turns
        ]
    assert [len(t.turns) for t in trajectories] == [3, 2, 4]
    assert [len(t.segments) for t in trajectories] == [1, 1, 2]


def test_mask_zero_tokens_are_exactly_the_prompts_and_observations(tiny_agent):
    _, tokenizer = tiny_agent
    chat = ChatTokens(tokenizer)
    env = ScriptedEnv(turns=3)
    (trajectory,) = run(tiny_agent, [env])
    context = tokenizer.decode(trajectory.segments[0].token_ids, skip_special_tokens=False)
    expected_prefix = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You trade."}, {"role": "user", "content": "Start 0: price 100"}],
        tokenize=False, add_generation_prompt=True,
    )
    assert context.startswith(expected_prefix)
    observed = decode_masked(tokenizer, trajectory, 0)
    assert observed.startswith(expected_prefix)
    for t in (1, 2):
        assert f"result {t}" in observed and f"price {100 + t}" in observed
    # injected end-of-turn tokens are mask 0 and sit right after each non-final turn
    seg = trajectory.segments[0]
    for turn in trajectory.turns[:-1]:
        closing = chat.closing(seg.token_ids[turn.start : turn.end])
        assert seg.token_ids[turn.end : turn.end + len(closing)] == closing
        assert not any(seg.action_mask[turn.end : turn.end + len(closing)])


def test_rewards_sit_on_each_turns_last_sampled_token(tiny_agent):
    (trajectory,) = run(tiny_agent, [ScriptedEnv(turns=4, reset_every=2)])
    placed = {}
    for index, seg in enumerate(trajectory.segments):
        for position, reward in enumerate(seg.rewards):
            if reward:
                placed[(index, position)] = reward
    assert placed == {(turn.segment, turn.end - 1): turn.reward for turn in trajectory.turns}
    assert trajectory.total_reward == 1 + 2 + 3 + 4


def test_truncated_turns_are_flagged_and_closed_with_mask_zero_tokens(tiny_agent):
    _, tokenizer = tiny_agent
    (trajectory,) = run(tiny_agent, [ScriptedEnv(turns=2)], max_new_tokens=3)
    turn = trajectory.turns[0]
    assert turn.end - turn.start <= 3
    if turn.truncated:  # a random tiny model rarely stops by itself within 3 tokens
        seg = trajectory.segments[0]
        closing = ChatTokens(tokenizer).turn_closing
        assert seg.token_ids[turn.end : turn.end + len(closing)] == closing
        assert seg.action_mask[turn.end : turn.end + len(closing)] == [0] * len(closing)


def test_greedy_is_the_same_batched_and_one_at_a_time(tiny_agent):
    def envs():
        return [ScriptedEnv(turns=3), ScriptedEnv(turns=2, reset_every=1), ScriptedEnv(turns=3)]

    batched = run(tiny_agent, envs(), greedy=True)
    model, tokenizer = tiny_agent
    engine = RolloutEngine(model, tokenizer, SamplingConfig(max_new_tokens=12, greedy=True))
    for index, env in enumerate(envs()):
        (alone,) = engine.run([env], seeds=[index])
        assert [seg.token_ids for seg in alone.segments] == [seg.token_ids for seg in batched[index].segments]
        assert [seg.action_mask for seg in alone.segments] == [seg.action_mask for seg in batched[index].segments]
        for a, b in zip(alone.segments, batched[index].segments):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_cached_logprobs_equal_a_fresh_forward_pass(tiny_agent):
    model, _ = tiny_agent
    trajectories = run(tiny_agent, [ScriptedEnv(turns=3), ScriptedEnv(turns=4, reset_every=2)])
    for trajectory in trajectories:
        for seg in trajectory.segments:
            ids = torch.tensor([seg.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]  # (T, V)
            fresh = torch.zeros(len(seg))
            fresh[1:] = logp[:-1].gather(1, ids[0, 1:, None]).squeeze(1)
            mask = torch.tensor(seg.action_mask, dtype=torch.bool)
            assert torch.allclose(fresh[mask], torch.tensor(seg.logprobs)[mask], atol=1e-4)


def test_same_generator_seed_same_trajectories(tiny_agent):
    first = run(tiny_agent, [ScriptedEnv(), ScriptedEnv()], seed=3)
    second = run(tiny_agent, [ScriptedEnv(), ScriptedEnv()], seed=3)
    assert [s.token_ids for t in first for s in t.segments] == [s.token_ids for t in second for s in t.segments]


def test_viewer_marks_sampled_and_masked_tokens(tiny_agent):
    from rich.console import Console

    from r1trade.agent.viewer import MASKED_STYLE, SAMPLED_STYLE, render_tokens, render_trajectory

    _, tokenizer = tiny_agent
    (trajectory,) = run(tiny_agent, [ScriptedEnv(turns=2)])
    seg = trajectory.segments[0]
    text = render_tokens(tokenizer, seg.token_ids, seg.action_mask)
    sampled = "".join(text.plain[s.start : s.end] for s in text.spans if s.style == SAMPLED_STYLE)
    masked = "".join(text.plain[s.start : s.end] for s in text.spans if s.style == MASKED_STYLE)
    assert sampled == decode_masked(tokenizer, trajectory, 1)
    assert masked == decode_masked(tokenizer, trajectory, 0)
    console = Console(record=True, width=120)
    console.print(render_trajectory(tokenizer, trajectory))
    assert "total reward +3.0000" in console.export_text()


def test_without_cache_reuse_the_trajectories_are_the_same(tiny_agent):
    model, tokenizer = tiny_agent
    def envs():
        return [ScriptedEnv(turns=3), ScriptedEnv(turns=3, reset_every=2)]

    results = []
    for reuse in (True, False):
        engine = RolloutEngine(model, tokenizer, SamplingConfig(max_new_tokens=10, greedy=True), reuse_cache=reuse)
        results.append(engine.run(envs(), seeds=[0, 1]))
    for cached, fresh in zip(*results):
        assert [s.token_ids for s in cached.segments] == [s.token_ids for s in fresh.segments]
        for a, b in zip(cached.segments, fresh.segments):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_growing_cache_layer_matches_concatenation():
    """In-place appends (buffer doubling past 256 columns), row selection and repetition equal torch.cat's."""
    from r1trade.agent.rollout import _GrowingLayer

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
    from r1trade.agent.rollout import _BatchCache

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
    from r1trade.agent.rollout import _Prefix

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
    engine = RolloutEngine(model, tokenizer, SamplingConfig(max_new_tokens=8, greedy=True))
    prefill = engine._prefill
    engine._prefill = lambda cache, chunks: (widths.append(cache.attention.shape[1]), prefill(cache, chunks))[1]
    cached = engine.run([ScriptedEnv(turns=9, reset_every=2), ScriptedEnv(turns=9, reset_every=3)], seeds=[0, 1])
    fresh = RolloutEngine(model, tokenizer, SamplingConfig(max_new_tokens=8, greedy=True), reuse_cache=False).run(
        [ScriptedEnv(turns=9, reset_every=2), ScriptedEnv(turns=9, reset_every=3)], seeds=[0, 1]
    )
    for a, b in zip(cached, fresh):
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        for x, y in zip(a.segments, b.segments):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    longest_segment = max(len(s) for t in cached for s in t.segments)
    assert max(widths) <= longest_segment + 2 * 8  # live context plus at most one turn of padding per row


def test_with_a_shared_prefix_a_restarted_row_attends_to_its_part_of_it_and_holds_no_copy():
    from r1trade.agent.attention import SharedPrefix
    from r1trade.agent.rollout import _Prefix

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


def test_a_shared_prefix_gives_the_same_trajectories_as_a_copy_per_row_and_a_smaller_cache(tiny_agent):
    model, tokenizer = tiny_agent

    def rollout(shared: bool):
        engine = RolloutEngine(model, tokenizer, SamplingConfig(max_new_tokens=8, greedy=True))
        assert engine.shared_prefix  # the tiny model uses the rollout attention
        engine.shared_prefix = shared
        widths, prefill = [], engine._prefill
        engine._prefill = lambda cache, chunks: (widths.append(cache.attention.shape[1]), prefill(cache, chunks))[1]
        envs = [ScriptedEnv(turns=5, reset_every=2), ScriptedEnv(turns=4)]
        return engine.run(envs, seeds=[0, 1]), widths

    (shared, shared_widths), (copied, copied_widths) = rollout(True), rollout(False)
    for a, b in zip(shared, copied):
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        for x, y in zip(a.segments, b.segments):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    prefix = len(ChatTokens(tokenizer).context([{"role": "system", "content": "You trade."}]))
    assert max(shared_widths) < max(copied_widths) - prefix // 2  # the rows' caches do not hold the system prompt
