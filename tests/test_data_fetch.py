"""`fetch_to_file` against a fake ccxt exchange: paging, ccxt's pitfalls, retries, atomic resumable writes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ccxt
import numpy as np
import pandas as pd
import pytest

from r1trade.data.fetch import (
    DEFAULT_LIMIT,
    FetchProgress,
    FetchResult,
    default_output_path,
    fetch_to_file,
    make_exchange,
    ohlcv_limit,
)
from r1trade.data.store import load_candles
from r1trade.errors import ExchangeError, UsageError

HOUR_MS = 3_600_000
T0 = pd.Timestamp("2024-01-01", tz="UTC")
T0_MS = T0.value // 1_000_000
SYMBOLS = ("BTC/USDT", "ETH/USDT", "ETH/BTC", "SOL/USDT")


def hours(n: float) -> pd.Timestamp:
    return T0 + pd.Timedelta(hours=n)


def synthetic_rows(n: int, *, missing: frozenset[int] | set[int] = frozenset()) -> list[list[float]]:
    """`n` hourly ccxt rows from T0 (a seeded random walk), leaving out the bar numbers in `missing`."""
    closes = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.01, n)))
    rows = []
    for i in range(n):
        if i in missing:
            continue
        open_ = float(closes[i - 1]) if i else 100.0
        close = float(closes[i])
        rows.append(
            [T0_MS + i * HOUR_MS, open_, max(open_, close) * 1.001, min(open_, close) * 0.999, close, 1.0 + i]
        )
    return rows


class FakeExchange:
    """A ccxt-like exchange serving `rows` from `since`, at most `cap` per call, that can inject failures.

    `overlap` also serves that many candles before `since` (an exchange repeating the `since` candle);
    `failures` maps a fetch_ohlcv call number to the exception raised instead of serving it.
    """

    id = "fakex"
    parse_timeframe = staticmethod(ccxt.Exchange.parse_timeframe)

    def __init__(
        self,
        rows: list[list[float]],
        *,
        cap: int = 5,
        overlap: int = 0,
        rate_limit: float = 0,
        failures: dict[int, Exception] | None = None,
    ) -> None:
        self.rows = rows
        self.cap = cap
        self.overlap = overlap
        self.rateLimit = rate_limit
        self.has = {"fetchOHLCV": True}
        self.timeframes = {"1m": "1m", "5m": "5m", "1h": "1h", "1d": "1d", "1M": "1M"}
        self.failures = failures or {}
        self.features = {"spot": {"fetchOHLCV": {"limit": cap}}}
        self.markets: dict[str, dict[str, str]] = {}
        self.symbols: list[str] = []
        self.requests: list[tuple[int, int]] = []  # (since, limit) of every fetch_ohlcv call

    def load_markets(self) -> dict[str, dict[str, str]]:
        self.markets = {symbol: {"symbol": symbol, "type": "spot"} for symbol in SYMBOLS}
        self.symbols = sorted(self.markets)
        return self.markets

    def fetch_ohlcv(
        self, symbol: str, timeframe: str = "1m", since: int | None = None, limit: int | None = None
    ) -> list[list[float]]:
        call = len(self.requests)
        self.requests.append((since, limit))
        if call in self.failures:
            raise self.failures[call]
        first = next((i for i, row in enumerate(self.rows) if row[0] >= since), len(self.rows))
        first = max(first - self.overlap, 0)
        return [list(row) for row in self.rows[first : first + min(limit, self.cap)]]


class Sleeps(list):
    """Records the delays a fetch asks to sleep, without sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def fetch(
    exchange: FakeExchange,
    path: Path,
    *,
    now: pd.Timestamp,
    symbol: str = "BTC/USDT",
    timeframe: str = "1h",
    since: pd.Timestamp = T0,
    until: pd.Timestamp | None = None,
    **options: Any,
) -> FetchResult:
    """fetch_to_file with a fixed clock and, unless given, a recording sleep."""
    options.setdefault("sleep", Sleeps())
    return fetch_to_file(
        exchange,
        symbol=symbol,
        timeframe=timeframe,
        since=since,
        until=until,
        path=path,
        now=lambda: now,
        **options,
    )


# 23 closed hourly candles (bars 0..22) and bar 23 still forming at 23:30.
ROWS = synthetic_rows(24)
NOW = hours(23.5)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "fakex_BTC-USDT_1h.parquet"


def test_pages_forward_one_timeframe_past_the_last_candle(path: Path) -> None:
    exchange = FakeExchange(ROWS, cap=5)
    result = fetch(exchange, path, now=NOW)

    assert [since for since, _ in exchange.requests] == [T0_MS + k * 5 * HOUR_MS for k in range(5)]
    assert all(limit == 5 for _, limit in exchange.requests)  # the cap from the exchange's features
    assert (result.pages, result.rows_fetched, result.rows_added, result.total_rows) == (5, 24, 23, 23)
    assert (result.first, result.last) == (T0, hours(22))
    assert result.report.ok and result.report.gaps.count == 0

    stored = load_candles(path)
    assert stored.attrs == {"symbol": "BTC/USDT", "timeframe": "1h", "source": "ccxt:fakex"}
    expected = np.array([row[1:] for row in ROWS[:23]])
    np.testing.assert_array_equal(stored.to_numpy(), expected)


def test_duplicates_at_page_edges_are_dropped(path: Path) -> None:
    exchange = FakeExchange(ROWS, cap=5, overlap=1)  # every page repeats the candle before `since`
    result = fetch(exchange, path, now=NOW)

    stored = load_candles(path)
    assert stored.index.is_unique and stored.index.is_monotonic_increasing
    assert result.total_rows == 23 and result.rows_fetched > result.rows_added == 23
    assert result.report.ok


def test_gaps_are_reported_not_filled(path: Path) -> None:
    missing = set(range(5, 13)) | {17}  # a gap longer than a page, and a single missing bar
    result = fetch(FakeExchange(synthetic_rows(24, missing=missing), cap=5), path, now=NOW)

    assert result.total_rows == 23 - len(missing)
    gaps = result.report.gaps
    assert (gaps.count, gaps.largest_bars, gaps.missing_bars) == (2, 8, 9)
    assert result.report.ok  # gaps are normal, not errors


@pytest.mark.parametrize(
    ("now", "last"),
    [(hours(23), hours(22)), (hours(23.5), hours(22)), (hours(24), hours(23))],
)
def test_the_forming_candle_is_dropped(path: Path, now: pd.Timestamp, last: pd.Timestamp) -> None:
    # Bar 23 opens at 23:00 and closes at 24:00: it is kept only once `now` reaches 24:00.
    result = fetch(FakeExchange(synthetic_rows(25), cap=5), path, now=now)
    assert result.last == last
    assert load_candles(path).index[-1] == last


def test_until_is_respected(path: Path) -> None:
    exchange = FakeExchange(ROWS, cap=5)
    result = fetch(exchange, path, now=NOW, until=hours(7))

    assert result.last == hours(6)  # open times before `until`
    assert [since for since, _ in exchange.requests] == [T0_MS, T0_MS + 5 * HOUR_MS]


@pytest.mark.parametrize(
    ("errors", "backoff", "sleeps"),
    [
        ([ccxt.NetworkError("reset"), ccxt.RequestTimeout("timed out")], 1.0, [1.0, 2.0]),
        ([ccxt.NetworkError("reset"), ccxt.RequestTimeout("timed out")], 0.5, [0.5, 1.0]),
        (
            [
                ccxt.DDoSProtection("x"),
                ccxt.RateLimitExceeded("x"),
                ccxt.ExchangeNotAvailable("x"),
                ccxt.BadResponse("x"),
            ],
            1.0,
            [1.0, 2.0, 4.0, 8.0],
        ),
    ],
)
def test_transient_failures_are_retried_with_exponential_backoff(
    path: Path, errors: list[Exception], backoff: float, sleeps: list[float]
) -> None:
    exchange = FakeExchange(ROWS, cap=5, failures={1 + i: error for i, error in enumerate(errors)})
    recorded, seen = Sleeps(), []
    result = fetch(exchange, path, now=NOW, sleep=recorded, backoff_seconds=backoff, progress=seen.append)

    assert recorded == sleeps
    retried = [since for since, _ in exchange.requests[1 : 2 + len(errors)]]
    assert retried == [T0_MS + 5 * HOUR_MS] * (len(errors) + 1)  # the same page, asked again
    assert result.total_rows == 23 and result.report.ok
    notes = [p.retry for p in seen if p.retry]
    assert notes[0] == f"{type(errors[0]).__name__}, retry 1/5 in {sleeps[0]:g} s"


def test_rate_limit_pauses_between_calls(path: Path) -> None:
    exchange = FakeExchange(ROWS, cap=5, rate_limit=250)
    recorded = Sleeps()
    result = fetch(exchange, path, now=NOW, sleep=recorded)
    assert recorded == [0.25] * (result.pages - 1)


def test_progress_reports_each_page(path: Path) -> None:
    seen: list[FetchProgress] = []
    fetch(FakeExchange(ROWS, cap=5), path, now=NOW, progress=seen.append)

    assert [p.pages for p in seen] == [0, 1, 2, 3, 4, 5]
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert seen[-1].rows == 23


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (ccxt.BadSymbol("binance {'code': -1121, 'msg': 'Invalid symbol.'}"), UsageError),
        (ccxt.BadRequest("bad request"), ExchangeError),
        (ccxt.AuthenticationError("key required"), ExchangeError),
        (ccxt.NotSupported("no candles"), ExchangeError),
        (ccxt.ExchangeError("something\nelse"), ExchangeError),
    ],
)
def test_permanent_failure_fails_at_once_and_keeps_the_file(
    path: Path, error: Exception, raised: type[Exception]
) -> None:
    fetch(FakeExchange(ROWS, cap=5), path, now=hours(10.5))
    before = path.read_bytes()

    exchange = FakeExchange(ROWS, cap=5, failures={0: error})
    recorded = Sleeps()
    with pytest.raises(raised) as caught:
        fetch(exchange, path, now=NOW, sleep=recorded)

    assert len(exchange.requests) == 1 and recorded == []
    assert path.read_bytes() == before
    message = str(caught.value)
    assert "fakex" in message and "\n" not in message


def test_transient_failures_beyond_max_retries_keep_the_file(path: Path) -> None:
    fetch(FakeExchange(ROWS, cap=5), path, now=hours(3.5))
    before = path.read_bytes()

    # Two pages succeed, then every call times out: nothing fetched may reach the file.
    failures = {call: ccxt.RequestTimeout("fakex GET /klines timed out") for call in range(2, 20)}
    exchange = FakeExchange(ROWS, cap=5, failures=failures)
    recorded = Sleeps()
    with pytest.raises(ExchangeError) as caught:
        fetch(exchange, path, now=NOW, sleep=recorded, max_retries=3)

    assert len(exchange.requests) == 2 + 4 and recorded == [1.0, 2.0, 4.0]
    assert path.read_bytes() == before
    message = str(caught.value)
    assert message.startswith("cannot reach fakex while fetching BTC/USDT 1h candles after 4 attempt(s)")
    assert "check your connection" in message and "\n" not in message


def test_resume_appends_only_new_rows(path: Path, tmp_path: Path) -> None:
    fetch(FakeExchange(ROWS, cap=5), path, now=hours(10.5))
    first = load_candles(path)
    assert first.index[-1] == hours(9)

    exchange = FakeExchange(ROWS, cap=5)
    result = fetch(exchange, path, now=NOW, since=T0)  # an earlier `since` is ignored

    assert exchange.requests[0][0] == T0_MS + 10 * HOUR_MS  # one timeframe after the stored last candle
    assert (result.rows_added, result.total_rows, result.last) == (13, 23, hours(22))
    resumed = load_candles(path)
    pd.testing.assert_frame_equal(resumed.iloc[:10], first)
    fetch(FakeExchange(ROWS, cap=5), tmp_path / "whole.parquet", now=NOW)
    pd.testing.assert_frame_equal(resumed, load_candles(tmp_path / "whole.parquet"))


def test_an_up_to_date_file_is_left_alone(path: Path) -> None:
    fetch(FakeExchange(ROWS, cap=5), path, now=NOW)
    before = path.read_bytes()

    exchange = FakeExchange(ROWS, cap=5)
    result = fetch(exchange, path, now=NOW)

    assert exchange.requests == [] and result.rows_added == 0 and result.total_rows == 23
    assert path.read_bytes() == before


def test_checkpoints_keep_progress_through_a_failure(path: Path, tmp_path: Path) -> None:
    exchange = FakeExchange(ROWS, cap=5, failures={3: ccxt.ExchangeError("boom")})
    with pytest.raises(ExchangeError, match=r"kept 10 new rows in .*run again to resume"):
        fetch(exchange, path, now=NOW, checkpoint_every=2)

    kept = load_candles(path)
    assert len(kept) == 10 and kept.index[-1] == hours(9)

    exchange = FakeExchange(ROWS, cap=5)
    fetch(exchange, path, now=NOW, checkpoint_every=2)
    assert exchange.requests[0][0] == T0_MS + 10 * HOUR_MS
    fetch(FakeExchange(ROWS, cap=5), tmp_path / "whole.parquet", now=NOW)
    pd.testing.assert_frame_equal(load_candles(path), load_candles(tmp_path / "whole.parquet"))


@pytest.mark.parametrize(
    ("symbol", "timeframe", "key"), [("ETH/USDT", "1h", "symbol"), ("BTC/USDT", "1d", "timeframe")]
)
def test_appending_other_data_to_a_file_is_refused(path: Path, symbol: str, timeframe: str, key: str) -> None:
    fetch(FakeExchange(ROWS, cap=5), path, now=NOW)
    before = path.read_bytes()

    exchange = FakeExchange(ROWS, cap=5)
    with pytest.raises(UsageError, match=f"holds {key}"):
        fetch(exchange, path, now=NOW, symbol=symbol, timeframe=timeframe)
    assert exchange.requests == [] and path.read_bytes() == before


def test_bad_timeframe_lists_the_valid_ones(path: Path) -> None:
    exchange = FakeExchange(ROWS)
    with pytest.raises(UsageError, match=r"fakex has no '2h' candles; use one of 1m, 5m, 1h, 1d$"):
        fetch(exchange, path, now=NOW, timeframe="2h")
    with pytest.raises(UsageError, match=r"'1M' candles cannot be stored .*use one of 1m, 5m, 1h, 1d$"):
        fetch(exchange, path, now=NOW, timeframe="1M")
    assert exchange.requests == [] and not path.exists()


@pytest.mark.parametrize("symbol", ["BTC/USDX", "btcusdt", "BTC-USDT"])
def test_bad_symbol_names_the_closest_markets(path: Path, symbol: str) -> None:
    exchange = FakeExchange(ROWS)
    with pytest.raises(UsageError, match=rf"fakex has no market '{symbol}'; closest: BTC/USDT"):
        fetch(exchange, path, now=NOW, symbol=symbol)
    assert exchange.requests == [] and not path.exists()


def test_an_exchange_without_candles_is_refused(path: Path) -> None:
    exchange = FakeExchange(ROWS)
    exchange.has = {"fetchOHLCV": False}
    with pytest.raises(UsageError, match="fakex does not provide candles"):
        fetch(exchange, path, now=NOW)


def test_empty_ranges_are_clear_errors(path: Path) -> None:
    with pytest.raises(UsageError, match="must be earlier than --until"):
        fetch(FakeExchange(ROWS), path, now=NOW, since=hours(5), until=hours(5))
    with pytest.raises(ExchangeError, match="returned no BTC/USDT 1h candles"):
        fetch(FakeExchange([]), path, now=NOW)
    assert not path.exists()


def test_unknown_exchange_suggests_close_ids() -> None:
    with pytest.raises(UsageError, match=r"unknown exchange 'binanse': did you mean binance") as caught:
        make_exchange("binanse")
    assert "\n" not in str(caught.value)
    exchange = make_exchange("Binance", timeout=1234)
    assert isinstance(exchange, ccxt.binance) and exchange.enableRateLimit and exchange.timeout == 1234


@pytest.mark.parametrize(
    ("exchange_id", "limit"),
    [("binance", 1000), ("okx", 300), ("coinbase", 300), ("kraken", 720), ("bybit", 1000)],
)
def test_per_call_limit_comes_from_ccxt_features(exchange_id: str, limit: int) -> None:
    assert ohlcv_limit(getattr(ccxt, exchange_id)(), "BTC/USDT") == limit


def test_per_call_limit_defaults_when_unknown() -> None:
    assert ohlcv_limit(SimpleNamespace(markets={}, features=None), "BTC/USDT") == DEFAULT_LIMIT


def test_default_output_path() -> None:
    out = Path("data/raw")
    assert default_output_path(out, exchange_id="binance", symbol="BTC/USDT", timeframe="1h") == (
        out / "binance_BTC-USDT_1h.parquet"
    )
    assert default_output_path(out, exchange_id="okx", symbol="BTC/USDT:USDT", timeframe="4h").name == (
        "okx_BTC-USDT-USDT_4h.parquet"
    )


def test_real_exchange_offline_gives_a_clean_error(tmp_path: Path) -> None:
    exchange = make_exchange("binance", timeout=1000)
    path = tmp_path / "binance_BTC-USDT_1h.parquet"
    try:
        fetch_to_file(
            exchange,
            symbol="BTC/USDT",
            timeframe="1h",
            since=T0,
            until=hours(3),
            path=path,
            max_retries=1,
            sleep=lambda _: None,
        )
    except ExchangeError as exc:
        message = str(exc)
        assert message.startswith("cannot reach binance while loading markets after 2 attempt(s)")
        assert "check your connection" in message and "\n" not in message
        assert not path.exists()
    else:
        pytest.skip("binance is reachable from here: the offline failure cannot be exercised")
