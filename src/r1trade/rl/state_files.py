"""Optimizer, scheduler and random-number states as safetensors plus JSON: nothing in a checkpoint is unpickled.

`torch.save` writes pickles, and unpickling a planted file runs its code. A state here is a tree of dicts, lists,
tuples, numbers, strings, tensors and NumPy arrays; `save_state` puts every tensor into `<stem>.safetensors` and
the rest into `<stem>.json`, where a tensor is a reference `{"tensor": key}`. Reading builds only those types.
For example `{"step": 3, "rng": torch.zeros(2)}` becomes `{"step": 3, "rng": {"tensor": "0"}}` in the JSON file
and the tensor `"0"` in the safetensors file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from r1trade.errors import CheckpointError
from r1trade.safe_load import first_line, read_json_object, read_tensors

_MARKERS = ("tensor", "array", "tuple", "items")


def state_files(directory: Path, stem: str) -> tuple[Path, Path]:
    """The JSON and safetensors files that hold the state `stem` in `directory`."""
    return directory / f"{stem}.json", directory / f"{stem}.safetensors"


def save_state(state: Any, directory: Path, stem: str) -> None:
    """Write `state` as `<stem>.json` and `<stem>.safetensors` in `directory`."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors)
    json_path, tensor_path = state_files(directory, stem)
    save_file(tensors, tensor_path)
    json_path.write_text(json.dumps(tree) + "\n")


def load_state(directory: Path, stem: str) -> Any:
    """The state `save_state` wrote; a damaged or foreign file is a one-line `CheckpointError` naming it."""
    json_path, tensor_path = state_files(directory, stem)
    tensors = read_tensors(tensor_path)
    tree = read_json_object(json_path)
    try:
        return _decode(tree, tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{json_path}: damaged state file ({first_line(exc)})") from None


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {"tensor": key}
    if isinstance(value, np.ndarray):  # NumPy's RNG keys are uint32: kept exactly in int64
        return {"array": _encode(torch.from_numpy(value.astype(np.int64)), tensors), "dtype": value.dtype.str}
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, tensors) for item in value]}
    if isinstance(value, list):
        return [_encode(item, tensors) for item in value]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and not any(key in _MARKERS for key in value):
            return {key: _encode(item, tensors) for key, item in value.items()}
        return {"items": [[_key(key), _encode(item, tensors)] for key, item in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint state")


def _key(key: Any) -> int | str:
    if not isinstance(key, (int, str)):
        raise TypeError(f"cannot store the dict key {key!r} in a checkpoint state")
    return key


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, list):
        return [_decode(item, tensors) for item in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"tensor"}:
        return tensors[node["tensor"]]
    if set(node) == {"array", "dtype"}:
        dtype = np.dtype(node["dtype"])
        if dtype.kind not in "biuf":
            raise ValueError(f"array of dtype {dtype} in a checkpoint state")
        stored = _decode(node["array"], tensors).numpy()
        array = stored.astype(dtype)
        if not np.array_equal(array, stored):  # astype wraps what its dtype cannot hold
            raise ValueError(f"array values out of range of its dtype {dtype}")
        return array
    if set(node) == {"tuple"}:
        return tuple(_decode(item, tensors) for item in node["tuple"])
    if set(node) == {"items"}:
        return {_key(key): _decode(item, tensors) for key, item in node["items"]}
    return {key: _decode(item, tensors) for key, item in node.items()}
