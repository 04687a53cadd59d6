"""Batched multi-turn rollouts with token-level action masks and KV-cache reuse across turns.

Every trajectory is built from token ids, never by decoding and re-tokenizing: the chat context and each
observation are tokenized once (mask 0), sampled tokens are appended as sampled (mask 1), and any token the engine
adds itself (a closing end-of-turn after `</tool_call>` or a truncated turn) is mask 0.

All active environments are decoded as one batch that shares one KV cache. Rows of the cache are never
recomputed: a new observation is prefilled on top of the cache, rows are left-padded per chunk (the padding is
masked out), positions are tracked per row, and a finished environment's row is dropped from the cache. When the
environment starts a fresh context (bounded history, `info["context_reset"]`), a new token *segment* begins with
positions counted from zero: the row's old columns are dropped and it starts again from the prefix every context
shares (the system prompt, prefilled once per run), so only the rest of the fresh context is prefilled. Columns no
row attends to any more (old contexts, padding, steps of rows that had stopped) are squeezed out between turns.

With the rollout attention (`r1trade.agent.attention`) the prefix's keys and values are held once for the batch
(`SharedPrefix`) and each row's cache holds only its own columns; with any other attention the prefix is copied
into every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache, DynamicLayer

from r1trade.agent.attention import ROLLOUT_ATTENTIONS, SharedPrefix
from r1trade.agent.onednn import packed_weights

STOP_TEXT = "</tool_call>"


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


# --------------------------------------------------------------------------- chat formatting from ids


class ChatTokens:
    """Token ids for chat pieces, rendered with the tokenizer's own chat template.

    Only text the environment wrote is tokenized (each piece once); the model's own turns are kept as ids.
    Roles the template does not know (`tool`) are sent as `user` turns.
    """

    _PROBE = "\u2063r1trade-probe\u2063"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._stub = [{"role": "system", "content": "x"}]
        head = self._render(self._stub, generation_prompt=False)
        with_turn = self._render([*self._stub, {"role": "assistant", "content": self._PROBE}], False)
        self.turn_closing = self._ids(with_turn[with_turn.index(self._PROBE) + len(self._PROBE) :])
        self._head_len = len(head)
        eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
        self.stop_ids = {i for i in (eos, self.turn_closing[0] if self.turn_closing else None) if i is not None}

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [self._role(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt
        )

    @staticmethod
    def _role(message: dict) -> dict:
        return message if message["role"] in ("system", "user", "assistant") else {**message, "role": "user"}

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def context(self, messages: list[dict]) -> list[int]:
        """A whole fresh context, ending with the assistant generation prompt."""
        return self._ids(self._render(messages, generation_prompt=True))

    def continuation(self, messages: list[dict]) -> list[int]:
        """Messages appended after a closed assistant turn, ending with the generation prompt."""
        full = self._render([*self._stub, *messages], generation_prompt=True)
        return self._ids(full[self._head_len :])

    def closing(self, sampled: Sequence[int]) -> list[int]:
        """What the template puts after an assistant turn, minus what the model already sampled of it."""
        closing = self.turn_closing
        overlap = next(
            (k for k in range(min(len(closing), len(sampled)), 0, -1) if list(sampled[-k:]) == closing[:k]), 0
        )
        return closing[overlap:]


# --------------------------------------------------------------------------- the engine


@dataclass
class SamplingConfig:
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


class _GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values live in a buffer with spare room along the sequence axis.

    `DynamicLayer` appends by `torch.cat`, copying the whole cache at every decoding step (the copy grows with the
    context); here a step writes one column in place and the buffer doubles only when full. `keys`/`values` are
    views of the filled part, so attention sees exactly what `DynamicLayer` would give it.
    """

    MIN_CAPACITY = 256

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, end)
        self._key_buffer[..., self._length : end, :] = key_states
        self._value_buffer[..., self._length : end, :] = value_states
        self._set_length(end)
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        old = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
        capacity = max(needed, 2 * old, self.MIN_CAPACITY)
        buffers = []
        for states, buffer in ((key_states, self._key_buffer), (value_states, self._value_buffer)):
            batch, heads, _, dim = states.shape
            grown = states.new_zeros(batch, heads, capacity, dim)
            if buffer is not None:
                grown[..., : self._length, :] = buffer[..., : self._length, :]
            buffers.append(grown)
        self._key_buffer, self._value_buffer = buffers

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def replace(self, keys: torch.Tensor, values: torch.Tensor, *, capacity: int) -> None:
        """Make `keys`/`values` (B, H, L, D) the whole content, in a buffer with room for `capacity` columns."""
        self._key_buffer = self._value_buffer = None
        self._grow(keys, values, max(capacity, keys.shape[-2]))
        self._key_buffer[..., : keys.shape[-2], :] = keys
        self._value_buffer[..., : values.shape[-2], :] = values
        self._set_length(keys.shape[-2])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the negative number of tokens to remove")
        if tokens_to_remove and self.is_initialized:
            self._set_length(max(0, self._length + tokens_to_remove))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._set_length(self._length)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._key_buffer = self._key_buffer[indices, ...]
            self._value_buffer = self._value_buffer[indices, ...]
            self._set_length(self._length)


class _GrowingCache(Cache):
    """A per-layer KV cache made of `_GrowingLayer`s (created lazily, one per decoder layer)."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=_GrowingLayer)


@dataclass
class _Prefix:
    """Keys and values of the token prefix every context of a run starts with (the system prompt), for one row."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (1, H_kv, P, D)

    def shared_length(self, ids: Sequence[int]) -> int:
        """How many leading tokens of `ids` the prefix covers, leaving at least the last one to prefill."""
        limit = min(len(self.ids), len(ids) - 1)
        return next((i for i in range(limit) if self.ids[i] != ids[i]), max(limit, 0))


class _BatchCache:
    """A KV cache shared by the active rows, with a 0/1 attention column per cached token and per-row positions.

    `shared`, when set, holds prefix columns that come before every row's own columns, stored once.
    """

    COMPACT_WHEN_DEAD = 0.25
    """Squeeze the cache when this fraction of its columns is attended by no row (reading them costs every step)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.kv = _GrowingCache()
        self.attention = torch.zeros(rows, 0, dtype=torch.long, device=device)  # (R, L)
        self.next_position = torch.zeros(rows, dtype=torch.long, device=device)  # (R,)
        self.shared: SharedPrefix | None = None

    def share(self, prefix: _Prefix) -> None:
        """Put `prefix` before every row, held once (the rows' own caches must still be empty)."""
        rows, length = self.attention.shape[0], len(prefix.ids)
        attends = torch.ones(rows, length, dtype=torch.bool, device=self.attention.device)
        self.shared = SharedPrefix(prefix.layers, attends)
        self.next_position = torch.full_like(self.next_position, length)

    def compact(self, restarts: dict[int, int], prefix: _Prefix | None) -> None:
        """Keep only each row's live columns, right-aligned; a row in `restarts` drops all of its own and starts
        a new segment from the first `restarts[row]` columns of `prefix` (0: from nothing, at position 0): in the
        shared prefix if there is one, else copied into the row.

        Positions are per row and the cached keys already carry their rotary positions, so moving columns changes
        no result. Skipped when no row restarts and few columns are dead.
        """
        live = self.attention.bool()  # (R, L)
        for row, shared in restarts.items():
            live[row] = False
            self.next_position[row] = shared
            if self.shared is not None:
                columns = torch.arange(self.shared.attention.shape[1], device=self.shared.attention.device)
                self.shared.attention[row] = columns < shared
        copied = {} if self.shared is not None else {row: shared for row, shared in restarts.items() if shared}
        counts = live.sum(dim=1)  # (R,)
        for row, shared in copied.items():
            counts[row] = shared
        rows, length = live.shape
        width = int(counts.max()) if rows else 0
        if not restarts and length and (length - width) < self.COMPACT_WHEN_DEAD * length:
            return
        # source column of each kept slot: row r's live columns land in its last counts[r] slots
        slot = torch.arange(width, device=live.device)  # (W,)
        first = width - counts  # (R,) first filled slot per row
        rank = live.long().cumsum(dim=1) - 1  # (R, L) order of each live column within its row
        source = torch.zeros(rows, width, dtype=torch.long, device=live.device)  # (R, W)
        r_index, c_index = live.nonzero(as_tuple=True)
        source[r_index, first[r_index] + rank[r_index, c_index]] = c_index
        self.attention = (slot[None, :] >= first[:, None]).long()  # (R, W)
        for index, layer in enumerate(self.kv.layers):
            batch, heads, _, dim = layer.keys.shape
            gather = source[:, None, :, None].expand(batch, heads, width, dim)
            keys, values = layer.keys.gather(2, gather), layer.values.gather(2, gather)  # (R, H_kv, W, D)
            for row, shared in copied.items():
                prefix_keys, prefix_values = prefix.layers[index]
                keys[row, :, width - shared :] = prefix_keys[0, :, :shared]
                values[row, :, width - shared :] = prefix_values[0, :, :shared]
            layer.replace(keys, values, capacity=2 * width)

    def keep_rows(self, rows: list[int]) -> None:
        """Keep these rows (ascending), in this order; nothing is copied while every row is still active."""
        if len(rows) == self.attention.shape[0]:
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.attention.device)
        if self.kv.get_seq_length() > 0:
            self.kv.batch_select_indices(index)
        self.attention = self.attention[index]
        self.next_position = self.next_position[index]
        if self.shared is not None:
            self.shared = SharedPrefix(self.shared.layers, self.shared.attention[index])


class RolloutEngine:
    """Samples multi-turn episodes from a causal LM in a set of text environments, all rows as one batch."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingConfig,
        *,
        reuse_cache: bool = True,
    ) -> None:
        """`reuse_cache=False` re-encodes each row's whole context every turn (the slow baseline, for benchmarks)."""
        self.model = model
        self.reuse_cache = reuse_cache
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.chat = ChatTokens(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.device = next(model.parameters()).device
        self.shared_prefix = reuse_cache and model.config._attn_implementation in ROLLOUT_ATTENTIONS

    @torch.no_grad()
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
        was_training = self.model.training
        self.model.eval()
        try:
            with packed_weights(self.model):
                self._play(envs, seeds, trajectories, generator)
        finally:
            self.model.train(was_training)
        return trajectories

    def _play(
        self,
        envs: Sequence[TextEnv],
        seeds: Sequence[int | None],
        trajectories: list[Trajectory],
        generator: torch.Generator | None,
    ) -> None:
        """Reset every environment and take turns until all episodes are over, recording into `trajectories`."""
        chunks = []
        for env, seed, trajectory in zip(envs, seeds, trajectories, strict=True):
            messages, _ = env.reset(seed=seed)
            chunks.append(self.chat.context(messages))
            trajectory.segments[0].extend(chunks[-1], sampled=False)
        active = list(range(len(envs)))  # trajectory index of each cache row
        cache, prefix, chunks = self._shared_prefix_cache(chunks)
        while active:
            logits = self._prefill(cache, chunks)
            sampled, logprobs, stopped = self._decode(cache, logits, generator)
            chunks, keep, restarts = [], [], {}
            for row, index in enumerate(active):
                chunk = self._finish_turn(
                    trajectories[index], envs[index], sampled[row], logprobs[row], stopped[row]
                )
                if chunk is None:
                    continue
                ids = chunk.ids
                if chunk.restart:  # a fresh context: reuse the cached prefix it shares with every context
                    restarts[len(keep)] = shared = prefix.shared_length(ids) if prefix else 0
                    ids = ids[shared:]
                keep.append(row)
                chunks.append(ids)
            active = [active[row] for row in keep]
            if active and self.reuse_cache:
                cache.keep_rows(keep)
                cache.compact(restarts, prefix)
            elif active:
                cache = _BatchCache(len(active), self.device)
                chunks = [trajectories[index].segments[-1].token_ids for index in active]

    # ------------------------------------------------------------------ model calls

    def _shared_prefix_cache(
        self, chunks: list[list[int]]
    ) -> tuple[_BatchCache, _Prefix | None, list[list[int]]]:
        """Prefill the prefix all first contexts share (the system prompt) once and copy its cache to every row.

        Returns the cache, the prefix (kept for fresh contexts later in the run) and what is left of each chunk
        (at least its last token, which yields the row's logits). With the rollout attention the rows share the
        prefix's cache instead of each holding a copy.
        """
        rows = len(chunks)
        cache = _BatchCache(rows, self.device)
        shortest = min(len(c) for c in chunks)
        shared = next((i for i in range(shortest - 1) if len({c[i] for c in chunks}) > 1), shortest - 1)
        if not self.reuse_cache or shared == 0:
            return cache, None, chunks
        one = _BatchCache(1, self.device)
        self._prefill(one, [chunks[0][:shared]])
        prefix = _Prefix(chunks[0][:shared], [(layer.keys.clone(), layer.values.clone()) for layer in one.kv.layers])
        if self.shared_prefix:
            cache.share(prefix)
            return cache, prefix, [c[shared:] for c in chunks]
        one.kv.batch_repeat_interleave(rows)
        cache.kv, cache.attention = one.kv, one.attention.repeat(rows, 1)
        cache.next_position = one.next_position.repeat(rows)
        return cache, prefix, [c[shared:] for c in chunks]

    def _forward(self, cache: _BatchCache, ids: torch.Tensor, new_attention: torch.Tensor) -> torch.Tensor:
        """Run new columns `ids` (R, M) through the model on top of the cache; return last-column logits (R, V)."""
        positions = cache.next_position[:, None] + new_attention.cumsum(dim=1) - 1  # (R, M)
        positions = positions.clamp(min=0)
        cache.attention = torch.cat([cache.attention, new_attention], dim=1)
        shared = {"shared_prefix": cache.shared} if cache.shared is not None else {}
        out = self.model(
            input_ids=ids,
            attention_mask=cache.attention,
            position_ids=positions,
            past_key_values=cache.kv,
            use_cache=True,
            logits_to_keep=1,  # only the last column's logits are used; skip the vocabulary projection elsewhere
            **shared,
        )
        cache.next_position = cache.next_position + new_attention.sum(dim=1)
        return out.logits[:, -1, :].float()

    def _prefill(self, cache: _BatchCache, chunks: list[list[int]]) -> torch.Tensor:
        """Append each row's chunk (left-padded to a common width) and return next-token logits per row."""
        width = max(len(c) for c in chunks)
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long, device=self.device)
        attention = torch.zeros((len(chunks), width), dtype=torch.long, device=self.device)
        for row, chunk in enumerate(chunks):
            ids[row, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
            attention[row, width - len(chunk) :] = 1
        return self._forward(cache, ids, attention)

    def _decode(
        self, cache: _BatchCache, logits: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample one turn for every row; a row stops at an end-of-turn token or at `</tool_call>`.

        The last sampled token of each row is not fed to the model here: it opens the row's next prefill chunk.
        """
        rows = logits.shape[0]
        sampled: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        stopped = [False] * rows
        for step in range(self.sampling.max_new_tokens):
            tokens, token_logprobs = self._sample(logits, generator)
            for row in range(rows):
                if stopped[row]:
                    continue
                sampled[row].append(int(tokens[row]))
                logprobs[row].append(float(token_logprobs[row]))
                stopped[row] = self._is_stop(sampled[row])
            generating = [row for row in range(rows) if not stopped[row]]
            if not generating or step == self.sampling.max_new_tokens - 1:
                break
            feed = torch.full((rows, 1), self.pad_id, dtype=torch.long, device=self.device)
            attention = torch.zeros((rows, 1), dtype=torch.long, device=self.device)
            for row in generating:
                feed[row, 0] = sampled[row][-1]
                attention[row, 0] = 1
            logits = self._forward(cache, feed, attention)
        return sampled, logprobs, stopped

    def _sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens (R,) and their log-probs under softmax(logits / temperature) (R,)."""
        temperature = self.sampling.temperature if not self.sampling.greedy and self.sampling.temperature > 0 else 1.0
        logp = torch.log_softmax(logits / temperature, dim=-1)  # (R, V)
        if self.sampling.greedy or self.sampling.temperature == 0:
            tokens = logp.argmax(dim=-1)
        else:
            probs = logp.exp()
            if self.sampling.top_p < 1.0:
                probs = _top_p_filter(probs, self.sampling.top_p)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)

    def _is_stop(self, sampled: list[int]) -> bool:
        if sampled[-1] in self.chat.stop_ids:
            return True
        tail = self.tokenizer.decode(sampled[-8:], skip_special_tokens=False)
        return STOP_TEXT in tail

    # ------------------------------------------------------------------ bookkeeping

    @dataclass
    class _Chunk:
        ids: list[int]
        restart: bool

    def _finish_turn(
        self, trajectory: Trajectory, env: TextEnv, sampled: list[int], logprobs: list[float], stopped: bool
    ) -> _Chunk | None:
        """Record a turn, step the environment, and return the next chunk to prefill (None when done)."""
        segment = trajectory.segments[-1]
        start = len(segment)
        segment.extend(sampled, sampled=True, logprobs=logprobs)
        text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        messages, reward, terminated, truncated, info = env.step(text)
        segment.rewards[-1] += reward
        trajectory.turns.append(
            Turn(len(trajectory.segments) - 1, start, len(segment), text, reward, not stopped, info)
        )
        if terminated or truncated:
            trajectory.terminated, trajectory.truncated = terminated, truncated
            return None
        closing = self.chat.closing(sampled)
        if info.get("context_reset"):
            # The last sampled token and the closing still belong to the old segment; nothing more is cached
            # there, so they are recorded (closing as mask 0) and the new context starts a new segment.
            segment.extend(closing, sampled=False)
            fresh = self.chat.context(messages)
            trajectory.segments.append(Segment())
            trajectory.segments[-1].extend(fresh, sampled=False)
            return self._Chunk(fresh, restart=True)
        following = self.chat.continuation(messages)
        segment.extend(closing + following, sampled=False)
        return self._Chunk([sampled[-1], *closing, *following], restart=False)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row outside the smallest set of tokens whose mass reaches `top_p`."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    drop = cumulative - sorted_probs > top_p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def sampling_from_config(rollout_config: Any, *, greedy: bool = False) -> SamplingConfig:
    """SamplingConfig from a RolloutConfig section."""
    return SamplingConfig(
        max_new_tokens=rollout_config.max_new_tokens,
        temperature=rollout_config.temperature,
        top_p=rollout_config.top_p,
        greedy=greedy,
    )
