"""Turn parsing: exactly one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, strictly checked.

Nothing is ever evaluated. Every way a turn can be wrong maps to a `ParseError` whose message says precisely
what was wrong, because that message is what the model reads next. Validation covers the JSON-schema subset
the tools use: type, properties, required, additionalProperties, enum, minimum/maximum (exclusive too), items,
minItems, maxItems and uniqueItems.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_CALL_CHARS = 2_000
CALL_FORMAT = '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'

ErrorKind = Literal[
    "no_call", "multiple_calls", "unclosed", "too_long", "bad_json", "not_object", "unknown_tool",
    "bad_arguments",
]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a known tool's name and schema-valid arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParseError:
    """A turn that is not one valid tool call, and what the model should be told."""

    kind: ErrorKind
    message: str


def snippet(value: object, limit: int = 40) -> str:
    """A short, printable, valid-UTF-8 rendering of user-supplied text for error messages."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text[: limit + 1])
    return text[:limit] + "…" if len(text) > limit else text


def parse_tool_call(text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall | ParseError:
    """The single tool call of a model turn, validated; `schemas` maps tool name → parameters schema."""
    opened, closed = text.count(OPEN_TAG), text.count(CLOSE_TAG)
    if opened == 0:
        where = f" (found {CLOSE_TAG} without {OPEN_TAG})" if closed else ""
        return ParseError("no_call", f"no tool call found{where}: end your turn with {CALL_FORMAT}")
    if opened > 1 or closed > 1:
        return ParseError(
            "multiple_calls",
            f"found {max(opened, closed)} tool calls; a turn must contain exactly one <tool_call>",
        )
    start = text.index(OPEN_TAG) + len(OPEN_TAG)
    end = text.find(CLOSE_TAG, start)
    if end < 0:
        return ParseError("unclosed", f"{OPEN_TAG} is not closed: end the call with {CLOSE_TAG}")
    body = text[start:end].strip()
    if len(body) > MAX_CALL_CHARS:
        return ParseError(
            "too_long", f"the tool call is {len(body)} characters; the limit is {MAX_CALL_CHARS}"
        )
    decoded = _loads(body)
    if isinstance(decoded, ParseError):
        return decoded
    return _check_call(decoded, schemas)


def _loads(body: str) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys; any failure becomes a ParseError."""
    if not body:
        return ParseError("bad_json", f"the tool call is empty: write {CALL_FORMAT}")
    try:
        return json.loads(body, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        return ParseError("bad_json", f"invalid JSON in the tool call at character {exc.pos + 1}: {exc.msg}")
    except RecursionError:
        return ParseError("bad_json", "invalid JSON in the tool call: nested too deeply")
    except ValueError as exc:
        return ParseError("bad_json", f"invalid JSON in the tool call: {snippet(str(exc), 80)}")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON; use a finite number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    unique = dict(pairs)
    if len(unique) < len(pairs):
        keys = [key for key, _ in pairs]
        raise ValueError(f"duplicate key '{snippet(next(k for k in keys if keys.count(k) > 1))}'")
    return unique


def _check_call(decoded: Any, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall | ParseError:
    """The decoded JSON must be {"name": <known tool>, "arguments": {...valid...}}."""
    if not isinstance(decoded, dict):
        return ParseError(
            "not_object", f"the tool call must be a JSON object like {CALL_FORMAT}, got {_json_type(decoded)}"
        )
    extra = [key for key in decoded if key not in ("name", "arguments")]
    if extra:
        return ParseError(
            "not_object",
            f"unexpected key '{snippet(extra[0])}' in the tool call; use only \"name\" and \"arguments\"",
        )
    name = decoded.get("name")
    if not isinstance(name, str):
        given = "it is missing" if name is None else f"got {_json_type(name)}"
        return ParseError("not_object", f'the tool call needs "name" as a string; {given}')
    if name not in schemas:
        return ParseError(
            "unknown_tool", f"unknown tool '{snippet(name)}'; available tools: {', '.join(schemas)}"
        )
    arguments = decoded.get("arguments", {})
    if not isinstance(arguments, dict):
        return ParseError(
            "bad_arguments", f'"arguments" of {name} must be a JSON object, got {_json_type(arguments)}'
        )
    problems = validate(arguments, schemas[name])
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        return ParseError("bad_arguments", f"invalid arguments for {name}: {shown}")
    return ToolCall(name, arguments)


# ------------------------------------------------------------------------------------------- schema subset


def validate(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Problems of `value` against `schema` (the subset above), each naming where and what: [] when valid.

    >>> validate({"size": 2}, {"type": "object", "properties": {"size": {"type": "number", "maximum": 1}}})
    ['size must be ≤ 1 (got 2)']
    """
    where = path or "arguments"
    expected = schema.get("type")
    if expected is not None and not _is_type(value, expected):
        return [f"{where} must be {_article(expected)} (got {snippet(value)})"]
    if "enum" in schema and value not in schema["enum"] or _is_bool_in_enum(value, schema):
        options = ", ".join(json.dumps(option) for option in schema["enum"])
        return [f"{where} must be one of {options} (got {snippet(value)})"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _check_number(value, schema, where)
    if isinstance(value, list):
        return _check_array(value, schema, where)
    if isinstance(value, dict):
        return _check_object(value, schema, path)
    return []


def _check_number(value: float, schema: Mapping[str, Any], where: str) -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where} must be a finite number"]
    bounds = (
        ("minimum", lambda v, b: v >= b, "≥"),
        ("exclusiveMinimum", lambda v, b: v > b, ">"),
        ("maximum", lambda v, b: v <= b, "≤"),
        ("exclusiveMaximum", lambda v, b: v < b, "<"),
    )
    return [
        f"{where} must be {sign} {schema[key]:g} (got {snippet(value)})"
        for key, holds, sign in bounds
        if key in schema and not holds(value, schema[key])
    ]


def _check_array(value: list, schema: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    if "minItems" in schema and len(value) < schema["minItems"]:
        problems.append(f"{where} needs at least {schema['minItems']} item(s) (got {len(value)})")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        problems.append(f"{where} allows at most {schema['maxItems']} item(s) (got {len(value)})")
    if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) < len(value):
        problems.append(f"{where} must not repeat items")
    if "items" in schema:
        for i, item in enumerate(value[:50]):
            problems += validate(item, schema["items"], f"{where}[{i}]")
    return problems


def _check_object(value: dict, schema: Mapping[str, Any], path: str) -> list[str]:
    properties = schema.get("properties", {})
    prefix = f"{path}." if path else ""
    problems = [f"{prefix}{key} is required" for key in schema.get("required", ()) if key not in value]
    if schema.get("additionalProperties") is False:
        unknown = [key for key in value if key not in properties]
        if unknown:
            allowed = ", ".join(properties) or "none"
            problems.append(f"unknown argument '{snippet(unknown[0])}' (allowed: {allowed})")
    for key, sub_schema in properties.items():
        if key in value:
            problems += validate(value[key], sub_schema, prefix + key)
    return problems


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "null": (type(None),),
}


def _is_type(value: Any, expected: str) -> bool:
    if isinstance(value, bool) and expected in ("integer", "number"):
        return False
    return isinstance(value, _TYPES.get(expected, (object,)))


def _is_bool_in_enum(value: Any, schema: Mapping[str, Any]) -> bool:
    """`True in [1]` is true in Python; JSON keeps booleans and numbers apart."""
    if "enum" not in schema or not isinstance(value, bool):
        return False
    return not any(option is value for option in schema["enum"])


def _article(json_type: str) -> str:
    articles = {"integer": "an integer", "object": "an object", "array": "an array"}
    return articles.get(json_type, f"a {json_type}")


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), "null")
