"""The canonical candle schema, its Parquet/CSV storage, and validation that reports instead of fixing.

Canonical candles: a DataFrame indexed by a tz-aware UTC `timestamp` (the bar's open time), float64 columns
`open, high, low, close, volume` (volume in the base asset), and `attrs` `symbol`, `timeframe`, `source`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from r1trade.errors import DataError, UsageError

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


def _atomic_write(path: Path, write) -> None:
    """Call `write(tmp_path)` then rename over `path`, so a failure never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_candles(candles: pd.DataFrame, path: str | Path) -> Path:
    """Write candles atomically as Parquet (`.parquet`) or canonical CSV (`.csv`), keeping the metadata."""
    path = Path(path)
    meta = {k: candles.attrs.get(k) for k in META_KEYS}
    if path.suffix == ".parquet":
        table = pa.Table.from_pandas(candles[list(COLUMNS)], preserve_index=True)
        table = table.replace_schema_metadata({**table.schema.metadata, _PARQUET_META_KEY: json.dumps(meta)})
        _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    elif path.suffix == ".csv":
        frame = candles[list(COLUMNS)].copy()
        frame.index = frame.index.strftime("%Y-%m-%dT%H:%M:%SZ")
        header = "# " + json.dumps(meta) + "\n"
        _atomic_write(path, lambda tmp: tmp.write_text(header + frame.to_csv(float_format="%.10g")))
    else:
        raise UsageError(f"cannot write '{path}': use a .parquet or .csv file name")
    return path


def load_candles(path: str | Path) -> pd.DataFrame:
    """Read canonical candles from Parquet or CSV (as written by `save_candles`), without validating them."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"candle file not found: '{path}' (run `r1trade fetch-data` or use data/sample/)")
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            raw_meta = (table.schema.metadata or {}).get(_PARQUET_META_KEY)
            meta = json.loads(raw_meta) if raw_meta else {}
            frame = table.to_pandas()
        elif path.suffix == ".csv":
            with path.open() as handle:
                first = handle.readline()
            meta = json.loads(first[1:]) if first.startswith("#") else {}
            frame = pd.read_csv(path, comment="#", index_col=0)
        else:
            raise UsageError(f"cannot read '{path}': use a .parquet or .csv candle file")
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DataError(f"cannot read candles from '{path}': {exc}".splitlines()[0]) from None
    timeframe = meta.get("timeframe") or infer_timeframe(pd.DatetimeIndex(pd.to_datetime(frame.index, utc=True)))
    return make_candles(
        frame,
        symbol=meta.get("symbol") or "UNKNOWN",
        timeframe=timeframe or "1h",
        source=meta.get("source") or str(path),
    )


def import_cryptodatadownload_csv(path: str | Path, *, timeframe: str = "1h") -> pd.DataFrame:
    """Read a CryptoDataDownload export: a banner line, newest-first rows, dates like `2019-10-17 09-AM`.

    Volume is taken from the base-asset column (`volume_btc`, or `Volume <BASE>`), as ccxt reports it. Other
    layouts, and detecting them: `r1trade.data.csv_import`.
    """
    from r1trade.data.csv_import import import_candle_csv

    return import_candle_csv(path, fmt="cryptodatadownload", timeframe=timeframe).candles


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    """One kind of defect and where it is."""

    kind: str
    count: int
    where: list[str]
    error: bool = True

    def describe(self) -> str:
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
    with np.errstate(invalid="ignore"):
        checks.append(("non-positive prices", (prices <= 0).any(axis=1)))
        checks.append(("high below max(open, close)", h < np.maximum(o, c)))
        checks.append(("low above min(open, close)", l > np.minimum(o, c)))
        checks.append(("negative volume", v < 0))
    problems = [Problem(kind, int(mask.sum()), _stamps(index, mask)) for kind, mask in checks if mask.any()]
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
