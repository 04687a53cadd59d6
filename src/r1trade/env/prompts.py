"""Prompt text: the system prompt (tool schemas rendered in), observations, fills and context summaries.

Everything is sized for a small model with an 8k context: the system prompt stays under ~600 tokens and an
observation under ~150; prices carry six significant digits, changes are in percent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from r1trade.config import EnvConfig
from r1trade.env.market import MarketReplay, format_amount, format_price
from r1trade.env.portfolio import Fill, Portfolio
from r1trade.env.tools import ToolRegistry, describe_portfolio

TRADE_TOOLS = "place_order, close_position or hold"
_FILL_NAMES = {"order": "Filled", "stop_loss": "Stop-loss filled", "take_profit": "Take-profit filled"}


def render_signature(name: str, parameters: dict[str, Any]) -> str:
    """A compact signature from a JSON schema: `place_order(side: long|short, size: number 0-2, ...)`."""
    required = set(parameters.get("required", ()))
    parts = []
    for arg, schema in parameters.get("properties", {}).items():
        optional = "" if arg in required else "?"
        parts.append(f"{arg}{optional}: {_render_type(schema)}")
    return f"{name}({', '.join(parts)})"


def _render_type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(str(option) for option in schema["enum"])
    if schema.get("type") == "array":
        items = schema.get("items", {})
        return f"list of {', '.join(items['enum'])}" if "enum" in items else f"list of {_render_type(items)}"
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    bounds = f" {low:g}-{high:g}" if low is not None and high is not None else ""
    return f"{schema.get('type', 'any')}{bounds}"


def render_system_prompt(registry: ToolRegistry, *, config: EnvConfig, symbol: str, timeframe: str) -> str:
    """The rules, the exact call format with an example, and every tool's signature and purpose."""
    short = "shorting is allowed" if config.allow_short else "shorting is disabled"
    tools = "\n".join(
        f"- {render_signature(tool.name, tool.parameters)}: {tool.description}" for tool in registry
    )
    example = json.dumps(
        {"name": "place_order", "arguments": {"side": "long", "size": 0.5, "stop_loss": 2, "view": "bullish"}}
    )
    return (
        f"You trade {symbol} on {timeframe} bars. Each decision comes after a bar closes: call info tools if "
        f"useful, then end the decision with {TRADE_TOOLS}; the market then moves {config.decision_every} "
        f"bar(s). Orders fill at the next open with slippage and a {config.fee_bps / 100:g}% fee. size = "
        f"fraction of equity to hold (max {config.max_position_frac:g}); {short}. stop_loss and take_profit "
        f"= % distance from entry. At most {config.max_tool_calls} tool calls per decision, then a penalized "
        "forced hold. Your reward follows your equity.\n\n"
        "Each reply: brief reasoning, then exactly one tool call:\n"
        '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n'
        "Example:\nPrice is above SMA20 and RSI is rising.\n"
        f"<tool_call>{example}</tool_call>\n\n"
        f"Tools:\n{tools}\n\n"
        "Indicators: SMA/EMA = close vs average in %; ATR, MACDh in % of price; BB%B 0 = lower band, "
        "1 = upper; VolZ = volume z-score."
    )


def render_observation(
    replay: MarketReplay,
    portfolio: Portfolio,
    *,
    bar: int,
    decision: int,
    decisions: int,
    config: EnvConfig,
) -> str:
    """What the agent sees at a decision: time, price and recent changes, a few indicators, its portfolio."""
    return (
        f"Decision {decision + 1}/{decisions} | {market_text(replay, bar, config)}\n"
        f"{describe_portfolio(portfolio, price=replay.close[bar])}\n"
        f"Tool calls left: {config.max_tool_calls}. End with {TRADE_TOOLS}."
    )


def market_text(replay: MarketReplay, bar: int, config: EnvConfig) -> str:
    """The market part of an observation (time, price, changes, indicators), rendered once per bar."""
    key = (bar, config.decision_every, *config.observe_indicators)
    text = replay.text_cache.get(key)
    if text is None:
        spans = sorted({1, config.decision_every, 6 * config.decision_every})
        changes = " | ".join(
            f"{n} bar{'s' if n > 1 else ''} {_signed_pct(replay.change_pct(bar, n))}" for n in spans
        )
        lines = [f"{replay.decision_labels[bar]} | {replay.symbol} {format_price(replay.close[bar])}",
                 f"Change: {changes}"]
        if config.observe_indicators:
            lines.append(" | ".join(replay.feature_text[name][bar] for name in config.observe_indicators))
        text = replay.text_cache[key] = "\n".join(lines)
    return text


def _signed_pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}%"


def describe_fill(fill: Fill, replay: MarketReplay) -> str:
    """`Filled buy 0.0445 @ 11050.3, fee 4.92 (2018-03-04 13:00).`"""
    name = _FILL_NAMES[fill.reason]
    return (
        f"{name} {fill.side} {format_amount(abs(fill.units))} @ {format_price(fill.price)}, "
        f"fee {fill.fee:.2f} ({replay.bar_labels[fill.bar]})."
    )


def render_summary(
    portfolio: Portfolio,
    *,
    price: float,
    decision: int,
    decisions: int,
    fills: int,
    recent_actions: Sequence[str],
) -> str:
    """The compact state that stands in for omitted turns after a context reset."""
    actions = "; ".join(recent_actions) or "none"
    return (
        f"Earlier turns are omitted. Decision {decision + 1} of {decisions} comes next. "
        f"{describe_portfolio(portfolio, price=price, detailed=True)} | Fills so far {fills}. "
        f"Recent decisions: {actions}."
    )
