"""The agent loop on the tiny model: masks select exactly the model's words, rewards sit where they belong, and a
generation backend needs nothing but the contract (token ids, a log-prob and a mask bit per token)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from agent_fixtures import ScriptedEnv

from r1trade.models.chat import ChatTokens
from r1trade.rollout.backend import Generation, Prompt, SamplingConfig
from r1trade.rollout.build import transformers_engine
from r1trade.rollout.loop import Trajectory


def decode_masked(tokenizer, trajectory: Trajectory, bit: int) -> str:
    return "".join(
        tokenizer.decode([t for t, m in zip(seg.token_ids, seg.action_mask) if m == bit], skip_special_tokens=False)
        for seg in trajectory.segments
    )


def run(agent, envs, *, greedy=False, max_new_tokens=12, seed=0):
    model, tokenizer = agent
    engine = transformers_engine(model, tokenizer, SamplingConfig(max_new_tokens=max_new_tokens, greedy=greedy))
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
    engine = transformers_engine(model, tokenizer, SamplingConfig(max_new_tokens=12, greedy=True))
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

    from r1trade.rollout.viewer import MASKED_STYLE, SAMPLED_STYLE, render_tokens, render_trajectory

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



class ScriptedBackend:
    """A generation backend that answers every turn with the same tokens: `forced` of them marked as not sampled."""

    def __init__(self, token_ids: list[int], forced: int) -> None:
        self.token_ids, self.forced = token_ids, forced
        self.prompts: list[list[Prompt]] = []
        self.sessions = 0

    def session(self):
        self.sessions += 1
        return nullcontext()

    def generate(self, prompts, generator):
        self.prompts.append(list(prompts))
        sampled = len(self.token_ids) - self.forced
        mask = (1,) * sampled + (0,) * self.forced
        logprobs = (-0.5,) * sampled + (0.0,) * self.forced
        return [Generation(tuple(self.token_ids), logprobs, mask, stopped=True) for _ in prompts]


def test_any_backend_that_keeps_the_contract_drives_the_loop(tiny_agent):
    model, tokenizer = tiny_agent
    engine = transformers_engine(model, tokenizer, SamplingConfig())
    turn = tokenizer("<tool_call>hold</tool_call>", add_special_tokens=False)["input_ids"]
    engine.backend = backend = ScriptedBackend(turn, forced=2)
    envs = [ScriptedEnv(turns=2), ScriptedEnv(turns=3, reset_every=2)]
    trajectories = engine.run(envs, seeds=[0, 1])
    assert backend.sessions == 1
    assert [[p.key for p in prompts] for prompts in backend.prompts] == [[0, 1], [0, 1], [1]]
    assert [[p.fresh for p in prompts] for prompts in backend.prompts] == [[True, True], [False, False], [True]]
    for prompts in backend.prompts:  # each prompt is the whole context so far: the start of one of its segments
        for prompt in prompts:
            segments = trajectories[prompt.key].segments
            assert any(s.token_ids[: len(prompt.token_ids)] == list(prompt.token_ids) for s in segments)
    for trajectory in trajectories:
        for t in trajectory.turns:
            segment = trajectory.segments[t.segment]
            assert segment.token_ids[t.start : t.end] == turn
            assert segment.action_mask[t.start : t.end] == [1] * (len(turn) - 2) + [0, 0]  # the backend's bits
            assert segment.logprobs[t.start : t.end] == [-0.5] * (len(turn) - 2) + [0.0, 0.0]
            assert not t.truncated
