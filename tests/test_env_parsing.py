"""The turn parser: every malformed case named precisely, strict JSON, schema checks, and fuzzing."""

from __future__ import annotations

import json

import env_fuzz as fuzz
import pytest
from hypothesis import HealthCheck, given, settings

from r1trade.env.parsing import ParseError, ToolCall, parse_tool_call, validate
from r1trade.env.tools import DexToolkit, MarketDataToolkit, ToolRegistry

REGISTRY = ToolRegistry([
    *MarketDataToolkit(indicators=["rsi_14", "sma_20"], max_candles=24).tools(),
    *DexToolkit(allow_short=True, max_position_frac=1.0, max_leverage=2.0).tools(),
])
SCHEMAS = REGISTRY.parameters


def parse(text: str) -> ToolCall | ParseError:
    return parse_tool_call(text, SCHEMAS)


HOLD = '{"name": "hold", "arguments": {"view": "neutral"}}'


def wrap(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def test_valid_call_with_reasoning_and_whitespace() -> None:
    arguments = {"side": "long", "size": 0.5, "stop_loss": 2, "view": "bullish"}
    text = (
        'RSI is low, buy.\n<tool_call>\n {"name": "place_order", "arguments": {"side": "long", "size": 0.5, '
        '"stop_loss": 2, "view": "bullish"}} \n</tool_call>'
    )
    assert parse(text) == ToolCall("place_order", arguments)


def test_arguments_may_be_omitted_for_tools_without_required_arguments() -> None:
    assert parse(wrap('{"name": "get_portfolio"}')) == ToolCall("get_portfolio", {})
    assert parse(wrap('{"name": "get_indicators", "arguments": {}}')) == ToolCall("get_indicators", {})


def test_text_after_the_call_is_ignored() -> None:
    assert isinstance(parse(wrap(HOLD) + "\nthanks"), ToolCall)


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("I would buy now.", "no_call", "no tool call found: end your turn with <tool_call>"),
        ('{"name": "hold"}</tool_call>', "no_call", "found </tool_call> without <tool_call>"),
        (wrap(HOLD) * 2, "multiple_calls", "found 2 tool calls"),
        ("<tool_call><tool_call>{}</tool_call>", "multiple_calls", "exactly one"),
        ('<tool_call>{"name": "hold", "arguments": {"view": "neutral"}}', "unclosed", "is not closed"),
        (wrap(""), "bad_json", "the tool call is empty"),
        (wrap(HOLD[:-1]), "bad_json", "invalid JSON in the tool call at character"),
        (wrap("{'name': 'hold'}"), "bad_json", "Expecting property name enclosed in double quotes"),
        (wrap('{"name": "get_candles", "arguments": {"n": NaN}}'), "bad_json", "NaN is not valid JSON"),
        (wrap('{"name": "hold", "name": "hold"}'), "bad_json", "duplicate key 'name'"),
        (wrap('["hold"]'), "not_object", "must be a JSON object like"),
        (wrap('{"tool": "hold"}'), "not_object", "unexpected key 'tool'"),
        (wrap('{"arguments": {}}'), "not_object", '"name" as a string; it is missing'),
        (wrap('{"name": 3}'), "not_object", '"name" as a string; got a number'),
        (wrap('{"name": "buy_all"}'), "unknown_tool", "unknown tool 'buy_all'; available tools: get_candles"),
        (wrap('{"name": "hold", "arguments": "up"}'), "bad_arguments", '"arguments" of hold must be a JSON'),
        (wrap('{"name": "hold", "arguments": {}}'), "bad_arguments", "arguments for hold: view is required"),
        (wrap('{"name": "hold", "arguments": {"view": "up"}}'), "bad_arguments",
         'view must be one of "bullish", "bearish", "neutral" (got up)'),
        (wrap('{"name": "get_candles", "arguments": {"n": 0}}'), "bad_arguments", "n must be ≥ 1 (got 0)"),
        (wrap('{"name": "get_candles", "arguments": {"n": 25}}'), "bad_arguments", "n must be ≤ 24 (got 25)"),
        (wrap('{"name": "get_candles", "arguments": {"n": 5.5}}'), "bad_arguments", "an integer (got 5.5)"),
        (wrap('{"name": "get_candles", "arguments": {"n": true}}'), "bad_arguments", "an integer (got true)"),
        (wrap('{"name": "get_candles", "arguments": {"n": "5"}}'), "bad_arguments", "an integer (got 5)"),
        (wrap('{"name": "get_candles", "arguments": {"n": 1e400}}'), "bad_arguments", "n must be an integer"),
        (wrap('{"name": "place_order", "arguments": {"side": "long", "size": 1e400, "view": "bullish"}}'),
         "bad_arguments", "size must be a finite number"),
        (wrap('{"name": "place_order", "arguments": {"side": "long", "size": 0, "view": "bullish"}}'),
         "bad_arguments", "size must be > 0 (got 0)"),
        (wrap('{"name": "place_order", "arguments": {"side": "long", "size": 3, "view": "bullish"}}'),
         "bad_arguments", "size must be ≤ 2 (got 3)"),
        (wrap('{"name": "place_order", "arguments": {"side": "long", "size": 1, "view": "bullish", "x": 1}}'),
         "bad_arguments", "unknown argument 'x' (allowed: side, size, stop_loss, take_profit, view)"),
        (wrap('{"name": "get_indicators", "arguments": {"names": []}}'), "bad_arguments",
         "names needs at least 1 item(s) (got 0)"),
        (wrap('{"name": "get_indicators", "arguments": {"names": ["rsi_14", "rsi_14"]}}'), "bad_arguments",
         "names must not repeat items"),
        (wrap('{"name": "get_indicators", "arguments": {"names": ["macd"]}}'), "bad_arguments",
         'names[0] must be one of "rsi_14", "sma_20" (got macd)'),
        (wrap("[" * 1500 + "]" * 1500), "too_long", "the limit is 2000"),
        (wrap("[" * 200 + "]" * 200), "not_object", "got an array"),
        (wrap('{"name": "hold", "arguments": {"view": "neutral"}, "x": ' + "[" * 200 + "]" * 200 + "}"),
         "not_object", "unexpected key 'x'"),
    ],
)
def test_malformed_turns_say_precisely_what_is_wrong(text: str, kind: str, message: str) -> None:
    result = parse(text)
    assert isinstance(result, ParseError), result
    assert result.kind == kind
    assert message in result.message


def test_several_problems_are_listed_together() -> None:
    result = parse(wrap('{"name": "place_order", "arguments": {"side": "up", "size": -1}}'))
    assert isinstance(result, ParseError)
    assert result.message == (
        "invalid arguments for place_order: view is required; "
        "side must be one of \"long\", \"short\" (got up); size must be > 0 (got -1)"
    )


def test_error_snippets_are_short_and_printable() -> None:
    result = parse(wrap(json.dumps({"name": "x" * 500 + "\x00\ud800"})))
    assert isinstance(result, ParseError)
    assert len(result.message) < 200
    result.message.encode("utf-8")  # a tokenizer must be able to encode it


def test_validator_subset_directly() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "number", "exclusiveMaximum": 1}},
              "required": ["a"]}
    assert validate({"a": 0.5}, schema) == []
    assert validate({"a": 1}, schema) == ["a must be < 1 (got 1)"]
    assert validate({"a": False}, schema) == ["a must be a number (got false)"]
    assert validate([], schema) == ["arguments must be an object (got [])"]
    assert validate(True, {"enum": [1, 2]}) == ["arguments must be one of 1, 2 (got true)"]


# ----------------------------------------------------------------------------------------------- fuzzing


@given(fuzz.turns)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_parser_never_crashes_and_always_explains(seed_text: str) -> None:
    for text in fuzz.mutations(seed_text):  # ~12 strings per example, thousands in all
        result = parse(text)
        assert isinstance(result, (ToolCall, ParseError))
        if isinstance(result, ParseError):
            assert result.message and len(result.message) < 400
            result.message.encode("utf-8")
        else:
            assert validate(result.arguments, SCHEMAS[result.name]) == []


@pytest.mark.parametrize(
    "text",
    [
        "x" * 1_000_000,
        "<tool_call>" + "x" * 1_000_000 + "</tool_call>",
        "<tool_call>" * 10_000,
        wrap('{"name": "get_candles", "arguments": {"n": ' + "9" * 1900 + "}}"),
        wrap('{"name": "hold", "arguments": {"view": "' + "\ud800" * 10 + '"}}'),
        wrap('"\\ud800"'),
        wrap("\x00\x01\x02"),
        wrap("1" * 1999),
    ],
)
def test_adversarial_inputs(text: str) -> None:
    result = parse(text)
    assert isinstance(result, ParseError)
    result.message.encode("utf-8")
