"""Read a CSV of candles in whatever common layout it comes, into the canonical schema.

Layouts (`--format`; `auto` tells them apart from the first lines of the file):

- `canonical`: `timestamp,open,high,low,close,volume` with ISO UTC times, as `save_candles` writes it (an
  optional `# {json}` line above the header carries symbol, timeframe and source).
- `cryptodatadownload`: a banner line above the header, newest row first, dates like `2019-10-17 09-AM`,
  volume in the base asset in `Volume BTC` (the plain `Volume` column there is in the quote currency).
- `exchange`: any header with a time column (`timestamp`, `open_time`, `datetime`, `date`, `time`, `unix`,
  `ts`, ...; a separate `date` and clock-time `time` are joined) and open, high, low, close, volume in any
  case or spelling (`Open`, `o`, `openTime`, `Volume (BTC)`); extra columns are ignored.
- `ccxt`: rows `ts, open, high, low, close, volume[, ...]` without a header, as ccxt's `fetch_ohlcv` returns
  them (Binance and Kraken dumps have the same first six columns).

Numeric times are epoch seconds, milliseconds, microseconds or nanoseconds, told apart per value by magnitude;
text times are ISO 8601 (naive ones are taken as UTC, but a file that mixes naive and zoned times is refused)
or CryptoDataDownload's `%Y-%m-%d %I-%p`. Times outside 1677-2262 and a file without rows are errors.

Nothing is repaired: unparseable prices become NaN and out-of-order or duplicate rows stay, for
`validate_candles` to report. The one reordering is of a file that is newest-first throughout, which is
reversed (and said so), as CryptoDataDownload and some exchanges write them.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from r1trade.data.store import (
    COLUMNS,
    check_stated_timeframe,
    check_time_range,
    check_time_zones,
    infer_timeframe,
    make_candles,
)
from r1trade.errors import DataError, UsageError

CSV_FORMATS = ("auto", "canonical", "cryptodatadownload", "exchange", "ccxt")
"""`--format` choices of `r1trade import-csv`."""

TIME_NAMES = (
    "timestamp", "open_time", "opentime", "start_time", "starttime", "datetime", "date_time", "unix",
    "unix_timestamp", "time", "date", "ts", "t", "mts",
)
"""Time column names (after normalising case and separators), most specific first."""

_PRICE_NAMES = {name: (name, name[0], f"{name}_price", f"price_{name}") for name in COLUMNS[:4]}
_VOLUME_NAMES = ("volume", "vol", "v", "base_volume", "volume_base", "volumefrom", "volume_from")
_QUOTE_CURRENCIES = frozenset({
    "usd", "usdt", "usdc", "busd", "fdusd", "tusd", "dai", "eur", "gbp", "jpy", "krw", "try", "aud", "cad",
    "quote", "currency", "to", "notional",
})
"""Suffixes of `volume_<x>` columns counted in the quote currency, never taken as the volume."""
_QUOTES_IN_SYMBOLS = (
    "USDT", "USDC", "BUSD", "FDUSD", "TUSD", "USD", "EUR", "GBP", "JPY", "KRW", "BTC", "ETH",
)
_CDD_TIME = r"\d{4}-\d{2}-\d{2} \d{1,2}-(?:AM|PM)"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
_EPOCH_UNITS = (("s", 1e11), ("ms", 1e14), ("us", 1e17), ("ns", np.inf))
"""Epoch unit by magnitude: seconds below 1e11 (year 5138), milliseconds below 1e14, and so on."""
_EXPECTED = (
    "a time column (timestamp, date, time, datetime, open_time, unix or ts) and open, high, low, close, "
    "volume (any case), or rows of ts, open, high, low, close, volume without a header"
)


@dataclass(frozen=True)
class CsvImport:
    """Imported candles and a one-line account of how the file was read."""

    candles: pd.DataFrame
    layout: str
    description: str


@dataclass(frozen=True)
class _Header:
    """Where the header is and which column plays which role (None: headerless, by position)."""

    layout: str
    skip: int  # lines before the header (or before the first row when headerless)
    header: bool
    roles: dict[str, str | int]  # time, open, high, low, close, volume and optionally date


def normalise(name: str) -> str:
    """`'Open Time'`, `'openTime'`, `'Volume (BTC)'` → `open_time`, `open_time`, `volume_btc`."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name).strip())
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def import_candle_csv(
    path: str | Path, *, fmt: str = "auto", timeframe: str | None = None, symbol: str | None = None
) -> CsvImport:
    """Read the candle CSV at `path` in layout `fmt` (one of `CSV_FORMATS`; `auto` detects it).

    `timeframe` and `symbol` default to what the file says (a canonical file's `#` line, a `symbol` column),
    else the timeframe is inferred from the bar spacing and the symbol is `UNKNOWN`.
    """
    path = Path(path)
    if fmt not in CSV_FORMATS:
        raise UsageError(f"unknown --format '{fmt}': use {', '.join(CSV_FORMATS)}")
    if not path.is_file():
        raise UsageError(f"CSV file not found: '{path}'")
    lines, skip, meta = _first_lines(path)
    if timeframe is None and "timeframe" in meta:
        check_stated_timeframe(meta["timeframe"], path)
    delimiter = max((",", ";", "\t"), key="\n".join(lines[:2]).count)
    rows = [[cell.strip() for cell in next(csv.reader([line], delimiter=delimiter))] for line in lines]
    header = _detect(path, rows, skip, fmt)
    try:
        frame = pd.read_csv(
            path, skiprows=header.skip, header=0 if header.header else None, sep=delimiter, dtype=str,
            skipinitialspace=True, encoding="utf-8-sig",
        )
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read '{path}': {exc}".splitlines()[0]) from None
    if frame.empty:
        raise DataError(f"'{path}' has no candles: a header and no rows")
    frame.columns = [c.strip() if isinstance(c, str) else c for c in frame.columns]
    roles = header.roles
    times, encoding = _parse_times(_time_text(frame, roles), path, roles["time"])
    index = check_time_range(pd.DatetimeIndex(times), path)
    data = pd.DataFrame({c: frame[roles[c]].to_numpy() for c in COLUMNS}, index=index)
    notes = [encoding]
    if header.layout != "ccxt":
        date = f"'{roles['date']}' and " if "date" in roles else ""
        notes.insert(0, f"time from {date}'{roles['time']}'")
        notes.append(f"volume from '{roles['volume']}'")
    if _newest_first(data.index):
        data = data.iloc[::-1]
        notes.append("newest row first, so rows reversed")
    raw_symbol = symbol or meta.get("symbol")
    if raw_symbol is None and "symbol" in roles:
        raw_symbol = _pair(str(frame[roles["symbol"]].iloc[0])) if len(frame) else None
    timeframe = timeframe or meta.get("timeframe") or infer_timeframe(data.index) or "1h"
    name = {"canonical": "canonical CSV", "cryptodatadownload": "CryptoDataDownload export",
            "exchange": "exchange export", "ccxt": "headerless ccxt rows"}[header.layout]
    source = meta.get("source") or (
        f"CryptoDataDownload ({path.name})"
        if header.layout == "cryptodatadownload"
        else f"{path.name} ({name})"
    )
    candles = make_candles(data, symbol=raw_symbol or "UNKNOWN", timeframe=timeframe, source=source)
    return CsvImport(candles=candles, layout=header.layout, description=f"{name}: {'; '.join(notes)}")


def import_cryptodatadownload_csv(path: str | Path, *, timeframe: str = "1h") -> pd.DataFrame:
    """Read a CryptoDataDownload export: a banner line, newest-first rows, dates like `2019-10-17 09-AM`.

    Volume is taken from the base-asset column (`volume_btc`, or `Volume <BASE>`), as ccxt reports it. Other
    layouts, and detecting them: `import_candle_csv`.
    """
    return import_candle_csv(path, fmt="cryptodatadownload", timeframe=timeframe).candles


# --------------------------------------------------------------------------- layout detection


def _first_lines(path: Path, count: int = 3) -> tuple[list[str], int, dict]:
    """The first `count` lines after leading `#` comments and blank lines, how many were skipped, and the
    metadata of a leading `# {json}` line."""
    lines: list[str] = []
    skip, meta = 0, {}
    try:
        with path.open(encoding="utf-8-sig") as handle:
            for line in handle:
                stripped = line.strip()
                if not lines and (not stripped or stripped.startswith("#")):
                    skip += 1
                    if stripped.startswith("#") and not meta:
                        try:
                            parsed = json.loads(stripped[1:])
                        except ValueError:
                            parsed = None
                        meta = parsed if isinstance(parsed, dict) else {}
                    continue
                lines.append(stripped)
                if len(lines) == count:
                    break
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read '{path}': {exc}".splitlines()[0]) from None
    return lines, skip, {k: v for k, v in meta.items() if isinstance(v, str) and v}


def _detect(path: Path, rows: list[list[str]], skip: int, fmt: str) -> _Header:
    """The header for `fmt`, or for the layout the first rows show when `fmt` is `auto`."""
    if not rows:
        raise DataError(f"'{path}' has no rows")
    first, second = rows[0], rows[1] if len(rows) > 1 else None
    if fmt == "ccxt" or (fmt == "auto" and _numeric(first)):
        if len(first) < 6 or not _numeric(first):
            expected = "headerless ccxt rows need ts, open, high, low, close, volume"
            raise UsageError(_undetected(path, first, expected))
        return _Header("ccxt", skip, False, {"time": 0, **{c: i + 1 for i, c in enumerate(COLUMNS)}})
    roles_first = _roles(first)
    roles_second = _roles(second) if second is not None else None
    if fmt == "canonical":
        if [normalise(c) for c in first[:6]] != ["timestamp", *COLUMNS]:
            expected = "the canonical header is timestamp,open,high,low,close,volume"
            raise UsageError(_undetected(path, first, expected))
        return _Header("canonical", skip, True, roles_first)
    banner = roles_first is None and roles_second is not None
    roles, header_row = (roles_second, second) if banner else (roles_first, first)
    if roles is None:
        raise UsageError(_undetected(path, max(rows[:2], key=len), _EXPECTED))
    if fmt == "cryptodatadownload":
        if _base_volume(header_row) is None:
            raise DataError(
                f"'{path}': no base-asset volume column (expected e.g. 'Volume BTC' or volume_btc)"
            )
        return _Header("cryptodatadownload", skip + banner, True, roles)
    if fmt == "auto":
        if banner and _base_volume(header_row) is not None:
            fmt = "cryptodatadownload"
        elif [normalise(c) for c in first] == ["timestamp", *COLUMNS]:
            fmt = "canonical"
        else:
            fmt = "exchange"
    return _Header(fmt, skip + banner, True, roles)


def _roles(cells: list[str]) -> dict[str, str] | None:
    """Column name per role (time, open, high, low, close, volume; date, symbol when present) or None."""
    names = {}
    for cell in cells:
        names.setdefault(normalise(cell), cell)
    time = next((names[n] for n in TIME_NAMES if n in names), None)
    prices = {
        role: next((names[n] for n in aliases if n in names), None) for role, aliases in _PRICE_NAMES.items()
    }
    volume = _base_volume(cells) or next((names[n] for n in _VOLUME_NAMES if n in names), None)
    if time is None or volume is None or None in prices.values():
        return None
    roles = {"time": time, **prices, "volume": volume}
    if normalise(time) == "time" and "date" in names:
        roles["date"] = names["date"]  # joined with the time when the time column holds clock times
    if "symbol" in names:
        roles["symbol"] = names["symbol"]
    return roles


def _base_volume(cells: list[str]) -> str | None:
    """A `volume_<asset>` column in the base asset (`Volume BTC`, `Volume_(BTC)`), not the quote currency."""
    for cell in cells:
        match = re.fullmatch(r"vol(?:ume)?_([a-z0-9]{2,10})", normalise(cell))
        if match and match.group(1) not in _QUOTE_CURRENCIES and match.group(1) != "from":
            return cell
    return None


def _numeric(cells: list[str]) -> bool:
    try:
        [float(cell) for cell in cells]
    except ValueError:
        return False
    return bool(cells)


def _undetected(path: Path, cells: list[str], expected: str) -> str:
    found = ", ".join(cell.strip() for cell in cells) or "none"
    return (
        f"cannot tell the layout of '{path}': found columns {found}; expected {expected} (or pass --format)"
    )


# --------------------------------------------------------------------------- values


def _time_text(frame: pd.DataFrame, roles: dict) -> pd.Series:
    """The time column as text; a clock-time `time` column is joined to the `date` column."""
    text = frame[roles["time"]].str.strip()
    if "date" in roles and len(text) and text.str.fullmatch(_CLOCK, na=False).all():
        text = frame[roles["date"]].str.strip() + " " + text
    return text


def _parse_times(text: pd.Series, path: Path, column: str | int) -> tuple[pd.Series, str]:
    """UTC timestamps from epoch numbers or date text, and a word on the encoding; unreadable values raise."""
    numbers = pd.to_numeric(text, errors="coerce")
    label = f"column {column + 1}" if isinstance(column, int) else f"'{column}'"
    present = text.notna() & (text != "")
    if present.any() and numbers[present].notna().all():
        stamps, encoding = _epoch_times(numbers[present], path, label)
        return _no_missing(stamps.reindex(text.index), text, path, label), encoding
    cdd = text.str.fullmatch(_CDD_TIME, case=False, na=False)
    stamps = pd.to_datetime(text.where(cdd), format="%Y-%m-%d %I-%p", errors="coerce", utc=True)
    rest = stamps.isna() & present
    encoding = "CryptoDataDownload dates"
    if rest.any():
        try:
            parsed = pd.to_datetime(text[rest], format="ISO8601", utc=True)
            encoding = "ISO 8601 times (naive ones as UTC)"
        except (ValueError, TypeError):
            parsed = pd.to_datetime(text[rest], format="mixed", errors="coerce", utc=True)
            encoding = "date text (naive as UTC; a/b/yyyy read month first)"
        stamps = pd.concat([stamps[~rest], parsed]).reindex(text.index)  # concat: the finer unit of the two
    stamps = _no_missing(stamps, text, path, label)
    check_time_zones(text, path)
    return stamps, encoding


def _no_missing(stamps: pd.Series, text: pd.Series, path: Path, label: str) -> pd.Series:
    """`stamps`, or an error naming the first values that gave no time."""
    if stamps.isna().any():
        bad = text[stamps.isna()].fillna("").replace("", "(empty)").head(3).tolist()
        raise DataError(f"'{path}': unreadable times in {label} such as {bad}")
    return stamps


def _epoch_times(numbers: pd.Series, path: Path, label: str) -> tuple[pd.Series, str]:
    """Epoch numbers to UTC times, the unit of each value by its magnitude (s, ms, us, ns)."""
    if numbers.dtype.kind == "f" and (numbers % 1 == 0).all() and numbers.abs().max() < 2**53:
        numbers = numbers.astype("int64")  # exact integer arithmetic: no float rounding off the hour
    magnitude = numbers.abs().astype("float64")
    if (magnitude < 1e8).any():
        example = numbers[magnitude < 1e8].iloc[0]
        raise DataError(
            f"'{path}': numeric times in {label} such as {example} are not epoch seconds, ms, us or ns "
            "(before 1973)"
        )
    pieces, used = [], []
    lower = 0.0
    for unit, upper in _EPOCH_UNITS:
        mask = (magnitude >= lower) & (magnitude < upper)
        lower = upper
        if mask.any():
            try:
                pieces.append(pd.to_datetime(numbers[mask], unit=unit, utc=True))
            except (ValueError, OverflowError) as exc:
                raise DataError(f"'{path}': epoch {unit} times in {label} out of range: {exc}") from None
            used.append(unit)
    return pd.concat(pieces).reindex(numbers.index), f"epoch {' and '.join(used)}"


def _newest_first(index: pd.DatetimeIndex) -> bool:
    """Whether the whole file runs backwards in time (ties allowed), so reversing it reorders nothing else."""
    nanos = index.as_unit("ns").asi8
    deltas = np.diff(nanos)
    return len(deltas) > 0 and bool((deltas <= 0).all()) and bool((deltas < 0).any())


def _pair(raw: str) -> str:
    """`BTCUSD` → `BTC/USD`, `ETH-USDT` → `ETH/USDT`; anything else unchanged."""
    raw = raw.strip()
    if "/" in raw:
        return raw
    if "-" in raw:
        return raw.replace("-", "/", 1)
    for quote in _QUOTES_IN_SYMBOLS:
        if raw.upper().endswith(quote) and len(raw) > len(quote):
            return f"{raw[: -len(quote)]}/{raw[-len(quote):]}"
    return raw
