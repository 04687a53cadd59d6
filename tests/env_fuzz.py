"""Hypothesis strategies for model turns: near-miss calls, unicode, tag soup, binary-ish text, nested JSON."""

from __future__ import annotations

import json

from hypothesis import strategies as st

TOOL_NAMES = ["get_candles", "get_indicators", "get_sentiment", "get_portfolio", "place_order",
              "close_position", "hold", "", "HOLD", "place_order "]
ARG_NAMES = ["side", "size", "view", "n", "names", "stop_loss", "take_profit", "x"]

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
    | st.sampled_from(["long", "short", "bullish", "bearish", "neutral", "rsi_14", "sma_20"])
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
near_calls = st.builds(
    lambda name, args: f"Reasoning.\n<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>",
    st.sampled_from(TOOL_NAMES),
    st.dictionaries(st.sampled_from(ARG_NAMES), scalars | st.lists(scalars, max_size=3), max_size=5),
)
any_text = st.text(alphabet=st.characters(codec=None, categories=None), max_size=200)
tag_soup = st.lists(
    st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', ":", '"hold"', '"arguments"', "[",
                     "]", ",", '"', "\\", "\n", "NaN", "1e999", '"view"', '"neutral"']),
    max_size=30,
).map("".join)
binaryish = st.binary(max_size=200).map(lambda b: b.decode("latin-1"))
turns = near_calls | any_text | tag_soup | binaryish | json_values.map(json.dumps)


def mutations(text: str) -> list[str]:
    """The text and a dozen damaged variants: wrapped, doubled, truncated, quotes swapped, bytes injected."""
    wrapped = f"<tool_call>{text}</tool_call>"
    cuts = [len(text) * k // 5 for k in range(1, 5)]
    return [
        text,
        wrapped,
        text + text,
        *(text[:cut] for cut in cuts),
        text.replace('"', "'"),
        text.replace("}", "", 1),
        text[::-1],
        text.replace(":", ":\x00", 1),
        wrapped.replace("</tool_call>", ""),
    ]
