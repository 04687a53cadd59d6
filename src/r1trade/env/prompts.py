"""Prompt text: the system prompt (tool schemas rendered in), observations, fills and context summaries.

Everything is sized for a small model with an 8k context: the system prompt stays under ~600 tokens and an
observation under ~150; prices carry six significant digits, changes are in percent. `env.prompt: compact` gives
the same tools and rules in under 250 SmolLM2 tokens, and observations and order fills without what they repeat
(the call-budget reminder, the units held, an order fill's time); `full` (the default) is the text the existing
warm starts were trained on and stays as it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from r1trade.config import EnvConfig
from r1trade.env.market import MarketReplay, changes_text, format_amount, format_price
from r1trade.env.portfolio import Fill, Portfolio
from r1trade.env.tools import Tool, ToolRegistry, describe_portfolio

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
        return "|".join(
            f"{option:g}" if isinstance(option, float) else str(option) for option in schema["enum"]
        )
    if schema.get("type") == "array":
        items = schema.get("items", {})
        return f"list of {', '.join(items['enum'])}" if "enum" in items else f"list of {_render_type(items)}"
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    bounds = f" {low:g}-{high:g}" if low is not None and high is not None else ""
    return f"{schema.get('type', 'any')}{bounds}"


def render_system_prompt(
    registry: ToolRegistry, *, config: EnvConfig, symbol: str, timeframe: str, target_vol: float
) -> str:
    """The rules, the exact call format with an example, and every tool's signature and purpose.

    Under the volatility-target mandate (`env.mandate`), the sizing rules and the reward are the mandate's
    (`mandate_rule`, `target_vol` its annualised target), and the example names one of its sizes."""
    if config.prompt == "compact":
        return render_compact_system_prompt(
            registry, config=config, symbol=symbol, timeframe=timeframe, target_vol=target_vol
        )
    short = "shorting is allowed" if config.allow_short else "shorting is disabled"
    tools = "\n".join(
        f"- {render_signature(tool.name, tool.parameters)}: {tool.description}" for tool in registry
    )
    if config.mandate == "vol_target":
        rules = mandate_rule(config, target_vol=target_vol)
        reward, reasoning = "", "Size for the volatility target."
        arguments: dict[str, Any] = {"side": "long", "size": _middle_size(config), "view": "neutral"}
    else:
        rules = (
            f"size = fraction of equity to hold (max {config.max_position_frac:g}); {short}. stop_loss and "
            "take_profit = % distance from entry."
        )
        reward, reasoning = " Your reward follows your equity.", "Price is above SMA20 and RSI is rising."
        arguments = {"side": "long", "size": 0.5, "stop_loss": 2, "view": "bullish"}
    example = json.dumps({"name": "place_order", "arguments": arguments})
    return (
        f"You trade {symbol} on {timeframe} bars. Each decision comes after a bar closes: call info tools if "
        f"useful, then end the decision with {TRADE_TOOLS}; the market then moves {config.decision_every} "
        f"bar(s). Orders fill at the next open with slippage and a {config.fee_bps / 100:g}% fee. {rules} At "
        f"most {config.max_tool_calls} tool calls per decision, then a penalized forced hold.{reward}\n\n"
        "Each reply: brief reasoning, then exactly one tool call:\n"
        '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n'
        f"Example:\n{reasoning}\n"
        f"<tool_call>{example}</tool_call>\n\n"
        f"Tools:\n{tools}\n\n"
        "Indicators: SMA/EMA = close vs average in %; ATR, MACDh in % of price; BB%B 0 = lower band, "
        "1 = upper; VolZ = volume z-score."
    )


def mandate_rule(config: EnvConfig, *, target_vol: float) -> str:
    """The volatility-target mandate in the agent's words: the target, the sizes and the reward.

    `Mandate: hold a long position whose annualised volatility stays near 40%. size = fraction of equity to
    hold: 0.25, 0.5, 0.75, 1 or 1.5 (above 1 on margin); close_position holds cash. Each decision pays
    -((size × annualised volatility of the next 24 bars - 40%) / 40%)²: cash scores -1.`
    """
    sizes = [f"{size:g}" for size in sorted(config.exposures) if size > 0]
    listed = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}"
    margin = " (above 1 on margin)" if max(config.exposures) > 1 else ""
    target = f"{100 * target_vol:g}%"
    return (
        f"Mandate: hold a long position whose annualised volatility stays near {target}. size = fraction "
        f"of equity to hold: {listed}{margin}; close_position holds cash. Each decision pays -((size × "
        f"annualised volatility of the next {config.decision_every} bars - {target}) / {target})²: cash "
        "scores -1."
    )


def _middle_size(config: EnvConfig) -> float:
    """The example's size: the middle one of the mandate's sizes above 0."""
    sizes = sorted(size for size in config.exposures if size > 0)
    return sizes[(len(sizes) - 1) // 2]


def render_compact_system_prompt(
    registry: ToolRegistry, *, config: EnvConfig, symbol: str, timeframe: str, target_vol: float
) -> str:
    """The full prompt's rules and tool signatures in under half its tokens (244 SmolLM2 tokens against 525
    for `configs/btc_momentum.yaml`): no tool descriptions, no indicator glossary, no worked example.

    Information tools come first, then the trade tools under a heading that says they end the decision. An
    argument that several tools take with the same schema (`view`) is typed where it first appears and named
    alone after that; its meaning is stated once, with the rules.
    """
    info = [tool for tool in registry if not tool.ends_decision]
    trade = [tool for tool in registry if tool.ends_decision]
    typed: dict[str, dict[str, Any]] = {}
    signatures = {tool.name: render_compact_signature(tool.name, tool.parameters, typed) for tool in info + trade}
    shared = _shared_arguments([*info, *trade])
    meanings = "".join(
        f" {arg}: {schema['description']}." for arg, schema in shared.items() if schema.get("description")
    )
    short = "" if config.allow_short else "; no shorting"
    every = config.decision_every
    sizing = (
        mandate_rule(config, target_vol=target_vol) if config.mandate == "vol_target"
        else f"size = equity fraction to hold (max {config.max_position_frac:g}){short}. "
        "stop_loss/take_profit: % from entry."
    )
    lines = [
        f"{symbol} {timeframe} bars. Fills at next open, fee {config.fee_bps / 100:g}%. {sizing}{meanings}",
        'Reason briefly, then one <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
        *(["Info tools:", *(signatures[tool.name] for tool in info)] if info else []),
        f"Trade tools end the decision (max {config.max_tool_calls} calls, else forced hold), then the market "
        f"moves {every} bar{'s' if every > 1 else ''}:",
        *(signatures[tool.name] for tool in trade),
    ]
    return "\n".join(lines)


def render_compact_signature(name: str, parameters: dict[str, Any], typed: dict[str, dict[str, Any]]) -> str:
    """`place_order(side: long|short, size: 0-2, stop_loss?: 0-50, view: bullish|bearish|neutral)`, `hold(view)`.

    `typed` holds the arguments already typed in earlier signatures (updated here): one with the same schema is
    named alone. `?` marks an optional argument.
    """
    required = set(parameters.get("required", ()))
    parts = []
    for arg, schema in parameters.get("properties", {}).items():
        optional = "" if arg in required else "?"
        if typed.get(arg) == schema:
            parts.append(f"{arg}{optional}")
        else:
            typed.setdefault(arg, schema)
            parts.append(f"{arg}{optional}: {_compact_type(schema)}")
    return f"{name}({', '.join(parts)})"


def _compact_type(schema: dict[str, Any]) -> str:
    """As `_render_type`, but a bounded number is its range alone, an integer is `int`, a list's options are
    separated by `|`."""
    if schema.get("type") == "array" and "enum" in schema.get("items", {}):
        return f"list of {'|'.join(schema['items']['enum'])}"
    text = _render_type(schema)
    if schema.get("type") == "integer":
        return "int" + text.removeprefix("integer")
    if schema.get("type") == "number" and text != "number":
        return text.removeprefix("number ")
    return text


def _shared_arguments(tools: Sequence[Tool]) -> dict[str, dict[str, Any]]:
    """Arguments that two or more tools take with the same schema, in first-seen order."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for tool in tools:
        for arg, schema in tool.parameters.get("properties", {}).items():
            seen.setdefault(arg, []).append(schema)
    return {arg: schemas[0] for arg, schemas in seen.items()
            if len(schemas) > 1 and all(schema == schemas[0] for schema in schemas)}


def render_observation(
    replay: MarketReplay,
    portfolio: Portfolio,
    *,
    bar: int,
    decision: int,
    decisions: int,
    config: EnvConfig,
) -> str:
    """What the agent sees at a decision: time, price and recent changes, a few indicators, its portfolio.

    The full style ends with a reminder of the call budget and the trade tools; the compact one leaves that to
    the system prompt, which says both, and shows the position without its units (its fraction of equity says
    how much is held)."""
    compact = config.prompt == "compact"
    text = (
        f"Decision {decision + 1}/{decisions} | {market_text(replay, bar, config)}\n"
        f"{describe_portfolio(portfolio, price=replay.close[bar], units=not compact)}"
    )
    if compact:
        return text
    return f"{text}\nTool calls left: {config.max_tool_calls}. End with {TRADE_TOOLS}."


def market_text(replay: MarketReplay, bar: int, config: EnvConfig) -> str:
    """The market part of an observation, rendered once per bar: time and price, then (observation `full`) the
    recent changes and the `observe_indicators`."""
    price_only = config.observation == "price_only"
    key = (bar, config.decision_every, price_only, *config.observe_indicators)
    text = replay.text_cache.get(key)
    if text is None:
        lines = [f"{replay.decision_labels[bar]} | {replay.symbol} {format_price(replay.close[bar])}"]
        if not price_only:
            lines.append(changes_text(replay, bar, config.decision_every))
            if config.observe_indicators:
                lines.append(" | ".join(replay.feature_text[name][bar] for name in config.observe_indicators))
        text = replay.text_cache[key] = "\n".join(lines)
    return text


def describe_fill(fill: Fill, replay: MarketReplay, *, compact: bool = False) -> str:
    """`Filled buy 0.0445 @ 11050.3, fee 4.92 (2018-03-04 13:00).`

    `compact` leaves out the time of an order's fill: it is always the next open. Stop-loss and take-profit fills
    keep theirs.
    """
    name = _FILL_NAMES[fill.reason]
    when = "" if compact and fill.reason == "order" else f" ({replay.bar_labels[fill.bar]})"
    return (
        f"{name} {fill.side} {format_amount(abs(fill.units))} @ {format_price(fill.price)}, "
        f"fee {fill.fee:.2f}{when}."
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
