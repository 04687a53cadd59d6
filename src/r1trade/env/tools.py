"""Tools the agent can call: a registry of name + JSON schema + handler, and the two toolkits.

`MarketDataToolkit` gives information (candles, indicators, sentiment, optionally changes and volatility) and
never advances the market.
`DexToolkit` gives the portfolio and the trade tools; a trade tool returns an `Order` and ends the decision,
and the environment executes it at the next bar's open. Handlers see the present only (`ToolContext`): the
replay up to the decision bar, the portfolio, the config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from r1trade.env.market import MarketReplay, changes_text, format_amount, format_price
from r1trade.env.portfolio import Portfolio
from r1trade.env.sentiment import sentiment_label
from r1trade.env.volatility import volatility_text

View = Literal["bullish", "bearish", "neutral"]
VIEWS: tuple[View, ...] = ("bullish", "bearish", "neutral")
SENTIMENT_LOOKBACK_BARS = 24


class ToolContext(Protocol):
    """What a handler may read: the market at the decision bar and the portfolio."""

    @property
    def replay(self) -> MarketReplay: ...

    @property
    def bar(self) -> int: ...

    @property
    def portfolio(self) -> Portfolio: ...


@dataclass(frozen=True)
class Order:
    """A trade tool's request: `target` is the signed fraction of equity to hold (None keeps the position)."""

    action: Literal["place_order", "close_position", "hold"]
    view: View
    target: float | None = None
    requested_size: float = 0.0
    clipped: bool = False
    stop_loss_pct: float | None = None
    take_profit_pct: float | None = None


@dataclass(frozen=True)
class ToolResult:
    """A handler's answer: text for the model, whether the tool refused, and an order for trade tools."""

    text: str
    error: bool = False
    order: Order | None = None


Handler = Callable[[dict[str, Any], ToolContext], ToolResult]


@dataclass(frozen=True)
class Tool:
    """One callable tool; `parameters` is the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    ends_decision: bool = False

    def schema(self) -> dict[str, Any]:
        """OpenAI function-calling form."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class ToolRegistry:
    """Tools by name, in registration order (the order the prompt lists them)."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"tool '{tool.name}' registered twice")
            self._tools[tool.name] = tool
        self.parameters = {name: tool.parameters for name, tool in self._tools.items()}

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self):
        return iter(self._tools.values())

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self._tools.values()]


def _object(properties: dict[str, Any] | None = None, required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties or {},
        "required": list(required),
        "additionalProperties": False,
    }


_VIEW = {"type": "string", "enum": list(VIEWS), "description": "your market view for the next bars"}


class MarketDataToolkit:
    """get_candles, get_indicators, get_sentiment, with `changes` (observation `price_only`) get_changes, and
    with `volatility` (`env.volatility_tool`) get_volatility over `volatility_bars` bars."""

    def __init__(
        self, *, indicators: list[str], max_candles: int, changes: bool = False, decision_every: int = 1,
        volatility: bool = False, volatility_bars: int = 24,
    ) -> None:
        self.indicators = list(indicators)
        self.max_candles = max_candles
        self.changes = changes
        self.decision_every = decision_every
        self.volatility = volatility
        self.volatility_bars = volatility_bars

    def tools(self) -> list[Tool]:
        names = {"type": "array", "items": {"type": "string", "enum": self.indicators}, "minItems": 1,
                 "uniqueItems": True, "description": "indicator names; all when omitted"}
        count = {"type": "integer", "minimum": 1, "maximum": self.max_candles,
                 "description": "number of bars"}
        return [
            Tool("get_candles", "Last n bars: time, open, high, low, close, volume.",
                 _object({"n": count}, ("n",)), self._candles),
            Tool("get_indicators", "Indicator values at the current bar.", _object({"names": names}),
                 self._indicators),
            Tool("get_sentiment", "Fear/greed index 0-100 and its source.", _object(),
                 self._sentiment),
            *([Tool("get_changes", "Price change in % over the last 1 bar, decision interval and 6 intervals.",
                    _object(), self._changes)] if self.changes else []),
            *([Tool("get_volatility", "Realised volatility (annualised) and mean true range in % of price, "
                    "to size from risk.", _object(), self._volatility)] if self.volatility else []),
        ]

    def _volatility(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(volatility_text(ctx.replay, ctx.bar, self.volatility_bars))

    def _changes(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(changes_text(ctx.replay, ctx.bar, self.decision_every))

    @staticmethod
    def _candles(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        lines = ctx.replay.candle_lines[max(0, ctx.bar - args["n"] + 1) : ctx.bar + 1]
        return ToolResult(f"Last {len(lines)} bars (time open high low close volume):\n" + "\n".join(lines))

    def _indicators(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        texts = ctx.replay.feature_text
        return ToolResult(" | ".join(texts[name][ctx.bar] for name in args.get("names", self.indicators)))

    @staticmethod
    def _sentiment(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        replay, bar = ctx.replay, ctx.bar
        value = replay.sentiment[bar]
        if math.isnan(value):
            return ToolResult(f"Sentiment: no value yet ({replay.sentiment_source})")
        text = f"Sentiment {value:.0f}/100 {sentiment_label(value)} ({replay.sentiment_source})"
        lookback = SENTIMENT_LOOKBACK_BARS
        before = replay.sentiment[bar - lookback] if bar >= lookback else math.nan
        if not math.isnan(before):
            text += f"; {lookback} bars ago {before:.0f}"
        return ToolResult(text)


class DexToolkit:
    """get_portfolio, place_order, close_position, hold.

    With `exposures` (the volatility-target mandate), place_order holds one of those long sizes and sets no
    stop or take-profit: the mandate is an exposure held over the whole interval, not a trade.
    """

    def __init__(
        self, *, allow_short: bool, max_position_frac: float, max_leverage: float,
        exposures: Sequence[float] | None = None,
    ) -> None:
        self.allow_short = allow_short
        self.max_position_frac = max_position_frac
        self.max_leverage = max_leverage
        self.exposures = None if exposures is None else sorted(size for size in exposures if size > 0)

    def tools(self) -> list[Tool]:
        view_only = _object({"view": _VIEW}, ("view",))
        if self.exposures is None:
            order = self._order_schema()
            what = "Hold size of equity long or short from the next open; sets stop/take."
        else:
            order, what = self._mandate_order_schema(), "Hold size of equity long from the next open."
        return [
            Tool("get_portfolio", "Cash, position, entry, PnL, stops, equity.", _object(), self._portfolio),
            Tool("place_order", what, order, self._place, ends_decision=True),
            Tool("close_position", "Go flat at the next open.", view_only, self._close, ends_decision=True),
            Tool("hold", "Keep the position.", view_only, self._hold,
                 ends_decision=True),
        ]

    def _order_schema(self) -> dict[str, Any]:
        side_note = "" if self.allow_short else " (short is disabled)"
        return _object(
            {
                "side": {"type": "string", "enum": ["long", "short"], "description": f"direction{side_note}"},
                "size": {"type": "number", "exclusiveMinimum": 0, "maximum": self.max_leverage,
                         "description": f"fraction of equity, at most {self.max_position_frac:g}"},
                "stop_loss": {"type": "number", "exclusiveMinimum": 0, "maximum": 50,
                              "description": "% from entry"},
                "take_profit": {"type": "number", "exclusiveMinimum": 0, "maximum": 100,
                                "description": "% from entry"},
                "view": _VIEW,
            },
            ("side", "size", "view"),
        )

    def _mandate_order_schema(self) -> dict[str, Any]:
        return _object(
            {
                "side": {"type": "string", "enum": ["long"], "description": "direction (long only)"},
                "size": {"type": "number", "enum": self.exposures,
                         "description": "fraction of equity to hold"},
                "view": _VIEW,
            },
            ("side", "size", "view"),
        )

    @staticmethod
    def _portfolio(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(describe_portfolio(ctx.portfolio, price=ctx.replay.close[ctx.bar], detailed=True))

    def _place(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if args["side"] == "short" and not self.allow_short:
            return ToolResult(
                "shorting is disabled here: use side \"long\", close_position or hold", error=True
            )
        size = float(args["size"])
        clipped = size > self.max_position_frac
        held = min(size, self.max_position_frac)
        order = Order(
            "place_order",
            args["view"],
            target=held if args["side"] == "long" else -held,
            requested_size=size,
            clipped=clipped,
            stop_loss_pct=args.get("stop_loss"),
            take_profit_pct=args.get("take_profit"),
        )
        note = f" (clipped from {size:g} to the limit {held:g})" if clipped else ""
        return ToolResult(f"Order: {args['side']} {held:g} of equity at the next open{note}.", order=order)

    @staticmethod
    def _close(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        text = "Order: close the position at the next open." if ctx.portfolio.units else "Already flat."
        return ToolResult(text, order=Order("close_position", args["view"], target=0.0))

    @staticmethod
    def _hold(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult("Holding.", order=Order("hold", args["view"]))


def describe_portfolio(portfolio: Portfolio, *, price: float, detailed: bool = False, units: bool = True) -> str:
    """One line: position, entry, unrealized PnL, stops, equity; `detailed` adds cash, realized PnL, fees.

    `units=False` leaves out the units held (the fraction of equity already says how much is held).
    """
    equity = portfolio.equity(price)
    total = (equity / portfolio.initial_cash - 1.0) * 100.0
    if portfolio.units == 0.0:
        text = "Position flat"
    else:
        entry = portfolio.avg_entry
        move = (price / entry - 1.0) * 100.0 * (1 if portfolio.units > 0 else -1)
        held = f"{format_amount(abs(portfolio.units))} units @" if units else "entry"
        text = (
            f"Position {portfolio.direction} {abs(portfolio.exposure(price)):.2f} of equity "
            f"({held} {format_price(entry)}, {move:+.2f}%)"
        )
        stops = [f"SL {format_price(portfolio.stop_price)}" if portfolio.stop_price is not None else "",
                 f"TP {format_price(portfolio.take_price)}" if portfolio.take_price is not None else ""]
        text += "".join(f" {s}" for s in stops if s)
    text += f" | Equity {equity:.2f} ({total:+.2f}%)"
    if detailed:
        text += (
            f" | Cash {portfolio.cash:.2f} | Realized {portfolio.realized_pnl:+.2f}"
            f" | Unrealized {portfolio.unrealized_pnl(price):+.2f} | Fees {portfolio.fees_paid:.2f}"
        )
    return text
