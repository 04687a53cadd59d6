"""What a paper run shows while it runs: a Rich live panel on a terminal, plain lines anywhere else.

The panel (equity, position, the last decision with its reasoning, the time to the next decision) redraws
itself every second, so the countdown moves while the process waits for the exchange. When stdout is not a
terminal (a log file, a pipe, a test) each decision and each network retry is one printed line instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Self

import pandas as pd
from rich.console import Console, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

REASONING_CHARS = 200
"""Characters of a decision's reasoning shown (the journal keeps all of it)."""


@dataclass(frozen=True)
class Status:
    """A paper run at one moment. Times are ms since the epoch, UTC; `now` is the feed's clock."""

    market: str
    equity: float
    initial_cash: float
    exposure: float
    decisions: int
    skipped: int
    max_decisions: int | None
    every: int
    last: tuple[int, str, str] | None
    """The latest decision: when it was taken (its bar's close), what it did and its reasoning."""
    next_close: int | None
    """When the next decision bar closes (None while candles are still being caught up on)."""
    now: int
    rate: float
    """How fast the feed's clock runs against the wall clock (`Feed.rate`), for the countdown."""


def describe_action(order: dict[str, Any] | None, *, forced: bool) -> str:
    """`long 0.5 (bullish)`, `close (neutral)`, `forced hold` from the env's order record."""
    if order is None:
        return "no order"
    if forced:
        return "forced hold"
    view = f" ({order['view']})" if order.get("view") else ""
    if order["action"] == "place_order" and order.get("target") is not None:
        side = "long" if order["target"] > 0 else "short"
        return f"{side} {abs(order['target']):g}{view}"
    return f"{order['action'].replace('_position', '')}{view}"


def reasoning_of(text: str) -> str:
    """The words of a turn before its tool call, on one line and cut to `REASONING_CHARS`."""
    words = " ".join(text.split("<tool_call>", 1)[0].split())
    return words if len(words) <= REASONING_CHARS else words[: REASONING_CHARS - 1] + "…"


def render(status: Status, note: str | None, *, waited: float = 0.0) -> RenderableType:
    """The panel; `waited` seconds of wall time since `status` came move the countdown on (at the feed's
    rate)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    change = 100.0 * (status.equity / status.initial_cash - 1.0)
    grid.add_row("equity", f"{status.equity:,.2f} ({change:+.2f} %)")
    side = "long" if status.exposure > 0 else "short"
    position = "flat" if status.exposure == 0 else f"{side} {abs(status.exposure):.2f} of equity"
    grid.add_row("position", position)
    limit = "" if status.max_decisions is None else f" of {status.max_decisions}"
    settled = f"{status.decisions}{limit} settled, {status.skipped} skipped"
    grid.add_row("decisions", f"{settled}, one every {status.every} bars")
    if status.last is not None:
        ts, action, reasoning = status.last
        grid.add_row("last decision", Text(f"{bar_time(ts)} UTC: {action}"))
        grid.add_row("reasoning", Text(reasoning or "—"))
    if status.next_close is not None:
        left = max((status.next_close - status.now) / 1000 - waited * status.rate, 0.0)
        grid.add_row("next decision", f"at {bar_time(status.next_close)} UTC, in {_duration(left)}")
    if note:
        grid.add_row("network", Text(note))
    title = f"paper trading {status.market} · simulated fills, no real orders"
    return Panel(grid, title=Text(title), title_align="left")


class LiveView:
    """Shows a run's `Status`: a live panel when the console is a terminal, else one line per decision."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._status: Status | None = None
        self._note: str | None = None
        self._since = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> Self:
        if self.console.is_terminal:
            self._live = Live(console=self.console, get_renderable=self._renderable, refresh_per_second=1)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def update(self, status: Status, *, line: str | None = None) -> None:
        """A new status; `line` (a decision) is printed where there is no live panel."""
        self._status, self._since = status, time.monotonic()
        if self._live is None and line:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        """A network retry in progress."""
        self._note = text
        if self._live is None:
            self.console.print(f"network: {text}", markup=False, highlight=False)

    def _renderable(self) -> RenderableType:
        if self._status is None:
            return Text("starting…")
        return render(self._status, self._note, waited=time.monotonic() - self._since)


def bar_time(ts: int) -> str:
    """`2024-01-01 04:00` for a time in ms (UTC)."""
    return f"{pd.Timestamp(ts, unit='ms', tz='UTC'):%Y-%m-%d %H:%M}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"
