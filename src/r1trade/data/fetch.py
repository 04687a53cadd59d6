"""Download candles from an exchange with ccxt into a canonical candle file, resumably and atomically.

ccxt pitfalls handled here: `since` equal to a stored candle's time returns that candle again (we advance
one timeframe past the last candle and deduplicate), the newest candle is still forming (dropped), each
exchange caps the candles per call (we ask for ccxt's own per-call limit), and gaps are normal when nothing
traded (reported by `validate_candles`, never filled).

Writes: `save_candles` replaces the file atomically, after every `checkpoint_every` pages and at the end, so
an interrupted or failed run leaves either the file as it was or a valid file holding everything up to the
last checkpoint; running again resumes from its last candle.
"""

from __future__ import annotations

import difflib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ccxt
import pandas as pd

from r1trade.data.store import (
    ValidationReport,
    candles_from_ohlcv,
    load_candles,
    save_candles,
    timeframe_to_timedelta,
    validate_candles,
)
from r1trade.errors import ExchangeError, R1TradeError, UsageError

DEFAULT_LIMIT = 500
"""Candles per call when ccxt's `features` metadata does not state the exchange's cap."""

MAX_BACKOFF_SECONDS = 60.0
TRANSIENT_ERRORS = (ccxt.NetworkError, ccxt.BadResponse)
"""Worth retrying: timeouts, DDoS protection, rate limits, maintenance, garbled responses."""

T = TypeVar("T")


@dataclass(frozen=True)
class FetchProgress:
    """Where a fetch stands, for a progress bar. Candles are fetched for open times in [start, end)."""

    start: pd.Timestamp
    end: pd.Timestamp
    current: pd.Timestamp
    pages: int
    rows: int
    retry: str | None = None
    """Set while waiting to retry a transient error, e.g. `RequestTimeout, retry 1/5 in 1 s`."""

    @property
    def fraction(self) -> float:
        span = (self.end - self.start).value
        return 1.0 if span <= 0 else min(max((self.current - self.start).value / span, 0.0), 1.0)


@dataclass(frozen=True)
class FetchResult:
    """What a fetch did and what the file now holds; `report` is the validation of the whole file."""

    path: Path
    rows_fetched: int
    """Rows the exchange returned, including duplicates and the forming candle."""
    rows_added: int
    total_rows: int
    first: pd.Timestamp | None
    last: pd.Timestamp | None
    pages: int
    report: ValidationReport


def make_exchange(exchange_id: str, **options: Any) -> ccxt.Exchange:
    """A ccxt exchange with rate limiting on; an unknown id is a usage error naming the closest ccxt ids."""
    name = exchange_id.strip().lower()
    if name not in ccxt.exchanges:
        close = difflib.get_close_matches(name, ccxt.exchanges, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. binance, coinbase, kraken, okx, bybit"
        raise UsageError(f"unknown exchange '{exchange_id}': {hint} (ccxt knows {len(ccxt.exchanges)})")
    return getattr(ccxt, name)({"enableRateLimit": True, **options})


def default_output_path(out_dir: Path, *, exchange_id: str, symbol: str, timeframe: str) -> Path:
    """`out_dir/binance_BTC-USDT_1h.parquet`; characters unsafe in file names (`/`, `:`) become `-`."""
    safe_symbol = re.sub(r"[^A-Za-z0-9.]+", "-", symbol).strip("-")
    return Path(out_dir) / f"{exchange_id}_{safe_symbol}_{timeframe}.parquet"


def ohlcv_limit(exchange: ccxt.Exchange, symbol: str) -> int:
    """The exchange's per-call candle cap for this market, from ccxt's `features` metadata (else 500)."""
    market = (getattr(exchange, "markets", None) or {}).get(symbol) or {}
    features = getattr(exchange, "features", None) or {}
    section = features.get(market.get("type") or "spot") or features.get("spot") or {}
    if "linear" in section or "inverse" in section:
        section = section.get("inverse" if market.get("inverse") else "linear") or {}
    limit = (section.get("fetchOHLCV") or {}).get("limit")
    return int(limit) if limit else DEFAULT_LIMIT


def fetch_to_file(
    exchange: ccxt.Exchange,
    *,
    symbol: str,
    timeframe: str,
    since: pd.Timestamp,
    until: pd.Timestamp | None,
    path: Path,
    progress: Callable[[FetchProgress], None] | None = None,
    max_retries: int = 5,
    backoff_seconds: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], pd.Timestamp] | None = None,
    limit: int | None = None,
    checkpoint_every: int = 20,
) -> FetchResult:
    """Fetch closed candles with open times in [since, until) into `path`, appending to what it already holds.

    An existing file is resumed from its last candle plus one timeframe (an earlier `since` is ignored) and
    must hold the same symbol, timeframe and source. Transient errors are retried `max_retries` times with
    exponential backoff; permanent ones fail at once. `limit` overrides the per-call cap from `ohlcv_limit`;
    `sleep` and `now` are injectable so tests neither wait nor depend on the clock.
    """
    path = Path(path)
    source = f"ccxt:{exchange.id}"
    step = check_timeframe(exchange, timeframe)
    existing = _load_existing(path, symbol=symbol, timeframe=timeframe, source=source)
    since = _utc(since)
    now_ts = _utc(now()) if now is not None else pd.Timestamp.now(tz="UTC")
    end = now_ts if until is None else min(_utc(until), now_ts)
    if until is not None and since >= _utc(until):
        raise UsageError(f"--since {_fmt(since)} must be earlier than --until {_fmt(_utc(until))}")

    step_ms = step.value // 1_000_000
    start_ms = _ms(since) if existing is None else max(_ms(since), _ms(existing.index[-1]) + step_ms)
    # Open times must be before `until`, and a candle is closed once its open time + timeframe <= now.
    stop_ms = min(_ms(end), _ms(now_ts) - step_ms + 1)
    if start_ms >= stop_ms:
        if existing is not None:
            return _result(path, existing, rows_fetched=0, rows_added=0, pages=0)
        raise UsageError(f"no closed {timeframe} candle opens between {_fmt(since)} and {_fmt(end)}")

    start_ts, stop_ts = _ts(start_ms), _ts(stop_ms)

    def report(current_ms: int, pages: int, rows: int, retry: str | None = None) -> None:
        if progress is not None:
            progress(FetchProgress(start_ts, stop_ts, _ts(min(current_ms, stop_ms)), pages, rows, retry))

    def call(what: str, fn: Callable[..., T], *args: Any, state: tuple[int, int, int]) -> T:
        return call_with_retry(
            exchange,
            what,
            fn,
            *args,
            max_retries=max_retries,
            backoff_seconds=backoff_seconds,
            sleep=sleep,
            on_retry=lambda note: report(*state, retry=note),
        )

    call("loading markets", exchange.load_markets, state=(start_ms, 0, 0))
    check_symbol(exchange, symbol)
    per_call = limit or ohlcv_limit(exchange, symbol)
    pause = max(float(getattr(exchange, "rateLimit", 0) or 0), 0.0) / 1000.0

    fetched: dict[int, list[float]] = {}
    cursor, pages, rows_fetched, checkpointed = start_ms, 0, 0, 0
    report(cursor, pages, 0)
    try:
        while cursor < stop_ms:
            if pages and pause:
                sleep(pause)
            page = call(
                f"fetching {symbol} {timeframe} candles",
                exchange.fetch_ohlcv,
                symbol,
                timeframe,
                cursor,
                per_call,
                state=(cursor, pages, len(fetched)),
            )
            pages += 1
            rows_fetched += len(page)
            new = [row for row in page if start_ms <= int(row[0]) < stop_ms and int(row[0]) not in fetched]
            if not new:
                break
            fetched.update((int(row[0]), row) for row in new)
            cursor = max(cursor, max(int(row[0]) for row in new) + step_ms)
            report(cursor, pages, len(fetched))
            if checkpoint_every and pages % checkpoint_every == 0:
                save_candles(
                    _combine(existing, fetched, symbol=symbol, timeframe=timeframe, source=source), path
                )
                checkpointed = len(fetched)
    except R1TradeError as exc:
        if checkpointed:
            raise type(exc)(f"{exc} (kept {checkpointed} new rows in '{path}': run again to resume)") from exc
        raise

    if not fetched:
        if existing is not None:
            return _result(path, existing, rows_fetched=rows_fetched, rows_added=0, pages=pages)
        raise ExchangeError(
            f"{exchange.id} returned no {symbol} {timeframe} candles between {_fmt(start_ts)} and "
            f"{_fmt(end)}: was the market trading then?"
        )
    combined = _combine(existing, fetched, symbol=symbol, timeframe=timeframe, source=source)
    if checkpointed < len(fetched):
        save_candles(combined, path)
    return _result(path, combined, rows_fetched=rows_fetched, rows_added=len(fetched), pages=pages)


# --------------------------------------------------------------------------- helpers


def _utc(ts: pd.Timestamp | str) -> pd.Timestamp:
    """A tz-aware UTC timestamp; naive times are taken as UTC."""
    ts = pd.Timestamp(ts)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _fmt(ts: pd.Timestamp) -> str:
    return f"{ts:%Y-%m-%d %H:%M}"


def _ms(ts: pd.Timestamp) -> int:
    return ts.as_unit("ns").value // 1_000_000


def _ts(ms: int) -> pd.Timestamp:
    return pd.Timestamp(ms, unit="ms", tz="UTC")


def _first_line(exc: BaseException, width: int = 200) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def call_with_retry(
    exchange: ccxt.Exchange,
    what: str,
    fn: Callable[..., T],
    *args: Any,
    max_retries: int | None,
    backoff_seconds: float,
    sleep: Callable[[float], None],
    on_retry: Callable[[str], None],
    user_errors: tuple[type[ccxt.BaseError], ...] = (ccxt.BadSymbol,),
) -> T:
    """Call `fn(*args)`, retrying transient ccxt errors after `backoff_seconds * 2**k` (at most 60 s), at most
    `max_retries` times (None: until it succeeds, for a process that must outlive an outage).

    `user_errors` (by default a rejected symbol) become a UsageError, any other ccxt error an ExchangeError,
    each a single line.
    """
    attempt = 0
    while True:
        try:
            return fn(*args)
        except user_errors as exc:
            rejected = "symbol" if isinstance(exc, ccxt.BadSymbol) else "request"
            raise UsageError(f"{exchange.id} rejected the {rejected} while {what}: {_first_line(exc)}") from exc
        except TRANSIENT_ERRORS as exc:
            if max_retries is not None and attempt >= max_retries:
                raise ExchangeError(
                    f"cannot reach {exchange.id} while {what} after {attempt + 1} attempt(s) "
                    f"({type(exc).__name__}: {_first_line(exc)}); check your connection and try again"
                ) from exc
            delay = min(backoff_seconds * 2 ** min(attempt, 16), MAX_BACKOFF_SECONDS)
            attempt += 1
            limit = "" if max_retries is None else f"/{max_retries}"
            on_retry(f"{type(exc).__name__}, retry {attempt}{limit} in {delay:g} s")
            sleep(delay)
        except ccxt.BaseError as exc:
            raise ExchangeError(
                f"{exchange.id} refused {what}: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc


def _storable(timeframe: str) -> bool:
    """Whether the candle store handles this timeframe (fixed-length minutes, hours, days or weeks)."""
    try:
        timeframe_to_timedelta(timeframe)
    except UsageError:
        return False
    return True


def check_timeframe(exchange: ccxt.Exchange, timeframe: str) -> pd.Timedelta:
    """The timeframe's length, or a UsageError listing those the exchange offers and the store can hold."""
    if not (getattr(exchange, "has", None) or {}).get("fetchOHLCV"):
        raise UsageError(
            f"{exchange.id} does not provide candles (no fetchOHLCV in ccxt); choose another exchange"
        )
    offered = list(getattr(exchange, "timeframes", None) or {})
    usable = [tf for tf in offered if _storable(tf)]
    if timeframe not in offered:
        raise UsageError(f"{exchange.id} has no '{timeframe}' candles; use one of {', '.join(usable)}")
    if timeframe not in usable:
        raise UsageError(
            f"'{timeframe}' candles cannot be stored (minutes, hours, days or weeks only); "
            f"use one of {', '.join(usable)}"
        )
    return timeframe_to_timedelta(timeframe)


def check_symbol(exchange: ccxt.Exchange, symbol: str) -> None:
    """A UsageError naming the closest market symbols when the exchange does not list `symbol`."""
    symbols = list(getattr(exchange, "symbols", None) or (getattr(exchange, "markets", None) or {}))
    if symbol in symbols:
        return
    close = difflib.get_close_matches(symbol.upper(), symbols, n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"e.g. {', '.join(symbols[:5])}"
    raise UsageError(
        f"{exchange.id} has no market '{symbol}'; {hint} ({len(symbols)} markets, unified 'BASE/QUOTE' form)"
    )


def _load_existing(path: Path, *, symbol: str, timeframe: str, source: str) -> pd.DataFrame | None:
    """The candles in `path` (None if absent or empty); refuses another symbol, timeframe or source."""
    if not path.exists():
        return None
    existing = load_candles(path)
    for key, wanted in (("symbol", symbol), ("timeframe", timeframe), ("source", source)):
        held = existing.attrs.get(key)
        if held != wanted:
            raise UsageError(
                f"'{path}' holds {key} '{held}', not '{wanted}': appending would mix data; "
                "choose another output path"
            )
    return existing if len(existing) else None


def _combine(
    existing: pd.DataFrame | None,
    fetched: dict[int, list[float]],
    *,
    symbol: str,
    timeframe: str,
    source: str,
) -> pd.DataFrame:
    """Existing candles, then the fetched ones in time order (all fetched rows open after the existing)."""
    new = candles_from_ohlcv(
        [list(fetched[ts]) for ts in sorted(fetched)], symbol=symbol, timeframe=timeframe, source=source
    )
    combined = new if existing is None else pd.concat([existing, new])
    combined.attrs = {"symbol": symbol, "timeframe": timeframe, "source": source}
    return combined


def _result(
    path: Path, candles: pd.DataFrame, *, rows_fetched: int, rows_added: int, pages: int
) -> FetchResult:
    return FetchResult(
        path=path,
        rows_fetched=rows_fetched,
        rows_added=rows_added,
        total_rows=len(candles),
        first=candles.index[0] if len(candles) else None,
        last=candles.index[-1] if len(candles) else None,
        pages=pages,
        report=validate_candles(candles),
    )
