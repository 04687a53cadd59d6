"""The agent loop: multi-turn episodes in text environments, recorded as token ids with an action mask per token.

Every trajectory is built from token ids, never by decoding and re-tokenizing: the chat context and each
observation are tokenized once (mask 0), a generated turn is appended as the generation backend returns it (its
tokens with their mask bits: 1 sampled by the policy, with their log-probs), and any token the loop adds itself
(a closing end-of-turn after `</tool_call>` or a truncated turn) is mask 0. When the environment starts a fresh
context (bounded history, `info["context_reset"]`), a new token *segment* begins with positions counted from zero.
Each turn the loop hands every active episode's context to the backend (`r1trade.rollout.backend`) and steps the
environments with the text of what came back; it knows nothing of models, caches or losses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from r1trade.models.chat import ChatTokens
from r1trade.rollout.backend import Generation, GenerationBackend, Prompt, pad_token_id

STOP_TEXT = "</tool_call>"
"""A turn ends once its text holds this (one tool call per turn), or at an end-of-turn token."""


class TextEnv(Protocol):
    """What the engine needs from an environment (TradingEnv satisfies it)."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]: ...

    def step(self, text: str) -> tuple[list[dict], float, bool, bool, dict]: ...


@dataclass
class Segment:
    """One contiguous token sequence the model saw, with a mask bit per token (1 = sampled by the policy)."""

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # log π_old(token) for mask-1 tokens, 0 elsewhere
    rewards: list[float] = field(default_factory=list)  # each turn's reward on its last sampled token

    def extend(self, ids: Sequence[int], *, sampled: bool, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids += ids
        self.action_mask += [int(sampled)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.rewards += [0.0] * len(ids)

    def add_generated(self, generation: Generation) -> None:
        """Append a generated turn: its tokens with the backend's mask bits and log-probs."""
        self.token_ids += generation.token_ids
        self.action_mask += generation.mask
        self.logprobs += generation.logprobs
        self.rewards += [0.0] * len(generation.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class Turn:
    """One model turn: where its sampled tokens sit, what it said, and what it earned."""

    segment: int
    start: int  # first sampled token, index into the segment
    end: int  # one past the last sampled token
    text: str
    reward: float
    truncated: bool  # hit max_new_tokens without stopping
    info: dict[str, Any]


@dataclass
class Trajectory:
    """A whole episode: its token segments, its turns and the environment's final info."""

    seed: int | None
    group: int  # start-state id: trajectories with the same group started from the same state (GRPO)
    segments: list[Segment] = field(default_factory=lambda: [Segment()])
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False

    @property
    def total_reward(self) -> float:
        return sum(turn.reward for turn in self.turns)

    @property
    def num_action_tokens(self) -> int:
        return sum(sum(seg.action_mask) for seg in self.segments)

    @property
    def final_info(self) -> dict[str, Any]:
        return self.turns[-1].info if self.turns else {}


# --------------------------------------------------------------------------- the loop


class RolloutEngine:
    """Plays multi-turn episodes in a set of text environments, all rows as one batch, through the generation
    backend it is handed (`r1trade.rollout.build.transformers_engine` pairs it with a transformers model)."""

    def __init__(self, backend: GenerationBackend, tokenizer: PreTrainedTokenizerBase) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.chat = ChatTokens(tokenizer)
        self.pad_id = pad_token_id(tokenizer)

    def run(
        self,
        envs: Sequence[TextEnv],
        seeds: Sequence[int | None],
        *,
        groups: Sequence[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> list[Trajectory]:
        """Play one episode in each environment (reset with its seed) and return the trajectories in order."""
        groups = list(groups) if groups is not None else list(range(len(envs)))
        trajectories = [Trajectory(seed=s, group=g) for s, g in zip(seeds, groups, strict=True)]
        with self.backend.session():
            self._play(envs, seeds, trajectories, generator)
        return trajectories

    def _play(
        self,
        envs: Sequence[TextEnv],
        seeds: Sequence[int | None],
        trajectories: list[Trajectory],
        generator: torch.Generator | None,
    ) -> None:
        """Reset every environment and take turns until all episodes are over, recording into `trajectories`."""
        prompts = []
        for index, (env, seed, trajectory) in enumerate(zip(envs, seeds, trajectories, strict=True)):
            messages, _ = env.reset(seed=seed)
            trajectory.segments[0].extend(self.chat.context(messages), sampled=False)
            prompts.append(Prompt(index, tuple(trajectory.segments[0].token_ids), fresh=True))
        while prompts:
            generations = self.backend.generate(prompts, generator)
            following = []
            for prompt, generation in zip(prompts, generations, strict=True):
                trajectory = trajectories[prompt.key]
                fresh = self._finish_turn(trajectory, envs[prompt.key], generation)
                if fresh is not None:
                    following.append(Prompt(prompt.key, tuple(trajectory.segments[-1].token_ids), fresh))
            prompts = following

    def _finish_turn(self, trajectory: Trajectory, env: TextEnv, generation: Generation) -> bool | None:
        """Record a turn, step the environment and extend the context: None when the episode is over, else
        whether the next context starts fresh (a new segment)."""
        segment = trajectory.segments[-1]
        start = len(segment)
        segment.add_generated(generation)
        sampled = list(generation.token_ids)
        text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        messages, reward, terminated, truncated, info = env.step(text)
        segment.rewards[-1] += reward
        trajectory.turns.append(
            Turn(len(trajectory.segments) - 1, start, len(segment), text, reward, not generation.stopped, info)
        )
        if terminated or truncated:
            trajectory.terminated, trajectory.truncated = terminated, truncated
            return None
        closing = self.chat.closing(sampled)
        if info.get("context_reset"):
            # The turn and its closing still belong to the old segment (the closing as mask 0); the fresh context
            # starts a new segment.
            segment.extend(closing, sampled=False)
            trajectory.segments.append(Segment())
            trajectory.segments[-1].extend(self.chat.context(messages), sampled=False)
            return True
        following = self.chat.continuation(messages)
        segment.extend(closing + following, sampled=False)
        return False
