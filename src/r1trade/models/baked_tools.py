"""Tool schemas baked into a chat template, so that every renderer of a model shows the tools as one trainer did.

TRL's GRPOTrainer renders a conversation with the env's tools passed to the chat template (`tools=`), which puts a
block of their JSON schemas in the system turn (1,700 tokens for the Qwen template). r1trade's own rollouts, warm
start, probes and backtests render without `tools=`. A policy trained through TRL would then be played in a context
it never saw. A warm start for TRL bakes the schemas into the saved template instead: without `tools=` the template
takes the baked ones, so every renderer, TRL's included, shows the same system turn.

The baked part is one Jinja statement before the template, between two markers, so that the original template,
which TRL recognises by its text, can be recovered exactly.
"""

from __future__ import annotations

import json
from typing import Any

from r1trade.errors import ConfigError

_START = "{#- r1trade baked tools #}"
_END = "{#- end of r1trade baked tools #}"


def bake_tools(template: str, tools: list[dict[str, Any]]) -> str:
    """`template` (without baked tools) that renders `tools` whenever it is called without `tools=`."""
    if _START in template:
        raise ValueError("the chat template already has baked tools")
    return f"{_START}{{%- set tools = tools or {_jinja_literal(tools)} %}}{_END}{template}"


def without_baked_tools(template: str) -> str:
    """The template as it was before `bake_tools` (unchanged if nothing is baked)."""
    return template.split(_END, 1)[1] if template.startswith(_START) else template


def baked_tools(template: str | None) -> list[dict[str, Any]] | None:
    """The tool schemas baked into `template`, or None."""
    if not template or not template.startswith(_START):
        return None
    statement, _, _ = template[len(_START) :].partition(_END)
    try:
        tools = json.loads(statement.removeprefix("{%- set tools = tools or ").removesuffix(" %}"))
    except json.JSONDecodeError:
        tools = None
    if not isinstance(tools, list) or _END not in template:
        raise ConfigError("the model's chat template has a damaged block of baked tools; warm-start it again")
    return tools


def _jinja_literal(value: Any) -> str:
    """`value` (JSON data) as a Jinja literal that is also JSON: strings, numbers, lists and dicts read alike in both;
    Jinja knows `true`, `false` and `none` but not `null`, so None is refused (no tool schema holds one)."""
    if value is None:
        raise ValueError("a baked tool schema cannot hold null")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_jinja_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_jinja_literal(v) for v in value) + "]"
    return json.dumps(value)  # ASCII escapes (\uXXXX) read the same in Jinja
