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
or CryptoDataDownload's `%Y-%m-%d %I-%p`. Dates like `03/04/2024` are read day first and month first: an order
that gives an impossible date (a month above 12) is ruled out, else the one that spaces the bars regularly is
taken (and said so); when neither is more regular the file is refused until `--date-format` names the order.
Times outside 1677-2262 and a file without rows are errors.

The header and every line are bounded (`csv_bounds`) before pandas parses the file, and only the columns used are
read, by position (pandas renames repeated names in quadratic time).

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

from r1trade.data.csv_bounds import bounded_lines, check_columns, check_line_lengths
from r1trade.data.store import (
    COLUMNS,
    check_stated_timeframe,
    check_time_range,
    check_time_zones,
    infer_timeframe,
    make_candles,
)
from r1trade.errors import DataError, UsageError, clip

CSV_FORMATS = ("auto", "canonical", "cryptodatadownload", "exchange", "ccxt")
"""`--format` choices of `r1trade import-csv`."""

TIME_NAMES = (
    "timestamp", "open_time", "opentime", "start_time", "starttime", "datetime", "date_time", "unix",
    "unix_timestamp", "time", "date", "ts", "t", "mts",
)
"""Time column names (after normalising case and separators), most specific first."""

_PRICE_NAMES = {name: (name, name[0], f"{name}_price", f"price_{name}") for name in COLUMNS[:4]}
_VOLUME_NAMES = ("volume", "vol", "v", "base_volume", "volume_base", "volumefrom", "volume_from")
_DATE_QUOTED = 40
"""Characters of a date an error quotes."""
_QUOTE_CURRENCIES = frozenset({
    "usd", "usdt", "usdc", "busd", "fdusd", "tusd", "dai", "eur", "gbp", "jpy", "krw", "try", "aud", "cad",
    "quote", "currency", "to", "notional",
})
"""Suffixes of `volume_<x>` columns counted in the quote currency, never taken as the volume."""
_QUOTES_IN_SYMBOLS = (
    "USDT", "USDC", "BUSD", "FDUSD", "TUSD", "USD", "EUR", "GBP", "JPY", "KRW", "BTC", "ETH",
)
_CDD_TIME = r"\d{4}-\d{2}-\d{2} \d{1,2}-(?:AM|PM)"
_SLASHED_DATE = r"^(\d{1,2})([/.\-])(\d{1,2})\2(\d{4})(.*)$"
"""`03/04/2024 10:00`, `3.4.2024`, `03-04-2024T10:00Z`: day and month in an order the text does not tell."""
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
    cells: tuple[str, ...] = ()  # the header's names, stripped (none when headerless)

    def positions(self) -> dict[str, int]:
        """The column number of each role (a repeated name: its first column)."""
        return {
            role: column if isinstance(column, int) else self.cells.index(column)
            for role, column in self.roles.items()
        }


def normalise(name: str) -> str:
    """`'Open Time'`, `'openTime'`, `'Volume (BTC)'` → `open_time`, `open_time`, `volume_btc`."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name).strip())
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def import_candle_csv(
    path: str | Path,
    *,
    fmt: str = "auto",
    timeframe: str | None = None,
    symbol: str | None = None,
    date_format: str | None = None,
) -> CsvImport:
    """Read the candle CSV at `path` in layout `fmt` (one of `CSV_FORMATS`; `auto` detects it).

    `timeframe` and `symbol` default to what the file says (a canonical file's `#` line, a `symbol` column),
    else the timeframe is inferred from the bar spacing and the symbol is `UNKNOWN`. `date_format` (strftime
    codes, e.g. `%d/%m/%Y %H:%M`) reads every time with it, in place of detecting the encoding.
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
    for row in rows:
        check_columns(row, path)
    header = _detect(path, rows, skip, fmt)
    check_line_lengths(path)
    frame = _read_roles(path, header, delimiter)
    roles = header.roles
    times, encoding = _parse_times(_time_text(frame), path, roles["time"], date_format=date_format)
    index = check_time_range(pd.DatetimeIndex(times), path)
    data = pd.DataFrame({c: frame[c].to_numpy() for c in COLUMNS}, index=index)
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
        raw_symbol = _pair(str(frame["symbol"].iloc[0])) if len(frame) else None
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


# --------------------------------------------------------------------------- layout detection


def _first_lines(path: Path, count: int = 3) -> tuple[list[str], int, dict]:
    """The first `count` lines after leading `#` comments and blank lines, how many were skipped, and the
    metadata of a leading `# {json}` line."""
    lines: list[str] = []
    skip, meta = 0, {}
    try:
        with path.open(encoding="utf-8-sig") as handle:
            for line in bounded_lines(handle, path):
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
        return _Header("canonical", skip, True, roles_first, tuple(first))
    banner = roles_first is None and roles_second is not None
    roles, header_row = (roles_second, second) if banner else (roles_first, first)
    if roles is None:
        raise UsageError(_undetected(path, max(rows[:2], key=len), _EXPECTED))
    if fmt == "cryptodatadownload":
        if _base_volume(header_row) is None:
            raise DataError(
                f"'{path}': no base-asset volume column (expected e.g. 'Volume BTC' or volume_btc)"
            )
        return _Header("cryptodatadownload", skip + banner, True, roles, tuple(header_row))
    if fmt == "auto":
        if banner and _base_volume(header_row) is not None:
            fmt = "cryptodatadownload"
        elif [normalise(c) for c in first] == ["timestamp", *COLUMNS]:
            fmt = "canonical"
        else:
            fmt = "exchange"
    return _Header(fmt, skip + banner, True, roles, tuple(header_row))


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


def _read_roles(path: Path, header: _Header, delimiter: str) -> pd.DataFrame:
    """The rows of the columns that play a role, as text, one frame column per role (`time`, `open`, ...).

    The columns are read by position below the header, so a header that repeats a name costs nothing."""
    positions = header.positions()
    try:
        frame = pd.read_csv(
            path, skiprows=header.skip + header.header, header=None, usecols=sorted(set(positions.values())),
            sep=delimiter, dtype=str, skipinitialspace=True, encoding="utf-8-sig",
        )
    except pd.errors.EmptyDataError:
        frame = pd.DataFrame()
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read '{path}': {exc}".splitlines()[0]) from None
    if frame.empty:
        raise DataError(f"'{path}' has no candles: a header and no rows")
    return pd.DataFrame({role: frame[column] for role, column in positions.items()})


def _time_text(frame: pd.DataFrame) -> pd.Series:
    """The time column as text; a clock-time `time` column is joined to the `date` column."""
    text = frame["time"].str.strip()
    if "date" in frame and len(text) and text.str.fullmatch(_CLOCK, na=False).all():
        text = frame["date"].str.strip() + " " + text
    return text


def _parse_times(
    text: pd.Series, path: Path, column: str | int, *, date_format: str | None = None
) -> tuple[pd.Series, str]:
    """UTC timestamps from epoch numbers or date text (or text in `date_format`), and a word on the encoding;
    unreadable values raise."""
    label = f"column {column + 1}" if isinstance(column, int) else f"'{column}'"
    present = text.notna() & (text != "")
    if date_format is not None:
        return _formatted_times(text, present, date_format, path, label)
    numbers = pd.to_numeric(text, errors="coerce")
    if present.any() and numbers[present].notna().all():
        stamps, encoding = _epoch_times(numbers[present], path, label)
        return _no_missing(stamps.reindex(text.index), text, path, label), encoding
    cdd = text.str.fullmatch(_CDD_TIME, case=False, na=False)
    stamps = pd.to_datetime(text.where(cdd), format="%Y-%m-%d %I-%p", errors="coerce", utc=True)
    rest = stamps.isna() & present
    encoding = "CryptoDataDownload dates"
    if rest.any():
        slashed = _day_or_month_first(text[rest], path, label)
        if slashed is not None:
            parsed, encoding = slashed
        else:
            try:
                parsed = pd.to_datetime(text[rest], format="ISO8601", utc=True)
                encoding = "ISO 8601 times (naive ones as UTC)"
            except (ValueError, TypeError):
                parsed = pd.to_datetime(text[rest], format="mixed", errors="coerce", utc=True)
                encoding = "date text (naive as UTC)"
        stamps = pd.concat([stamps[~rest], parsed]).reindex(text.index)  # concat: the finer unit of the two
    stamps = _no_missing(stamps, text, path, label)
    check_time_zones(text, path)
    return stamps, encoding


def _formatted_times(
    text: pd.Series, present: pd.Series, date_format: str, path: Path, label: str
) -> tuple[pd.Series, str]:
    """Every time read with the strftime codes of `--date-format` (naive ones as UTC)."""
    try:
        stamps = pd.to_datetime(text.where(present), format=date_format, errors="coerce", utc=True)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"bad --date-format '{date_format}': {exc}".splitlines()[0]) from None
    return _no_missing(stamps, text, path, label), f"times read as '{date_format}' (naive as UTC)"


def _day_or_month_first(text: pd.Series, path: Path, label: str) -> tuple[pd.Series, str] | None:
    """Dates like `03/04/2024` (any time after them) read in the order of day and month the data allows: None
    when the text holds no such dates.

    An order that gives an impossible date is ruled out; of two possible orders, the one whose bars are spaced
    regularly is taken (hourly bars over 12 days read month first jump a month every 24 bars). When both are as
    regular, the order is not guessed: `--date-format` must name it."""
    parts = text.str.extract(_SLASHED_DATE)  # (n, 5): first number, separator, second number, year, the rest
    matched = parts[0].notna()
    if not matched.any():
        return None
    if not matched.all():
        raise DataError(
            f"'{path}': times in {label} mix dates like '{text[matched].iloc[0]}' with others like "
            f"'{text[~matched].iloc[0]}': pass --date-format (e.g. '%d/%m/%Y %H:%M')"
        )
    first, second, year, rest = parts[0], parts[2], parts[3], parts[4]
    day_first = _ordered_dates(year, month=second, day=first, rest=rest)
    month_first = _ordered_dates(year, month=first, day=second, rest=rest)
    day_ok, month_ok = bool(day_first.notna().all()), bool(month_first.notna().all())
    if not (day_ok or month_ok):
        raise DataError(
            f"'{path}': unreadable times in {label}: '{clip(text[day_first.isna()].iloc[0], _DATE_QUOTED)}' is no date "
            f"read day first, '{clip(text[month_first.isna()].iloc[0], _DATE_QUOTED)}' none read month first"
        )
    if not month_ok:
        return day_first, "day/month/year dates (month first gives no date for some)"
    if not day_ok:
        return month_first, "month/day/year dates (day first gives no date for some)"
    if day_first.equals(month_first):
        return day_first, "day/month/year dates (the same read month first)"
    day_steps, month_steps = _irregular_steps(day_first), _irregular_steps(month_first)
    if day_steps == month_steps:
        sep, clock = parts[1].iloc[0], _clock_codes(rest.iloc[0])
        raise UsageError(
            f"'{path}': dates like '{clip(text.iloc[0], _DATE_QUOTED)}' in {label} read day first or month first "
            f"alike: pass --date-format '%d{sep}%m{sep}%Y{clock}' (day first) or '%m{sep}%d{sep}%Y{clock}' (month first)"
        )
    if day_steps < month_steps:
        return day_first, f"day/month/year dates (read month first, {month_steps:,} steps break the spacing)"
    return month_first, f"month/day/year dates (read day first, {day_steps:,} steps break the spacing)"


def _ordered_dates(year: pd.Series, *, month: pd.Series, day: pd.Series, rest: pd.Series) -> pd.Series:
    """UTC times from the parts of `03/04/2024 10:00` in one order; NaT where that order gives no date."""
    text = year + "-" + month.str.zfill(2) + "-" + day.str.zfill(2) + rest
    stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    possible = month.astype(int) <= 12  # dateutil (format "mixed") would swap a month above 12 with the day
    if (stamps.isna() & possible).any():  # a clock like `2:00 PM`
        stamps = pd.to_datetime(text.where(possible), format="mixed", errors="coerce", utc=True)
    return stamps


def _clock_codes(clock: str) -> str:
    """The strftime codes of a time after a date (` 10:00` → ` %H:%M`), or ` ...` for one it cannot tell."""
    codes = re.sub(r"\d{1,2}:\d{2}(:\d{2})?", lambda m: "%H:%M:%S" if m.group(1) else "%H:%M", clock, count=1)
    return " ..." if re.search(r"\d", codes) else codes


def _irregular_steps(stamps: pd.Series) -> int:
    """Steps between consecutive times that differ from the most common one (in size or direction)."""
    steps = stamps.diff().dropna()
    return int((steps != steps.mode().iloc[0]).sum()) if len(steps) else 0


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
