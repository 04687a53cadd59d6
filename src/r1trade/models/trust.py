"""Model folders from elsewhere: refused, in one line that names the file, where loading them would run Python.

transformers imports a folder's own modules when its `config.json` or `tokenizer_config.json` has an `auto_map`,
and for a `model_type` it does not know it asks on a terminal whether to. r1trade passes `trust_remote_code=False`
to every load, so no such module is ever imported and no question is asked; `require_no_model_code` refuses the
folder first, before any transformers call reads it, so the one line says which file is the cause. Every path that
loads a model or tokenizer goes through it: the policy, the critic and the reference (`r1trade.models.loading`,
which also serves the model TRL trains), a checkpoint's `policy/`, and a Hugging Face id's files in the local cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from r1trade.errors import UsageError
from r1trade.safe_load import read_json_object

CODE_FILES = ("config.json", "tokenizer_config.json")
"""The files whose `auto_map` makes transformers import a folder's own modules (the model's, the tokenizer's)."""


def require_no_model_code(source: str | Path, *, local_only: bool = True, files: Sequence[str] = CODE_FILES) -> None:
    """Refuse the model folder or Hugging Face id `source` where one of its `files` has an `auto_map`, or its
    `config.json` names a `model_type` transformers does not know: a model that needs Python of its own.

    For an id, the files come from the Hugging Face cache (downloaded first unless `local_only`); an id or file
    that cannot be found is left to transformers, which reports it."""
    for name in files:
        path = _local_file(source, name, local_only=local_only)
        if path is not None:
            _check(path)


def _check(path: Path) -> None:
    document = read_json_object(path)
    if "auto_map" in document:
        raise UsageError(
            f"{path}: refused: its auto_map names Python code of the model folder's own, which loading would run; "
            "r1trade loads only models transformers supports itself"
        )
    model_type = document.get("model_type")
    if path.name == "config.json" and model_type is not None and not _known_model_type(model_type):
        raise UsageError(
            f"{path}: refused: model_type {str(model_type)[:80]!r} is not one transformers knows, so the model "
            "would need Python code of its own, which r1trade does not run"
        )


def _known_model_type(model_type: object) -> bool:
    from transformers import CONFIG_MAPPING  # (imported only where a folder is checked)

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING


def _local_file(source: str | Path, name: str, *, local_only: bool) -> Path | None:
    """`source`/`name` for a folder; for a Hugging Face id, its cached copy (downloaded unless `local_only`)."""
    if Path(source).is_dir():
        path = Path(source) / name
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(str(source), name, local_files_only=local_only))
    except (OSError, ValueError, EntryNotFoundError):  # not cached, no such file, not an id: transformers reports it
        return None
