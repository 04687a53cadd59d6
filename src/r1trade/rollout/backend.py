"""The contract between the agent loop and a generation backend.

Each turn the loop hands every active conversation's whole context as token ids (`Prompt`), and gets back the
tokens of its next turn, each with a log-prob and a mask bit (`Generation`: 1 sampled by the policy, 0 added by
the backend). Nothing else crosses: the loop renders chats and steps environments, a backend knows token ids only.
`r1trade.rollout.transformers_backend` fulfils it on a transformers model; another backend (vLLM, say) would send
the contexts as prompts and return the sampled tokens' log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Prompt:
    """One conversation's context before its next turn."""

    key: int
    """Which conversation: the same key on each of its turns."""
    token_ids: Sequence[int]
    """The whole context, ending with the generation prompt. A conversation that is not `fresh` continues the
    context of its previous turn: that context, the tokens generated for it, then new tokens."""
    fresh: bool
    """True on a conversation's first turn and when its context starts over (nothing before it is kept)."""


@dataclass(frozen=True)
class Generation:
    """One generated turn: token ids, each with a log-prob and a mask bit."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """log π(token | context) under the sampling distribution, for mask-1 tokens; 0 elsewhere."""
    mask: tuple[int, ...]
    """1 for a token the policy sampled, 0 for one the backend added."""
    stopped: bool
    """True when the turn ended by itself (an end-of-turn token or the stop text), False at the token limit."""


class GenerationBackend(Protocol):
    """Generates turns for a batch of conversations whose contexts grow turn by turn."""

    def session(self) -> AbstractContextManager[None]:
        """Around one batch of conversations: `generate` is called inside, once per turn."""

    def generate(self, prompts: Sequence[Prompt], generator: torch.Generator | None) -> list[Generation]:
        """The next turn of each conversation in `prompts`, in order; a conversation left out is over."""


@dataclass
class SamplingConfig:
    """How each turn is sampled: `sampling_from_config` reads it from the `rollout` section."""

    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    compact_below: float = 0.5
    """Decode only the rows still in their turn once they are at most this share of the rows (0: never)."""
    cuda_graphs: bool = True
    """On a CUDA device, replay each decoding step as a captured graph (`r1trade.rollout.static_step`)."""


def sampling_from_config(rollout_config: Any, *, greedy: bool = False) -> SamplingConfig:
    """SamplingConfig from a RolloutConfig section."""
    return SamplingConfig(
        max_new_tokens=rollout_config.max_new_tokens,
        temperature=rollout_config.temperature,
        top_p=rollout_config.top_p,
        greedy=greedy,
        compact_below=rollout_config.compact_below,
        cuda_graphs=rollout_config.cuda_graphs,
    )


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id rows are padded with: the tokenizer's pad token, else 0."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
