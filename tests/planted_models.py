"""Model folders planted to run code: the tiny model saved as a transformers folder, with an `auto_map` that points
at a module of the folder's own which creates a marker file when it is imported; and hand-built GGUF files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

from r1trade.models.loading import build_tiny_model
from r1trade.models.tokenizer import build_tiny_tokenizer

PLANTED_MODULE = "planted"
"""The module the planted `auto_map`s name: `planted.py` in the model folder."""


def save_tiny_model(folder: Path, *, tool_template: bool = False) -> Path:
    """The built-in tiny model, saved as a transformers model folder (`config.json`, `tokenizer_config.json`,
    `chat_template.jinja`, weights)."""
    tokenizer = build_tiny_tokenizer(tool_template=tool_template)
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def plant(folder: Path, marker: Path, *, where: str, model_type: str | None = None) -> Path:
    """Give `folder` a `planted.py` that writes `marker` when imported, and an `auto_map` naming it in the file
    `where` (config.json or tokenizer_config.json); `model_type` replaces config.json's. Returns the planted file."""
    (folder / f"{PLANTED_MODULE}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast\n"
        "class PlantedConfig(LlamaConfig):\n    model_type = 'planted'\n"
        "class PlantedModel(LlamaForCausalLM):\n    config_class = PlantedConfig\n"
        "class PlantedTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    if model_type is not None:
        edit_json(folder / "config.json", model_type=model_type)
    auto_map = {
        "config.json": {"AutoConfig": f"{PLANTED_MODULE}.PlantedConfig",
                        "AutoModelForCausalLM": f"{PLANTED_MODULE}.PlantedModel"},
        "tokenizer_config.json": {"AutoTokenizer": [None, f"{PLANTED_MODULE}.PlantedTokenizer"]},
    }[where]
    edit_json(folder / where, auto_map=auto_map)
    return folder / where


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def r1trade_answering_yes(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`yes y | r1trade ARGS`: every question transformers could ask would be answered yes."""
    return subprocess.run(
        [sys.executable, "-m", "r1trade.cli", *args], check=False, capture_output=True, text=True, timeout=300,
        input="y\n" * 1000, env={**os.environ, "COLUMNS": "300", **(env or {})},
    )


def assert_refused_in_one_line(code: int, err: str, *named: str) -> None:
    """Exit 1 or 2, one line on stderr naming each of `named`, no traceback and no question asked."""
    assert code in (1, 2), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "[y/N]" not in err and "custom code" not in err, err
    for name in named:
        assert name in lines[0], (name, err)


# --------------------------------------------------------------------------- GGUF files by hand


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_file(*, keys: list[bytes] | None = None, tensors: list[bytes] | None = None, data: bytes = b"\0" * 16,
              key_count: int | None = None, tensor_count: int | None = None, version: int = 3) -> bytes:
    """A GGUF v3 file: by default the architecture key, `general.alignment` 32 and one 2×2 float32 tensor at
    offset 0. Its header is 24 bytes, the keys 45 + 33 = 78, the tensor entry 14 + 4 + 16 + 12 = 46: the table ends
    at byte 148, so the data starts at 160 (the next multiple of 32) and the file is 160 + 16 = 176 bytes long."""
    keys = [
        gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama"),  # 28 + 4 + 13 = 45
        gguf_string("general.alignment") + struct.pack("<II", 4, 32),  # 25 + 4 + 4 = 33
    ] if keys is None else keys
    tensors = [tensor_entry("weight", (2, 2), ggml_type=0, offset=0)] if tensors is None else tensors
    header = struct.pack("<4sIQQ", b"GGUF", version, len(tensors) if tensor_count is None else tensor_count,
                         len(keys) if key_count is None else key_count)
    table = header + b"".join(keys) + b"".join(tensors)
    padding = b"\0" * (-len(table) % 32)
    return table + padding + data


def tensor_entry(name: str, shape: tuple[int, ...], *, ggml_type: int, offset: int) -> bytes:
    return gguf_string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack(
        "<IQ", ggml_type, offset
    )
