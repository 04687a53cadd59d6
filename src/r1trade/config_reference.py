"""The config reference in docs/guide.md, rendered from the pydantic models in `r1trade.config`, so that the
guide names every key with its real default and cannot drift from the code (a test compares them).

`python -m r1trade.config_reference docs/guide.md` rewrites the guide's block between the two markers below.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from r1trade.config import Config

BEGIN = ("<!-- config reference: rendered from src/r1trade/config.py by "
         "`python -m r1trade.config_reference docs/guide.md` -->")
END = "<!-- end of the config reference -->"


def reference_markdown(root: type[BaseModel] = Config) -> str:
    """Every section's table: a section's own keys, then its subsections, in the models' field order."""
    return "\n\n".join(_section_markdown(path, model) for path, model in _sections(root, "")) + "\n"


def rewrite_guide(guide: Path, root: type[BaseModel] = Config) -> bool:
    """Puts the rendered reference between BEGIN and END in `guide`; returns whether the file changed."""
    text = guide.read_text(encoding="utf-8")
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{guide} lacks the two comments that mark the config reference's place")
    new = f"{head}{BEGIN}\n\n{reference_markdown(root)}\n{END}{tail}"
    if new != text:
        guide.write_text(new, encoding="utf-8")
    return new != text


def undescribed_keys(root: type[BaseModel] = Config) -> list[str]:
    """Keys whose field has no `description`: the reference would show them without a word on what they do."""
    return [f"{path}{name}" for path, model in _sections(root, "")
            for name, field in _keys(model) if not field.description]


def _sections(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    yield path, model
    for name, field in model.model_fields.items():
        if _is_section(field):
            yield from _sections(field.annotation, f"{path}{name}.")  # type: ignore[arg-type]


def _keys(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    return ((name, field) for name, field in model.model_fields.items() if not _is_section(field))


def _is_section(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def _section_markdown(path: str, model: type[BaseModel]) -> str:
    title = f"`{path.rstrip('.')}`" if path else "Top level"
    summary = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n    ", " ").replace("\n", " ")
    rows = [f"| `{name}` | `{_default_text(field)}` | {_escape(_what_it_does(field))} |"
            for name, field in _keys(model)]
    header = ["| key | default | what it does |", "|---|---|---|"]
    return "\n".join([f"#### {title}", "", summary, "", *header, *rows])


def _what_it_does(field: FieldInfo) -> str:
    """The field's description, after the choices of a Literal (`a` | `b`: ...)."""
    choices = _literal_choices(field.annotation)
    described = field.description or ""
    return f"{' | '.join(f'`{c}`' for c in choices)}: {described}" if choices else described


def _literal_choices(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def _default_text(field: FieldInfo) -> str:
    return _yaml_text(field.get_default(call_default_factory=True))


def _yaml_text(value: Any) -> str:
    """A default as it would read in a config file: null, true, [a, b], {k: v}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_yaml_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _escape(text: str) -> str:
    """A `|` inside a Markdown table cell must be escaped, or it starts a new cell."""
    return text.replace("|", "\\|")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m r1trade.config_reference docs/guide.md", file=sys.stderr)
        return 2
    missing = undescribed_keys()
    if missing:
        print(f"keys without a description: {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        changed = rewrite_guide(Path(argv[0]))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{argv[0]}: the config reference {'rewritten' if changed else 'already current'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
