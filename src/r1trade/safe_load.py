"""Reading files a user may have been handed (checkpoints above all): safetensors and JSON only, never a pickle.

A damaged, truncated or planted file becomes one `CheckpointError` line that names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r1trade.errors import CheckpointError

if TYPE_CHECKING:
    import torch


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (torch imported here: commands that read only JSON start in a second)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (OSError, SafetensorError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({first_line(exc)})") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object (mapping) in `path`."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON file ({first_line(exc)})") from None
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(loaded).__name__}")
    return loaded


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, cut to `limit` characters (its type when it has none)."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]
