"""`TransformersBackend`: a `GenerationBackend` (`r1trade.rollout.backend`) on a transformers causal LM.

`TransformersBackend` decodes all conversations as one batch that shares one KV cache. Rows of the cache are never
recomputed: a turn's new tokens (the last sampled token, the turn's closing and the next observation) are
prefilled on top of the cache, rows are left-padded per chunk (the padding is masked out), positions are tracked
per row, and a finished conversation's row is dropped from the cache. A fresh context (the environment's bounded
history) restarts its row with positions counted from zero: the row's old columns are dropped and it starts again
from the prefix every context shares (the system prompt, prefilled once per batch), so only the rest of the fresh
context is prefilled. Columns no row attends to any more (old contexts, padding, steps of rows that had stopped)
are squeezed out between turns. On CUDA a turn's decoding steps run in fixed-shape buffers instead, replayed as
CUDA graphs (`r1trade.rollout.static_step`), its columns copied in at the turn's start and back at its end.

Sharing a prefix: a rollout's rows start with the same tokens, so they are run once and their keys and values
copied into every row; with the CPU fast paths' rollout attention (`r1trade.cpu.attention`) they are held once for
the batch (`SharedPrefix`) and each row's cache holds only its own columns. Scoring shares the rows' common prefix
the same way (`common_prefix_length`, `hidden_after_shared_prefix`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache, DynamicLayer

from r1trade.models.prefix import cache_keyword
from r1trade.rollout.backend import Generation, Prompt, SamplingConfig, pad_token_id
from r1trade.rollout.static_step import StepWorkspaces
from r1trade.rollout.stops import StopMatcher

if TYPE_CHECKING:
    from r1trade.cpu.attention import SharedPrefix


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row outside the smallest set of tokens whose mass reaches `top_p`."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    drop = cumulative - sorted_probs > top_p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


# --------------------------------------------------------------------------- the KV cache


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
        from r1trade.cpu.attention import SharedPrefix  # (only a model with the rollout attention reads it)

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

    def rows_copy(self, rows: torch.Tensor, *, room: int) -> _BatchCache:
        """A cache of these rows only (copies of their columns), with room for `room` more columns: the rows still
        decoding, taken apart so that a step stops paying for the rows that have finished their turn."""
        part = _BatchCache(len(rows), self.attention.device)
        for layer in self.kv.layers:
            keys, values = layer.keys[rows], layer.values[rows]  # (r, H_kv, L, D)
            copy = _GrowingLayer()
            copy.lazy_initialization(keys, values)
            copy.replace(keys, values, capacity=keys.shape[-2] + room)
            part.kv.layers.append(copy)
        part.attention, part.next_position = self.attention[rows], self.next_position[rows]
        if self.shared is not None:
            part.shared = dataclasses.replace(self.shared, attention=self.shared.attention[rows])
        return part

    def take_back(self, part: _BatchCache, rows: torch.Tensor) -> None:
        """Append the columns `part` (a `rows_copy` of `rows`) gained since it was taken; the other rows get the
        same number of columns, unattended."""
        start, rows_here = self.attention.shape[1], self.attention.shape[0]
        gained = part.attention.shape[1] - start
        if gained <= 0:
            return
        for layer, piece in zip(self.kv.layers, part.kv.layers, strict=True):
            batch, heads, _, dim = layer.keys.shape
            keys = layer.keys.new_zeros(batch, heads, gained, dim)  # (R, H_kv, G, D)
            values = layer.values.new_zeros(batch, heads, gained, dim)
            keys[rows], values[rows] = piece.keys[..., start:, :], piece.values[..., start:, :]
            layer.update(keys, values)
        attention = self.attention.new_zeros(rows_here, gained)  # (R, G)
        attention[rows] = part.attention[:, start:]
        self.attention = torch.cat([self.attention, attention], dim=1)
        self.next_position = self.next_position.clone()
        self.next_position[rows] = part.next_position

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
            self.shared = dataclasses.replace(self.shared, attention=self.shared.attention[index])


class _StepRows:
    """The rows a decoding step runs: all rows of the turn's cache, or a copy of those still decoding.

    Each holds its attention mask in a buffer with room for the turn's columns, filled one column a step.
    """

    def __init__(self, cache: _BatchCache, room: int) -> None:
        self.cache = self.work = cache
        self.members: torch.Tensor | None = None  # rows of `cache` that `work` holds; None: all
        self._begin(room)

    @property
    def count(self) -> int:
        return self.work.attention.shape[0]

    def _begin(self, room: int) -> None:
        self.width = self.work.attention.shape[1]
        self.fed = 0
        self.attention = self.work.attention.new_zeros(self.count, self.width + room)  # (r, L + room)
        self.attention[:, : self.width] = self.work.attention

    def _close(self) -> None:
        self.work.attention = self.attention[:, : self.width + self.fed]
        if self.members is not None:
            self.cache.take_back(self.work, self.members)

    def set_apart(self, members: torch.Tensor, *, room: int) -> None:
        """Run only `members` (rows of the turn's cache) from the next step on."""
        self._close()
        self.members, self.work = members, self.cache.rows_copy(members, room=room)
        self._begin(room)

    def forward(
        self,
        run: Callable[[_BatchCache, torch.Tensor, torch.Tensor], torch.Tensor],
        logits: torch.Tensor,  # (R, V)
        token: torch.Tensor,  # (R,)
        stopped: torch.Tensor,  # (R,)
        pad_id: int,
    ) -> torch.Tensor:
        """Feed each row's token (padding, unattended, for a stopped row) and return (R, V) next-token logits;
        rows not run keep their last logits (their draws are not used)."""
        if self.members is not None:
            token, stopped = token[self.members], stopped[self.members]
        out = self._step(run, token, stopped, pad_id)
        self.fed += 1
        if self.members is None:
            return out
        logits = logits.clone()
        logits[self.members] = out
        return logits

    def _step(self, run, token: torch.Tensor, stopped: torch.Tensor, pad_id: int) -> torch.Tensor:
        self.attention[:, self.width + self.fed] = (~stopped).long()
        feed = torch.where(stopped, pad_id, token)[:, None]  # (r, 1)
        return run(self.work, feed, self.attention[:, : self.width + self.fed + 1])

    def finish(self) -> None:
        """Leave the turn's cache holding every row's columns."""
        self._close()


class _FixedStepRows(_StepRows):
    """`_StepRows` whose steps run in a `StepWorkspace` (`r1trade.rollout.static_step`), a graph replay each on
    CUDA: the rows' cache is copied in when they start, and the columns the steps added go back when they stop."""

    def __init__(self, cache: _BatchCache, room: int, workspaces: StepWorkspaces) -> None:
        self.workspaces = workspaces
        super().__init__(cache, room)

    def _begin(self, room: int) -> None:
        self.width, self.fed = self.work.attention.shape[1], 0
        layers = [(layer.keys, layer.values) for layer in self.work.kv.layers]
        self.space = self.workspaces.get(layers, rows=self.count, columns=self.width + room)
        self.space.load(layers, self.work.attention, self.work.next_position)

    def _close(self) -> None:
        layers, attention, self.work.next_position = self.space.added()
        for layer, (keys, values) in zip(self.work.kv.layers, layers, strict=True):
            layer.update(keys, values)
        self.work.attention = torch.cat([self.work.attention, attention], dim=1)
        if self.members is not None:
            self.cache.take_back(self.work, self.members)

    def _step(self, run, token: torch.Tensor, stopped: torch.Tensor, pad_id: int) -> torch.Tensor:
        return self.space.step(token, ~stopped)


# --------------------------------------------------------------------------- the backend


class TransformersBackend:
    """A `GenerationBackend` on a transformers causal LM: all conversations as one batch over one KV cache."""

    DEVICE_READ_EVERY = 8

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingConfig,
        *,
        stop_ids: set[int],
        stop_text: str,
        reuse_cache: bool = True,
        fixed_step: bool | None = None,
    ) -> None:
        """A turn stops at a token in `stop_ids` or once its text contains `stop_text`. `reuse_cache=False`
        re-encodes each row's whole context every turn (the slow baseline, for benchmarks). `fixed_step` runs the
        decoding steps in fixed-shape workspaces (`r1trade.rollout.static_step`), captured as CUDA graphs on a
        GPU; by default it does so on CUDA where `sampling.cuda_graphs` asks for it."""
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.reuse_cache = reuse_cache
        self.pad_id = pad_token_id(tokenizer)
        self.device = next(model.parameters()).device
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=self.device)
        self.cache_keyword = cache_keyword(model)
        self.stop_text = StopMatcher.for_tokenizer(tokenizer, stop_text, self.device,
                                                   vocab_size=model.config.vocab_size)
        self.read_every = 1 if self.device.type == "cpu" else self.DEVICE_READ_EVERY
        self.compact_below = sampling.compact_below
        """Decoding steps between host reads of "have all rows stopped?": free on the CPU, where it is read every
        step (so no step is wasted and the random draws are those of a step-by-step decode); on an accelerator each
        read waits for the queued steps, so it is read every few steps and the steps past the last stop are thrown
        away."""
        self.cpu = sys.modules.get("r1trade.cpu") if self.device.type == "cpu" else None
        """The CPU fast paths, where a model on the CPU was loaded with them (`r1trade.models.loading.cpu_kernels`
        alone imports them): this model's linear layers then pack their weights for the rollout, and its attention
        may hold a shared prefix once."""
        self.shared_prefix = reuse_cache and self.cpu is not None and self.cpu.shares_prefix(model)
        if fixed_step is None:
            fixed_step = self.device.type == "cuda" and sampling.cuda_graphs
        if fixed_step and self.shared_prefix:
            raise ValueError("the fixed-shape decoding step runs the model's own attention, not the CPU fast paths'")
        self.workspaces = StepWorkspaces(model, pad_id=self.pad_id, cache_keyword=self.cache_keyword,
                                         capture=self.device.type == "cuda") if fixed_step else None
        self._cache: _BatchCache | None = None
        self._prefix: _Prefix | None = None
        self._keys: list[int] = []  # the conversation of each cache row
        self._fed: dict[int, int] = {}  # per conversation: context tokens in the cache (all but the last generated)

    @contextmanager
    def session(self) -> Iterator[None]:
        """Gradients off and the model in eval mode (restored after), with the CPU fast paths' packed weights."""
        was_training = self.model.training
        with torch.no_grad():
            self.model.eval()
            try:
                with self.cpu.packed_weights(self.model) if self.cpu is not None else nullcontext():
                    if self.workspaces is not None:
                        self.workspaces.check_weights()
                    self._cache, self._prefix, self._keys, self._fed = None, None, [], {}
                    yield
            finally:
                self._cache = self._prefix = None
                self.model.train(was_training)

    def generate(self, prompts: Sequence[Prompt], generator: torch.Generator | None) -> list[Generation]:
        """Prefill what each conversation's context adds to the cache, then sample one turn for all of them."""
        chunks = self._chunks(prompts)
        logits = self._prefill(self._cache, chunks)
        sampled, logprobs, stopped = self._decode(self._cache, logits, _on_device(generator, self.device))
        self._keys = [prompt.key for prompt in prompts]
        for prompt, ids in zip(prompts, sampled, strict=True):
            self._fed[prompt.key] = len(prompt.token_ids) + len(ids) - 1  # the last token opens the next chunk
        return [
            Generation(tuple(ids), tuple(lps), (1,) * len(ids), stop)
            for ids, lps, stop in zip(sampled, logprobs, stopped, strict=True)
        ]

    def _chunks(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Each row's tokens to prefill; brings the cache to the prompts' rows (dropped, restarted, compacted)."""
        if self._cache is None:  # the session's first turn
            self._cache, self._prefix, chunks = self._shared_prefix_cache([list(p.token_ids) for p in prompts])
            return chunks
        if not self.reuse_cache:
            self._cache = _BatchCache(len(prompts), self.device)
            return [list(prompt.token_ids) for prompt in prompts]
        rows = {key: row for row, key in enumerate(self._keys)}
        keep, chunks, restarts = [], [], {}
        for prompt in prompts:
            ids = list(prompt.token_ids)
            if prompt.fresh:  # a fresh context: reuse the cached prefix it shares with every context
                restarts[len(keep)] = shared = self._prefix.shared_length(ids) if self._prefix else 0
                ids = ids[shared:]
            else:
                ids = ids[self._fed[prompt.key] :]
            keep.append(rows[prompt.key])
            chunks.append(ids)
        self._cache.keep_rows(keep)
        self._cache.compact(restarts, self._prefix)
        return chunks

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

    def _forward(self, cache: _BatchCache, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Run new columns `ids` (R, M) through the model on top of the cache, `attention` (R, L + M) being the
        cache's mask with the new columns' appended; return the last column's logits (R, V)."""
        new_attention = attention[:, -ids.shape[1] :]  # (R, M)
        positions = cache.next_position[:, None] + new_attention.cumsum(dim=1) - 1  # (R, M)
        positions = positions.clamp(min=0)
        cache.attention = attention
        shared = {"shared_prefix": cache.shared} if cache.shared is not None else {}
        out = self.model(
            input_ids=ids,
            attention_mask=cache.attention,
            position_ids=positions,
            **{self.cache_keyword: cache.kv},
            use_cache=True,
            logits_to_keep=1,  # only the last column's logits are used; skip the vocabulary projection elsewhere
            **shared,
        )
        cache.next_position = cache.next_position + new_attention.sum(dim=1)
        return out.logits[:, -1, :].float()

    def _prefill(self, cache: _BatchCache, chunks: list[list[int]]) -> torch.Tensor:
        """Append each row's chunk (left-padded to a common width) and return next-token logits per row."""
        width = max(len(c) for c in chunks)
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunks), width), dtype=torch.long)
        for row, chunk in enumerate(chunks):
            ids[row, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
            attention[row, width - len(chunk) :] = 1
        attention = torch.cat([cache.attention, attention.to(self.device)], dim=1)  # to a GPU: one copy, not one a row
        return self._forward(cache, ids.to(self.device), attention)

    def _decode(
        self, cache: _BatchCache, logits: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample one turn for every row; a row stops at a token of `stop_ids` or once its text holds the stop text.

        Everything per step stays on the device: the sampled tokens and log-probs go into preallocated (R, N)
        buffers, the stop checks are a table lookup (`StopMatcher`), a stopped row is fed padding with attention 0,
        and the attention mask grows in place. The host reads how many rows are still decoding every
        `read_every` steps, and the turns once at the end. Once those rows are at most `compact_below` of the rows
        a step runs, they are copied apart (`_BatchCache.rows_copy`) and only they are run, until the turn ends
        and their new columns go back (`take_back`). Tokens are still drawn for every row from (R, V) logits, so
        the random draws do not depend on when rows were set apart. The last sampled token of each row is not fed
        to the model here: it opens the row's next prefill chunk.
        """
        rows, limit = logits.shape[0], self.sampling.max_new_tokens
        tokens = torch.full((rows, limit), self.pad_id, dtype=torch.long, device=self.device)  # (R, N)
        logprobs = torch.zeros((rows, limit), dtype=torch.float32, device=self.device)  # (R, N)
        lengths = torch.zeros(rows, dtype=torch.long, device=self.device)  # (R,)
        stopped = torch.zeros(rows, dtype=torch.bool, device=self.device)  # (R,)
        matched = torch.zeros(rows, dtype=torch.long, device=self.device)  # (R,) progress through the stop text
        if self.workspaces is None:
            step_rows = _StepRows(cache, limit)
        else:
            step_rows = _FixedStepRows(cache, limit, self.workspaces)
        for step in range(limit):
            token, token_logprob = self._sample(logits, generator)  # (R,), (R,)
            live = ~stopped
            tokens[:, step] = token
            logprobs[:, step] = token_logprob
            lengths += live
            matched = self.stop_text.advance(matched, token)
            stopped |= live & (torch.isin(token, self.stop_ids) | (matched == self.stop_text.full))
            if step == limit - 1:
                break
            if step % self.read_every == self.read_every - 1:
                decoding = int((~stopped).sum())  # the host read
                if decoding == 0:
                    break
                if decoding <= self.compact_below * step_rows.count:
                    step_rows.set_apart((~stopped).nonzero().squeeze(1), room=limit - step)
            logits = step_rows.forward(self._forward, logits, token, stopped, self.pad_id)
        step_rows.finish()
        lengths, tokens, logprobs = lengths.tolist(), tokens.tolist(), logprobs.tolist()  # one copy from a GPU
        return (
            [row[:n] for row, n in zip(tokens, lengths, strict=True)],
            [row[:n] for row, n in zip(logprobs, lengths, strict=True)],
            stopped.tolist(),
        )

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


def _on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator that samples on `device`: `generator` itself where it lives there, else a generator there seeded
    by one draw from it, so that the caller's generator (a CPU one, which checkpoints save) still fixes the tokens."""
    if generator is None or generator.device == device:
        return generator
    seed = int(torch.randint(2**62, (), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)
