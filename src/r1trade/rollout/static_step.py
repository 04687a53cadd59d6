"""A decoding step over buffers of fixed shape, replayed on CUDA as one graph per bucket of rows and columns.

A decoding step launches some hundreds of small kernels from Python; on a GPU those launches, not the arithmetic,
set the step's time (46-83 ms a step whatever the model's size). Captured once as a CUDA graph, the step is
replayed with one launch. A graph fixes the shape and the address of every tensor it touches, so the step runs in
a `StepWorkspace`: the turn's rows padded to a bucket (a power of two), keys and values in buffers of a fixed
number of columns (the turn's cache and its room, rounded up to a power of two), a mask over all of those columns,
and the tokens, the column to write and the rows' positions as tensors the graph reads. The keys of columns no row
attends to are masked out, so the step computes what the growing cache's step does. A turn copies its rows' cache
in (`load`) and the columns its steps added back out (`added`).

The workspaces are kept for the backend's life (`StepWorkspaces`, the `KEPT` last used): the graphs read the weights where they are, and
an optimiser updates them in place, so a graph stays valid across updates; weights moved elsewhere drop them all.
Without capture (a CPU, or a capture that failed) the same step runs eagerly, which the tests check on the CPU.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

LayerStates = Sequence[tuple[torch.Tensor, torch.Tensor]]
"""Per decoder layer: keys and values (R, H_kv, L, D)."""


def row_bucket(rows: int) -> int:
    """The workspace rows for `rows` rows: the next power of two (so that few graphs serve every batch)."""
    return 1 << max(rows - 1, 0).bit_length()


def column_bucket(columns: int) -> int:
    """The workspace columns for `columns` columns: the next power of two, at least 256."""
    return max(256, 1 << max(columns - 1, 0).bit_length())


class _FixedLayer(CacheLayerMixin):
    """One decoder layer's keys and values in fixed buffers (R, H_kv, C, D); a step writes its column at `column`
    (a (1,) tensor, so the graph reads it rather than fixing it) and attends over every column, the mask deciding
    which count."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist from the start."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]

    def get_max_length(self) -> int:
        return self.keys.shape[-2]


class StepWorkspace:
    """The fixed-shape inputs, KV buffers and (on CUDA) the captured graph of one decoding step for `rows` rows
    over `columns` cached columns."""

    WARM_UP_RUNS = 2
    """Eager runs on a side stream before capturing (CUDA's libraries set themselves up outside the graph)."""

    def __init__(
        self,
        model: nn.Module,
        like: LayerStates,
        *,
        rows: int,
        columns: int,
        pad_id: int,
        cache_keyword: str,
        capture: bool,
    ) -> None:
        """`like`: a cache's layers, whose dtype, device and head shapes the buffers take."""
        self.model, self.pad_id, self.cache_keyword, self.capture = model, pad_id, cache_keyword, capture
        keys = like[0][0]
        device, self.dtype = keys.device, keys.dtype
        self.token = torch.full((rows,), pad_id, dtype=torch.long, device=device)  # (R,)
        self.live = torch.zeros(rows, dtype=torch.bool, device=device)  # (R,) a row still in its turn
        self.next_position = torch.zeros(rows, dtype=torch.long, device=device)  # (R,)
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # where the step writes
        self.attends = torch.zeros(rows, columns, dtype=torch.bool, device=device)  # (R, C)
        self.kv = Cache(layers=[
            _FixedLayer(k.new_zeros(rows, k.shape[1], columns, k.shape[-1]),
                        v.new_zeros(rows, v.shape[1], columns, v.shape[-1]), self.column)
            for k, v in like
        ])
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_logits: torch.Tensor | None = None  # (R, V) the captured step's output, refreshed by each replay
        self.rows, self.start = 0, 0

    def load(self, layers: LayerStates, attention: torch.Tensor, next_position: torch.Tensor) -> None:
        """Copy the rows' cache in: `attention` (r, L) their 0/1 mask, `next_position` (r,); the steps then write
        columns L, L+1, ... Rows past r are padding: they attend to one column and their outputs are not read."""
        self.rows, self.start = attention.shape
        for layer, (keys, values) in zip(self.kv.layers, layers, strict=True):
            layer.keys[: self.rows, :, : self.start] = keys
            layer.values[: self.rows, :, : self.start] = values
        self.attends.zero_()
        self.attends[: self.rows, : self.start] = attention.bool()
        self.attends[self.rows :, 0] = True
        self.next_position.zero_()
        self.next_position[: self.rows] = next_position
        self.live.zero_()
        self.token.fill_(self.pad_id)
        self.column.fill_(self.start)

    def step(self, token: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed each row's token (padding, unattended, where `live` is False) and return its next-token logits
        (r, V); the logits of a replayed graph are overwritten by the next step."""
        self.token[: self.rows] = token
        self.live[: self.rows] = live
        if self.capture and self.graph is None:
            self._capture()
        logits = self._forward() if self.graph is None else self._replay()
        self.next_position += self.live
        self.column += 1
        return logits[: self.rows]

    def added(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
        """What the steps since `load` added, for the loaded rows: per layer their keys and values (r, H_kv, n, D),
        their 0/1 mask (r, n) and the rows' next positions (r,)."""
        end = int(self.column)
        layers = [(layer.keys[: self.rows, :, self.start : end], layer.values[: self.rows, :, self.start : end])
                  for layer in self.kv.layers]
        attention = self.attends[: self.rows, self.start : end].long()
        return layers, attention, self.next_position[: self.rows].clone()

    def _forward(self) -> torch.Tensor:
        """The step itself; it only writes what each run writes alike (this step's keys, values and mask column),
        so that warm-up runs and the capture leave the state as they found it."""
        self.attends.index_copy_(1, self.column, self.live[:, None])
        ids = torch.where(self.live, self.token, self.pad_id)[:, None]  # (R, 1)
        positions = (self.next_position + self.live.long() - 1).clamp(min=0)[:, None]  # (R, 1)
        blocked = torch.finfo(self.dtype).min
        mask = torch.zeros(self.attends.shape, dtype=self.dtype, device=self.attends.device)
        mask = mask.masked_fill(~self.attends, blocked)[:, None, None, :]  # (R, 1, 1, C), added to the scores
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         **{self.cache_keyword: self.kv}, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _capture(self) -> None:
        """Capture `_forward` as a CUDA graph; if the model cannot be captured, warn once and stay eager."""
        device = self.token.device
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(self.WARM_UP_RUNS):
                    self._forward()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.graph_logits = self._forward()
            self.graph = graph
        except RuntimeError as error:
            self.capture, self.graph, self.graph_logits = False, None, None
            warnings.warn(f"the decoding step could not be captured as a CUDA graph, so it runs eagerly: {error}",
                          stacklevel=2)

    def _replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.graph_logits


class StepWorkspaces:
    """The workspaces of one model's rollouts, by (rows, columns) bucket, the `KEPT` last used of them."""

    KEPT = 8
    """Workspaces held at once, each with a whole cache of keys and values and a graph's memory. A rollout uses
    several: its contexts grow turn by turn (wider buckets), and the rows still in their turn are set apart
    (`rollout.compact_below`) into smaller ones; fewer than those would capture graphs again every turn."""

    def __init__(self, model: nn.Module, *, pad_id: int, cache_keyword: str, capture: bool) -> None:
        self.model, self.pad_id, self.cache_keyword, self.capture = model, pad_id, cache_keyword, capture
        self._spaces: OrderedDict[tuple[int, int], StepWorkspace] = OrderedDict()
        self._weights: tuple[int, ...] = ()

    def check_weights(self) -> None:
        """Drop every workspace if the weights are no longer where the graphs read them."""
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        if weights != self._weights:
            self._spaces.clear()
            self._weights = weights

    def get(self, like: LayerStates, *, rows: int, columns: int) -> StepWorkspace:
        """A workspace for `rows` rows and `columns` cached columns (at least), shaped like the cache `like`."""
        key = (row_bucket(rows), column_bucket(columns))
        self.capture = self.capture and all(space.capture for space in self._spaces.values())  # one failure: eager
        space = self._spaces.pop(key, None)
        if space is None:
            while len(self._spaces) >= self.KEPT:
                self._spaces.popitem(last=False)
            space = StepWorkspace(self.model, like, rows=key[0], columns=key[1], pad_id=self.pad_id,
                                  cache_keyword=self.cache_keyword, capture=self.capture)
        self._spaces[key] = space
        return space
