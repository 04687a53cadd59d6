"""Where a paper run's candles come from: an exchange polled through ccxt, or a candle file replayed.

A feed hands out closed candles only. On an exchange a candle counts as closed once its bar has ended
(open time plus one timeframe) and `grace_seconds` more have passed by the clock, so the still-forming candle
ccxt returns last is never used; one that was returned too early and changes later shows up as a revision.

The exchange feed reads no API key and calls only `load_markets` and `fetch_ohlcv`: no order endpoint, ever.
Transient ccxt errors (network errors, timeouts, rate limits, an exchange down) are retried with backoff for
as long as they last; a rejected symbol or request is a usage error.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import ccxt

from r1trade.data.fetch import call_with_retry, check_symbol, check_timeframe, make_exchange, ohlcv_limit
from r1trade.data.store import load_clean_candles, timeframe_to_timedelta
from r1trade.errors import DataError, UsageError

OVERLAP_BARS = 3
"""Candles before the last one asked for again at every poll, to see revisions of candles already used."""
MAX_REPLAY_PAUSE_SECONDS = 86_400.0
"""The longest wait between two replayed candles `--speed` may ask for (a day)."""
POLL_SECONDS_RANGE = (1.0, 3600.0)
"""`--poll-seconds` from a second (exchanges limit the request rate) to an hour (a late candle is waited for)."""


@dataclass(frozen=True)
class Candle:
    """One closed bar: open time in ms (UTC) and its prices and volume."""

    ts: int
    open: float
    high: float
    low: float
    close: float
    volume: float


@dataclass(frozen=True)
class Batch:
    """Closed candles read at once, oldest first (earlier ones may come again, revised or not), the feed's
    clock (ms) when they were read, and the times of those that came late: due while the feed waited for them,
    they were served well after their close."""

    candles: list[Candle]
    received_at: int
    late: frozenset[int] = frozenset()


class Feed(Protocol):
    """A source of closed candles for one market."""

    source: str
    """What the candles come from, recorded in the journal's identity (`exchange:binance`, `replay`)."""
    symbol: str
    timeframe: str
    rate: float
    """How fast the feed's clock runs against the wall clock (a replay's: its speed; 0 as fast as it can)."""

    def history(self, bars: int) -> Batch:
        """The latest `bars` closed candles, to start a run with the history its first decision needs."""
        ...

    def after(self, ts: int) -> Batch | None:
        """Wait for a closed candle newer than `ts` and return what was read; None when the feed has ended."""
        ...

    def now(self) -> int:
        """The feed's clock in ms (a replay's is the close of its last candle)."""
        ...


def step_ms(timeframe: str) -> int:
    """A timeframe's length in ms."""
    return int(timeframe_to_timedelta(timeframe).total_seconds() * 1000)


class ReplayFeed:
    """A candle file played as if its candles closed one by one: at once, or at `speed` times real time."""

    source = "replay"

    def __init__(
        self, path: Path, *, speed: float | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        candles, _ = load_clean_candles(path)
        self.symbol = str(candles.attrs.get("symbol") or "UNKNOWN")
        self.timeframe = str(candles.attrs.get("timeframe") or "1h")
        self.step = step_ms(self.timeframe)
        stamps = candles.index.as_unit("ms").asi8.tolist()
        self.candles = [Candle(int(ts), *map(float, row)) for ts, row in zip(
            stamps, candles[["open", "high", "low", "close", "volume"]].itertuples(index=False), strict=True
        )]
        self._stamps = [candle.ts for candle in self.candles]
        self.speed, self.sleep, self._clock = speed, sleep, 0
        self.rate = speed or 0.0

    def history(self, bars: int) -> Batch:
        if len(self.candles) <= bars:
            raise DataError(
                f"the replay file has {len(self.candles)} candles: the first decision needs {bars} and one "
                "more"
            )
        return self._hand_out(self.candles[:bars])

    def after(self, ts: int) -> Batch | None:
        index = bisect.bisect_right(self._stamps, ts)
        if index == len(self.candles):
            return None
        if self.speed:
            self.sleep(self.step / 1000 / self.speed)
        return self._hand_out([self.candles[index]])

    def now(self) -> int:
        return self._clock

    def _hand_out(self, candles: list[Candle]) -> Batch:
        self._clock = candles[-1].ts + self.step
        return Batch(candles, received_at=self._clock)


class ExchangeFeed:
    """Closed candles of one market, polled from a ccxt exchange (see the module docstring)."""

    def __init__(
        self,
        exchange: Any,
        symbol: str,
        timeframe: str,
        *,
        poll_seconds: float = 10.0,
        grace_seconds: float = 5.0,
        backoff_seconds: float = 1.0,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        sleep: Callable[[float], None] = time.sleep,
        on_retry: Callable[[str], None] = lambda note: None,
    ) -> None:
        """Check the market and timeframe on the exchange (one-line usage errors for either)."""
        self.exchange, self.symbol, self.timeframe = exchange, symbol, timeframe
        self.source = f"exchange:{exchange.id}"
        self.rate = 1.0
        self.poll_seconds, self.grace_ms = poll_seconds, int(grace_seconds * 1000)
        self.backoff_seconds, self.clock, self.sleep, self.on_retry = backoff_seconds, clock, sleep, on_retry
        check_timeframe(exchange, timeframe)
        self.step = step_ms(timeframe)
        # a candle served later than this after its close, while the feed waited for it, came late
        self.late_after_ms = self.grace_ms + int(2 * poll_seconds * 1000)
        self._call("loading markets", exchange.load_markets)
        check_symbol(exchange, symbol)
        self.limit = ohlcv_limit(exchange, symbol)

    def history(self, bars: int) -> Batch:
        since = self.clock() - (bars + 2) * self.step
        closed: dict[int, Candle] = {}
        while True:
            batch = self._closed(since)
            new = [candle for candle in batch.candles if candle.ts not in closed]
            closed.update((candle.ts, candle) for candle in new)
            if not new:
                break
            since = max(closed) + self.step
        latest = [closed[ts] for ts in sorted(closed)][-bars:]
        if len(latest) < bars:
            raise DataError(
                f"{self.exchange.id} returned {len(latest)} closed {self.symbol} {self.timeframe} candles: "
                f"the first decision needs {bars}"
            )
        return Batch(latest, received_at=batch.received_at)

    def after(self, ts: int) -> Batch:
        asked = self.clock()
        while True:
            batch = self._closed(ts - OVERLAP_BARS * self.step)
            if any(candle.ts > ts for candle in batch.candles):
                late = frozenset(
                    candle.ts for candle in batch.candles
                    if candle.ts > ts and candle.ts + self.step >= asked
                    and batch.received_at - (candle.ts + self.step) > self.late_after_ms
                )
                return Batch(batch.candles, batch.received_at, late)
            due = ts + 2 * self.step + self.grace_ms  # when the next candle should be closed and served
            wait = (due - self.clock()) / 1000
            self.sleep(wait if wait > 0 else self.poll_seconds)

    def now(self) -> int:
        return self.clock()

    def _closed(self, since: int) -> Batch:
        """The closed candles from `since` (one page), never the forming one."""
        rows = self._call(
            f"fetching {self.symbol} {self.timeframe} candles",
            self.exchange.fetch_ohlcv, self.symbol, self.timeframe, since, self.limit,
        )
        now = self.clock()
        candles = [Candle(int(row[0]), *map(float, row[1:6])) for row in rows or []]
        closed = [candle for candle in candles if candle.ts + self.step + self.grace_ms <= now]
        return Batch(sorted(closed, key=lambda candle: candle.ts), received_at=now)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        return call_with_retry(
            self.exchange, what, fn, *args, max_retries=None, backoff_seconds=self.backoff_seconds,
            sleep=self.sleep, on_retry=self.on_retry, user_errors=(ccxt.BadSymbol, ccxt.BadRequest),
        )


def replay_feed(path: Path, *, speed: float | None, symbol: str | None, timeframe: str | None) -> ReplayFeed:
    """The replay of a candle file; `symbol` and `timeframe`, when given, must be the file's. `speed` must be a
    finite number above 0 that waits at most `MAX_REPLAY_PAUSE_SECONDS` between two of the file's candles."""
    if speed is not None and not (math.isfinite(speed) and speed > 0):
        raise UsageError(f"--speed must be a finite number above 0 (times real time), not {speed:g}")
    feed = ReplayFeed(path, speed=speed)
    for flag, asked, held in (("--symbol", symbol, feed.symbol), ("--timeframe", timeframe, feed.timeframe)):
        if asked is not None and asked != held:
            raise UsageError(f"{flag} {asked} differs from the replay file's {held} ('{path}')")
    if speed is not None and feed.step / 1000 / speed > MAX_REPLAY_PAUSE_SECONDS:
        raise UsageError(
            f"--speed {speed:g} would wait {feed.step / 1000 / speed:.3g} s between two {feed.timeframe} candles, "
            f"more than a day: use --speed {feed.step / 1000 / MAX_REPLAY_PAUSE_SECONDS:g} or more"
        )
    return feed


def open_feed(
    *,
    exchange: str | None,
    symbol: str | None,
    timeframe: str | None,
    replay: Path | None,
    speed: float | None,
    poll_seconds: float,
    on_retry: Callable[[str], None],
) -> Feed:
    """The feed the command line asks for: a candle file replayed, or an exchange polled (exactly one)."""
    low, high = POLL_SECONDS_RANGE
    if not (math.isfinite(poll_seconds) and low <= poll_seconds <= high):
        raise UsageError(f"--poll-seconds must be a number from {low:g} to {high:g}, not {poll_seconds:g}")
    if (exchange is None) == (replay is None):
        raise UsageError("give --exchange NAME (live candles) or --replay FILE (a candle file), one of them")
    if replay is not None:
        return replay_feed(replay, speed=speed, symbol=symbol, timeframe=timeframe)
    if speed is not None:
        raise UsageError("--speed paces a --replay; live candles come at the exchange's pace")
    if symbol is None or timeframe is None:
        raise UsageError("--exchange needs --symbol (e.g. BTC/USDT) and --timeframe (e.g. 1h)")
    client = make_exchange(exchange)
    return ExchangeFeed(client, symbol, timeframe, poll_seconds=poll_seconds, on_retry=on_retry)
