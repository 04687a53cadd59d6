"""The canonical candle schema, its Parquet/CSV storage, and validation that reports instead of fixing.

Canonical candles: a DataFrame indexed by a tz-aware UTC `timestamp` (the bar's open time), float64 columns
`open, high, low, close, volume` (volume in the base asset), and `attrs` `symbol`, `timeframe`, `source`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from r1trade.data.csv_bounds import bounded_lines, check_columns, check_line_lengths, check_unique_names
from r1trade.errors import DataError, UsageError
from r1trade.outputs import write_through

COLUMNS = ("open", "high", "low", "close", "volume")
META_KEYS = ("symbol", "timeframe", "source")
_PARQUET_META_KEY = b"r1trade"

_TIMEFRAME_UNITS = {"m": "min", "h": "h", "d": "D", "w": "W"}


def timeframe_to_timedelta(timeframe: str) -> pd.Timedelta:
    """`'1h'` → 1 hour; accepts ccxt-style timeframes (`1m`, `15m`, `4h`, `1d`, `1w`)."""
    unit = timeframe[-1:]
    amount = timeframe[:-1]
    if unit not in _TIMEFRAME_UNITS or not amount.isdigit() or int(amount) <= 0:
        raise UsageError(f"bad timeframe '{timeframe}': use a number and one of m, h, d, w (e.g. 1h, 15m, 1d)")
    return pd.Timedelta(int(amount), unit=_TIMEFRAME_UNITS[unit])


def infer_timeframe(index: pd.DatetimeIndex) -> str | None:
    """The most common bar spacing as a timeframe string, or None when it cannot be told."""
    if len(index) < 2:
        return None
    step = pd.Series(index).diff().dropna().mode().iloc[0]
    for unit, seconds in (("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60)):
        if step.total_seconds() % seconds == 0 and step.total_seconds() >= seconds:
            return f"{int(step.total_seconds() // seconds)}{unit}"
    return None


def make_candles(
    frame: pd.DataFrame, *, symbol: str, timeframe: str, source: str, timestamp_column: str | None = None
) -> pd.DataFrame:
    """Bring a frame with OHLCV columns into the canonical schema (sorted order is NOT enforced: validate)."""
    frame = frame.copy()
    if timestamp_column is not None:
        frame = frame.set_index(timestamp_column)
    index = pd.DatetimeIndex(pd.to_datetime(frame.index, utc=True), name="timestamp")
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"candles lack column(s) {', '.join(missing)}; need {', '.join(COLUMNS)}")
    candles = pd.DataFrame(
        {c: pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype="float64") for c in COLUMNS}, index=index
    )
    candles.attrs.update(symbol=symbol, timeframe=timeframe, source=source)
    return candles


def candles_from_ohlcv(rows: list[list[float]], *, symbol: str, timeframe: str, source: str) -> pd.DataFrame:
    """Candles from ccxt's `[[ts_ms, open, high, low, close, volume], ...]` rows."""
    frame = pd.DataFrame(rows, columns=["ts", *COLUMNS])
    frame.index = pd.to_datetime(frame.pop("ts").astype("int64"), unit="ms", utc=True)
    return make_candles(frame, symbol=symbol, timeframe=timeframe, source=source)


# --------------------------------------------------------------------------- storage


CANDLE_SUFFIXES = (".parquet", ".csv")


def check_candle_suffix(path: Path) -> None:
    """Candle files are Parquet or canonical CSV, told apart by their suffix."""
    if path.suffix not in CANDLE_SUFFIXES:
        raise UsageError(f"cannot write '{path}': use a .parquet or .csv file name")


def save_candles(candles: pd.DataFrame, path: str | Path) -> Path:
    """Write candles atomically as Parquet (`.parquet`) or canonical CSV (`.csv`), keeping the metadata.

    The file is written beside `path`, flushed, read back and checked to hold every row before it replaces what
    was there, so an existing file is only ever replaced by a complete one."""
    path = Path(path)
    check_candle_suffix(path)
    meta = {k: candles.attrs.get(k) for k in META_KEYS}
    if path.suffix == ".parquet":
        table = pa.Table.from_pandas(candles[list(COLUMNS)], preserve_index=True)
        table = table.replace_schema_metadata({**table.schema.metadata, _PARQUET_META_KEY: json.dumps(meta)})

        def write(tmp: Path) -> None:
            pq.write_table(table, tmp)
    else:
        frame = candles[list(COLUMNS)].copy()
        frame.index = frame.index.strftime("%Y-%m-%dT%H:%M:%SZ")
        header = "# " + json.dumps(meta) + "\n"

        def write(tmp: Path) -> None:
            tmp.write_text(header + frame.to_csv(float_format="%.10g"))

    return write_through(path, write, check=lambda tmp: _check_written(tmp, candles, path))


def _check_written(written: Path, candles: pd.DataFrame, path: Path) -> None:
    """Refuse a written candle file that does not read back with every row and timestamp of `candles`."""
    try:
        back = load_candles(written)
    except DataError as exc:
        raise DataError(f"'{path}' was not replaced: the file written does not read back ({exc})") from None
    if len(back) != len(candles):
        raise DataError(
            f"'{path}' was not replaced: the file written reads back as {len(back):,} rows, not {len(candles):,}"
        )
    differ = np.flatnonzero(back.index != candles.index)
    if len(differ):
        first = differ[0]
        raise DataError(
            f"'{path}' was not replaced: timestamp {candles.index[first]} reads back as {back.index[first]} (a "
            ".csv keeps whole seconds: write .parquet)"
        )


def load_candles(path: str | Path) -> pd.DataFrame:
    """Read canonical candles from Parquet or CSV (as written by `save_candles`), without validating them.

    A file that cannot be taken for candles at all (damaged bytes or metadata, unreadable timestamps) is a
    one-line `DataError` naming it; defects in the values are left to `validate_candles`.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"candle file not found: '{path}' (run `r1trade fetch-data` or use data/sample/)")
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            meta = _metadata((table.schema.metadata or {}).get(_PARQUET_META_KEY), path)
            frame = _parquet_frame(table, path)
        elif path.suffix == ".csv":
            first, header = _csv_head(path)
            meta = _metadata(first[1:] if first.startswith("#") else None, path)
            check_columns(header, path)
            check_unique_names(header, path)
            check_line_lengths(path)
            frame = pd.read_csv(path, comment="#", index_col=0)
        else:
            raise UsageError(f"cannot read '{path}': use a .parquet or .csv candle file")
    except (OSError, ValueError, csv.Error, pa.ArrowException) as exc:
        raise DataError(f"cannot read candles from '{path}': {exc}".splitlines()[0]) from None
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise DataError(
            f"'{path}' is not a canonical candle file: no {', '.join(missing)} column(s) (convert other "
            "layouts with `r1trade import-csv`)"
        )
    frame.index = file_timestamps(frame.index, path)
    timeframe = meta.get("timeframe") or infer_timeframe(frame.index)
    return make_candles(
        frame,
        symbol=meta.get("symbol") or "UNKNOWN",
        timeframe=timeframe or "1h",
        source=meta.get("source") or str(path),
    )


def candle_file_timeframe(path: Path) -> str:
    """The bar length of a canonical candle file: the timeframe its metadata states (read without its rows),
    else its most common bar spacing (read whole), as `load_candles` gives it."""
    try:
        if path.suffix == ".parquet":
            raw = (pq.read_schema(path).metadata or {}).get(_PARQUET_META_KEY)
        else:
            first, _ = _csv_head(path)
            raw = first[1:] if first.startswith("#") else None
    except (OSError, ValueError, csv.Error, pa.ArrowException) as exc:
        raise DataError(f"cannot read candles from '{path}': {exc}".splitlines()[0]) from None
    return _metadata(raw, path).get("timeframe") or load_candles(path).attrs["timeframe"]


def _csv_head(path: Path) -> tuple[str, list[str]]:
    """A canonical CSV's first line and its header's names (the first line that is not a `#` comment or blank),
    each read with a bounded read."""
    first, header = "", []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(bounded_lines(handle, path)):
            first = line if number == 0 else first
            text = line.split("#", 1)[0].strip()  # pandas' comment="#" cuts a line there
            if text:
                header = next(csv.reader([text]))
                break
    return first, [name.strip() for name in header]


def _metadata(raw: str | bytes | None, path: Path) -> dict[str, str]:
    """The symbol, timeframe and source a file states about itself (none when it states nothing)."""
    if not raw:
        return {}
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise DataError(f"'{path}': its r1trade metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise DataError(f"'{path}': its r1trade metadata is a {type(meta).__name__}, not a JSON object")
    meta = {key: meta[key] for key in META_KEYS if isinstance(meta.get(key), str) and meta[key]}
    if "timeframe" in meta:
        check_stated_timeframe(meta["timeframe"], path)
    return meta


def check_stated_timeframe(timeframe: str, path: Path) -> None:
    """A timeframe a file states about itself must be usable; a bad one is the file's defect, not a flag's."""
    try:
        timeframe_to_timedelta(timeframe)
    except UsageError as exc:
        raise DataError(f"'{path}': its metadata names a {exc}") from None


def _parquet_frame(table: pa.Table, path: Path) -> pd.DataFrame:
    """The table as a frame indexed by its timestamps; damaged pandas metadata (index, attrs) is an error."""
    try:
        frame = table.to_pandas()
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise DataError(f"'{path}': its pandas metadata is damaged ({type(exc).__name__}: {exc})") from None
    frame = frame.set_index("timestamp") if "timestamp" in frame.columns else frame
    if frame.index.nlevels > 1:
        raise DataError(f"'{path}' has {frame.index.nlevels} index columns; candles have one, the timestamp")
    return frame


def file_timestamps(values: pd.Index, path: Path) -> pd.DatetimeIndex:
    """A candle file's timestamps as a UTC index (naive ones are UTC); empty, unreadable or out-of-range
    timestamps, and a mix of naive and zoned ones, are errors that name the file and the first values."""
    empty = np.asarray(values.isna())
    if isinstance(values, pd.DatetimeIndex):
        stamps = values if values.tz is not None else values.tz_localize("UTC")
    else:
        text = pd.Series(values.astype(str).str.strip(), index=range(len(values)))
        empty |= (text == "").to_numpy()
        parsed = pd.to_datetime(text.mask(empty), format="ISO8601", utc=True, errors="coerce")
        stamps = pd.DatetimeIndex(parsed)
        unreadable = np.asarray(stamps.isna()) & ~empty
        if unreadable.any():
            raise DataError(f"'{path}': unreadable timestamps such as {text[unreadable].head(3).tolist()}")
        check_time_zones(text, path)
    if empty.any():
        first = int(empty.argmax()) + 1
        raise DataError(f"'{path}': {int(empty.sum())} empty timestamp(s), the first in data row {first}")
    return check_time_range(pd.DatetimeIndex(stamps, name="timestamp"), path)


_ZONED = r"\d:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?)$"
"""A clock time followed by a UTC offset: `...T10:00:00Z`, `...10:00+05:30`."""


def check_time_zones(text: pd.Series, path: Path) -> None:
    """Refuse times that mix UTC offsets and naive values: the zone of the naive ones would be a guess."""
    zoned = text.str.contains(_ZONED, case=False, regex=True, na=False)
    present = text.notna() & (text != "")
    if zoned.any() and not zoned[present].all():
        naive = text[present & ~zoned].iloc[0]
        raise DataError(
            f"'{path}': times mix UTC offsets ('{text[zoned].iloc[0]}') and naive times ('{naive}'); "
            "give every time an offset, or none"
        )


def check_time_range(index: pd.DatetimeIndex, path: Path) -> pd.DatetimeIndex:
    """`index`, or an error for times outside 1677-2262 (nanosecond timestamps; never a real candle)."""
    try:
        index.as_unit("ns")
    except (OverflowError, pd.errors.OutOfBoundsDatetime):
        low, high = pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC")
        outside = index[(index < low) | (index > high)]
        raise DataError(f"'{path}': timestamps out of range (1677-2262) such as {outside[0]}") from None
    return index


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    """One kind of defect and where it is."""

    kind: str
    count: int
    where: list[str]
    error: bool = True

    def describe(self) -> str:
        if not self.where:
            return self.kind
        shown = ", ".join(self.where[:5]) + (", ..." if self.count > 5 else "")
        return f"{self.kind}: {self.count} row(s) at {shown}"


@dataclass(frozen=True)
class GapReport:
    count: int
    largest_bars: int
    missing_bars: int
    largest_at: str | None


@dataclass(frozen=True)
class ValidationReport:
    """What `validate_candles` found; `start` and `end` are the earliest and latest timestamps."""

    rows: int
    start: pd.Timestamp | None
    end: pd.Timestamp | None
    timeframe: str
    gaps: GapReport
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.error]

    @property
    def ok(self) -> bool:
        return not self.errors


def _stamps(index: pd.DatetimeIndex, mask: np.ndarray, limit: int = 20) -> list[str]:
    """The first `limit` flagged timestamps, for messages."""
    return [f"{ts:%Y-%m-%d %H:%M}" for ts in index[np.flatnonzero(mask)[:limit]]]


def validate_candles(candles: pd.DataFrame, timeframe: str | None = None) -> ValidationReport:
    """Check candles and report every defect; nothing is changed. Gaps are reported but are not errors."""
    timeframe = timeframe or candles.attrs.get("timeframe") or infer_timeframe(candles.index) or "1h"
    step = timeframe_to_timedelta(timeframe)
    index = candles.index
    o, h, l, c, v = (candles[col].to_numpy() for col in COLUMNS)
    checks: list[tuple[str, np.ndarray]] = []
    nanos = index.as_unit("ns").asi8
    deltas = np.diff(nanos) if len(nanos) > 1 else np.array([], dtype="int64")
    later = np.concatenate([[False], deltas < 0])
    checks.append(("non-monotonic timestamps", later))
    checks.append(("duplicate timestamps", np.concatenate([[False], deltas == 0])))
    prices = np.column_stack([o, h, l, c])
    checks.append(("NaN values", np.isnan(prices).any(axis=1) | np.isnan(v)))
    checks.append(("infinite values", np.isinf(prices).any(axis=1) | np.isinf(v)))
    with np.errstate(invalid="ignore"):
        checks.append(("non-positive prices", (prices <= 0).any(axis=1)))
        checks.append(("high below max(open, close)", h < np.maximum(o, c)))
        checks.append(("low above min(open, close)", l > np.minimum(o, c)))
        checks.append(("negative volume", v < 0))
    problems = [Problem(kind, int(mask.sum()), _stamps(index, mask)) for kind, mask in checks if mask.any()]
    if not len(candles):
        problems.append(Problem("no candles", 0, []))
    flat = (v == 0) & (h == l)
    if flat.any():  # exporters often fill an empty hour with the previous close: worth knowing, not an error
        problems.append(Problem("zero-volume flat bars (filled gaps?)", int(flat.sum()), _stamps(index, flat), False))

    step_ns = step.value
    forward = deltas[deltas > 0]
    gap_sizes = forward[forward > step_ns] // step_ns - 1
    off_grid = forward % step_ns != 0
    if off_grid.any():
        after = np.concatenate([[False], (deltas > 0) & (deltas % step_ns != 0)])
        problems.append(Problem(f"spacing not a multiple of {timeframe}", int(off_grid.sum()), _stamps(index, after)))
    largest_at = None
    if len(gap_sizes):
        positions = np.flatnonzero(deltas > step_ns)
        largest_at = f"{index[positions[np.argmax(gap_sizes)]]:%Y-%m-%d %H:%M}"
    gaps = GapReport(
        count=len(gap_sizes),
        largest_bars=int(gap_sizes.max()) if len(gap_sizes) else 0,
        missing_bars=int(gap_sizes.sum()),
        largest_at=largest_at,
    )
    return ValidationReport(
        rows=len(candles),
        start=index.min() if len(index) else None,  # earliest and latest, whatever the row order
        end=index.max() if len(index) else None,
        timeframe=timeframe,
        gaps=gaps,
        problems=problems,
    )


def load_clean_candles(path: str | Path) -> tuple[pd.DataFrame, ValidationReport]:
    """Load candles for training or backtesting; refuse them (naming the rows) if validation finds errors."""
    candles = load_candles(path)
    report = validate_candles(candles)
    if not report.ok:
        details = "; ".join(p.describe() for p in report.errors)
        raise DataError(f"'{path}' has bad candles: {details} (inspect with `r1trade data-info {path}`)")
    return candles, report
