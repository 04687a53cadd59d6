"""Damaged or hostile candle files and data arguments: a report or one clear error line, never a traceback.

The fixed cases run the real command in a subprocess; the property tests drive `main` in-process (fast) with
random bytes and mutated CSV, Parquet and YAML files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, make_synthetic_candles
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1trade.cli import main
from r1trade.data.store import load_candles, load_clean_candles, save_candles, validate_candles
from r1trade.errors import DataError, UsageError

HEADER = "timestamp,open,high,low,close,volume\n"
BAR = ",1,2,0.5,1.5,10\n"


def cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`r1trade ARGS` in a fresh interpreter, as a user runs it."""
    command = [sys.executable, "-m", "r1trade.cli", *map(str, args)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """The command failed with `code` and exactly one `error:` line on stderr holding every fragment."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def canonical_csv(tmp_path: Path, stamps: list[str], name: str = "candles.csv", meta: str = "") -> Path:
    path = tmp_path / name
    path.write_text(meta + HEADER + "".join(stamp + BAR for stamp in stamps))
    return path


def string_stamped_parquet(tmp_path: Path, stamps: list[str]) -> Path:
    """A Parquet file whose timestamp index holds text, as another tool might write it."""
    bar = {"open": 1.0, "high": 2.0, "low": 0.5, "close": 1.5, "volume": 10.0}
    frame = pd.DataFrame(bar, index=pd.Index(stamps, name="timestamp"))
    path = tmp_path / "candles.parquet"
    frame.to_parquet(path)
    return path


def with_metadata(path: Path, key: bytes, value: bytes) -> Path:
    """Rewrite the Parquet file at `path` with one schema metadata entry replaced."""
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, key: value}), path)
    return path


# --------------------------------------------------------------------------- values


def test_infinite_prices_are_errors_like_nan(tmp_path: Path):
    candles = make_synthetic_candles(50)
    candles.iloc[3, candles.columns.get_loc("high")] = np.inf
    candles.iloc[7, candles.columns.get_loc("close")] = np.inf
    path = save_candles(candles, tmp_path / "inf.parquet")

    report = validate_candles(candles)
    assert [p.count for p in report.errors if p.kind == "infinite values"] == [2]
    with pytest.raises(DataError, match="infinite values: 2 row"):
        load_clean_candles(path)
    result = cli("data-info", path)
    assert result.returncode == 1 and "infinite values" in result.stdout and "Traceback" not in result.stderr


def test_file_metadata_is_shown_as_text_not_markup(tmp_path: Path):
    path = canonical_csv(tmp_path, ["2024-01-01T00:00:00Z"], meta='# {"symbol": "[/x]", "source": "[bold"}\n')
    result = cli("data-info", path)
    assert result.returncode == 0, result.stderr
    assert "[/x]" in result.stdout and "[bold" in result.stdout


# --------------------------------------------------------------------------- timestamps and metadata


STAMPS = {
    "unreadable": (["2024-01-01T00:00:00Z", "yesterday"], "unreadable timestamps such as ['yesterday']"),
    "empty": (["2024-01-01T00:00:00Z", ""], "1 empty timestamp(s), the first in data row 2"),
    "mixed": (["2024-01-01T00:00:00", "2024-01-01T01:00:00Z"], "mix UTC offsets"),
}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("case", sorted(STAMPS))
def test_data_info_names_bad_timestamps(tmp_path: Path, case: str, suffix: str):
    stamps, message = STAMPS[case]
    path = canonical_csv(tmp_path, stamps) if suffix == ".csv" else string_stamped_parquet(tmp_path, stamps)
    assert_one_line_error(cli("data-info", path), 1, f"'{path}'", message)


@pytest.mark.parametrize(
    ("stamps", "message"),
    [
        (["2024-01-01T00:00:00", "2024-01-01T01:00:00Z"], "mix UTC offsets ('2024-01-01T01:00:00Z')"),
        (["2024-01-01T00:00:00Z", "2024-01-01T01:00:09.97770534"], "mix UTC offsets"),
        (["0001-01-01T00:00:00Z", "0001-01-01T01:00:00Z"], "out of range (1677-2262)"),
    ],
)
def test_import_csv_refuses_times_it_cannot_place(tmp_path: Path, stamps: list[str], message: str):
    source = canonical_csv(tmp_path, stamps)
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("import-csv", source, "--out", out), 1, f"'{source}'", message)
    assert not out.exists()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (b"r1trade", b"{not json", "its r1trade metadata is not valid JSON"),
        (b"r1trade", b'["BTC/USDT", "1h"]', "its r1trade metadata is a list, not a JSON object"),
        (b"r1trade", b'{"timeframe": "fortnightly"}', "its metadata names a bad timeframe 'fortnightly'"),
        (b"pandas", b"{broken", "its pandas metadata is damaged"),
        (b"pandas", b"[1, 2]", "its pandas metadata is damaged"),
    ],
)
def test_damaged_parquet_metadata_is_one_line(tmp_path: Path, key: bytes, value: bytes, message: str):
    path = with_metadata(save_candles(make_synthetic_candles(20), tmp_path / "c.parquet"), key, value)
    assert_one_line_error(cli("data-info", path), 1, f"'{path}'", message)


def test_pandas_attrs_that_are_not_a_mapping_are_one_line(tmp_path: Path):
    path = save_candles(make_synthetic_candles(20), tmp_path / "c.parquet")
    pandas_meta = json.loads(pq.read_schema(path).metadata[b"pandas"])
    with_metadata(path, b"pandas", json.dumps({**pandas_meta, "attributes": [1, 2]}).encode())
    assert_one_line_error(cli("data-info", path), 1, f"'{path}'", "pandas metadata is damaged")


# --------------------------------------------------------------------------- import-csv


def test_import_csv_exits_1_after_reporting_unusable_candles(tmp_path: Path):
    source = canonical_csv(tmp_path, ["2024-01-01T00:00:00Z", "2024-01-01T01:00:00Z"])
    source.write_text(source.read_text().replace(",1,2,", ",-1,2,", 1))
    out = tmp_path / "out.csv"
    result = cli("import-csv", source, "--out", out)
    assert result.returncode == 1 and result.stderr == ""
    assert "non-positive prices" in result.stdout and "refuse it" in result.stdout
    assert out.is_file()  # written as read, for inspection


def test_a_bad_timeframe_in_the_file_writes_nothing(tmp_path: Path):
    source = canonical_csv(tmp_path, ["2024-01-01T00:00:00Z"], meta='# {"timeframe": "1x"}\n')
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("import-csv", source, "--out", out), 1, f"'{source}'", "bad timeframe '1x'")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == [source.name]
    assert cli("import-csv", source, "--out", out, "--timeframe", "1h").returncode == 0  # the flag wins


def test_a_file_without_candles_is_an_error(tmp_path: Path):
    header_only = canonical_csv(tmp_path, [])
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("import-csv", header_only, "--out", out), 1, f"'{header_only}'", "no candles")
    assert not out.exists()

    empty_parquet = save_candles(make_synthetic_candles(20).iloc[:0], tmp_path / "empty.parquet")
    for path in (header_only, empty_parquet):
        result = cli("data-info", path)
        assert result.returncode == 1 and "no candles" in result.stdout and "problems" not in result.stdout


def test_import_csv_will_not_overwrite_its_input(tmp_path: Path):
    source = canonical_csv(tmp_path, ["2024-01-01T00:00:00Z"], name="in.csv")
    before = source.read_bytes()
    assert_one_line_error(cli("import-csv", source, "--out", source), 2, "is the CSV being read")
    same_file = tmp_path / "sub" / ".." / "in.csv"
    (tmp_path / "sub").mkdir()
    assert_one_line_error(cli("import-csv", source, "--out", same_file), 2, "is the CSV being read")
    assert source.read_bytes() == before


# --------------------------------------------------------------------------- fetch-data


@pytest.mark.parametrize(
    ("flag", "value"), [("--since", ""), ("--since", "nan"), ("--since", "0001-01-01"), ("--until", "")]
)
def test_fetch_data_refuses_blank_or_impossible_times(tmp_path: Path, flag: str, value: str):
    result = cli("fetch-data", flag, value, "--out", tmp_path, "--max-retries", "0")
    assert_one_line_error(result, 2, f"bad {flag} '{value}'")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- property tests, in-process

VALID = make_synthetic_candles(12)
SUFFIXES = (".csv", ".parquet")
COMMANDS = st.sampled_from(["data-info", "import-csv"])
TOKENS = [
    b"", b",", b"\n", b"\r\n", b"#", b"inf", b"-inf", b"nan", b"-1", b"1e400", b"Z", b"+05:00", b"T", b":",
    b"\xff\xfe", b"0001-01-01T00:00:00", b"9999-12-31", b"1700000000000", b'{"timeframe": "0h"}', b"[]", b'"',
]
CELLS = [
    "", " ", "yesterday", "2021-01-01", "2021-01-01T00:00:00", "2021-01-01 00:00",
    "2021-01-01T00:00:00+05:00", "2021-01-01T00:0", "0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z",
    "1609459200", "1609459200000", "inf", "-inf", "nan", "-1", "0", "1e400", "abc", '"', "#",
]
"""Cell values that trip candle readers: times in other formats or out of range, prices that are no prices."""
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few bytes replaced, deleted or inserted (tokens that trip parsers), or cut short."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 5))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["replace", "delete", "insert", "truncate"]))
        if edit == "replace" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif edit == "delete":
            del data[at : at + draw(st.integers(1, 30))]
        elif edit == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(max_size=6))
        else:
            del data[at:]
    return bytes(data)


@st.composite
def mutated_cells(draw: st.DrawFn, text: str) -> bytes:
    """The CSV `text` with a few cells (timestamps most of all) replaced by awkward values."""
    lines = [line.split(",") for line in text.splitlines()]
    for _ in range(draw(st.integers(1, 4))):
        row = draw(st.integers(2, len(lines) - 1))  # below the metadata line and the header
        cell = draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5]))
        lines[row][cell] = draw(st.sampled_from(CELLS) | st.text(max_size=6))
    return "".join(",".join(cells) + "\n" for cells in lines).encode()


def assert_clean_exit(code: int, out: str, err: str) -> None:
    """Success, a validation report with exit 1, or one `error:` line with exit 1 or 2; never a traceback.

    Lines are counted at newlines: a file's control characters echoed in a message do not end a terminal line.
    """
    assert "Traceback" not in err
    lines = [line for line in err.strip().split("\n") if line]
    if code == 0:
        return
    assert code in (1, 2), err
    if not lines:
        assert code == 1 and "error" in out  # the report names the defects
    else:
        assert len(lines) == 1 and lines[0].startswith("error:"), err


def run_on(capsys: pytest.CaptureFixture[str], path: Path, data: bytes, command: str) -> None:
    path.write_bytes(data)
    out_file = path.with_name("out.parquet")
    out_file.unlink(missing_ok=True)
    extra = ["--out", str(out_file)] if command == "import-csv" else []
    code = main([command, str(path), *extra])
    out, err = capsys.readouterr()
    assert_clean_exit(code, out, err)
    if command == "import-csv" and err:
        assert not out_file.exists()  # an error line means nothing was written


FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The bytes of a valid candle file, per suffix."""
    folder = tmp_path_factory.mktemp("base")
    return {suffix: save_candles(VALID, folder / f"c{suffix}").read_bytes() for suffix in SUFFIXES}


@FUZZ
@given(suffix=st.sampled_from(SUFFIXES), command=COMMANDS, data=st.data())
def test_damaged_candle_files(capsys, tmp_path: Path, bases, suffix: str, command: str, data: st.DataObject):
    """Random bytes, or a valid file with bytes replaced, deleted, inserted or cut off."""
    damaged = data.draw(st.binary(max_size=600) | mutated(bases[suffix]))
    run_on(capsys, tmp_path / f"in{suffix}", damaged, command)


@FUZZ
@given(command=COMMANDS, data=st.data())
def test_csv_with_awkward_cells(capsys, tmp_path: Path, bases, command: str, data: st.DataObject):
    run_on(capsys, tmp_path / "in.csv", data.draw(mutated_cells(bases[".csv"].decode())), command)


@FUZZ
@given(
    key=st.sampled_from([b"r1trade", b"pandas"]),
    field=st.sampled_from([None, "attributes", "index_columns", "columns", "timeframe", "symbol"]),
    value=JSON_VALUES,
)
def test_parquet_with_hostile_metadata(capsys, tmp_path: Path, bases, key: bytes, field: str | None, value):
    """A metadata entry replaced by any JSON value, or one field of it (pandas' own or the candle's)."""
    path = tmp_path / "in.parquet"
    path.write_bytes(bases[".parquet"])
    meta = json.loads(pq.read_schema(path).metadata[key])
    with_metadata(path, key, json.dumps(value if field is None else {**meta, field: value}).encode())
    code = main(["data-info", str(path)])
    out, err = capsys.readouterr()
    assert_clean_exit(code, out, err)


@FUZZ
@given(data=st.one_of(st.binary(max_size=400), mutated((ROOT / "configs" / "smoke.yaml").read_bytes())))
def test_random_bytes_as_a_config(capsys, tmp_path: Path, data: bytes):
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    code = main(["show-config", "--config", str(path)])
    out, err = capsys.readouterr()
    assert_clean_exit(code, out, err)
    assert code != 1 or err  # a config is never "reported": it is usable or it is an error line


def test_a_file_cut_short_in_a_real_process(tmp_path: Path):
    """A candle file cut off in the middle of a timestamp (a copy that stopped) is one error line."""
    path = save_candles(VALID, tmp_path / "cut.csv")
    text = path.read_text()
    path.write_text(text[: text.rindex("\n", 0, -1) + len("\n2021-01-01T11:0")])
    assert_one_line_error(cli("data-info", path), 1, f"'{path}'")


def test_table_in_an_unknown_layout_keeps_the_timestamp_column(tmp_path: Path):
    """A Parquet file without pandas metadata (written by another tool) keeps `timestamp` as the index."""
    table = pa.table({"timestamp": VALID.index, **{c: VALID[c].to_numpy() for c in VALID.columns}})
    path = tmp_path / "plain.parquet"
    pq.write_table(table, path)
    result = cli("data-info", path)
    assert result.returncode == 0 and "2021-01-01 00:00 → 2021-01-01 11:00 UTC" in result.stdout


# --------------------------------------------------------------------------- import-csv over an existing file


def hours_csv(tmp_path: Path, name: str = "hours.csv", *, price: str = "1", count: int = 12) -> Path:
    """A canonical CSV of `count` hourly bars from 2024-01-01 (open `price`: a word makes every row NaN)."""
    stamps = [f"2024-01-01T{hour:02d}:00:00Z" for hour in range(count)]
    path = tmp_path / name
    path.write_text(HEADER + "".join(f"{stamp},{price},2,0.5,1.5,10\n" for stamp in stamps))
    return path


def existing_candles(tmp_path: Path, name: str = "existing.parquet") -> tuple[Path, bytes]:
    """A valid candle file already there, and its bytes (to show that a refused write changed nothing)."""
    path = save_candles(make_synthetic_candles(300), tmp_path / name)
    return path, path.read_bytes()


def leftovers(folder: Path) -> list[str]:
    """Temporary files a write left behind (hidden names)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_import_csv_refuses_an_existing_out_without_force(tmp_path: Path):
    out, before = existing_candles(tmp_path)
    source = hours_csv(tmp_path)
    assert_one_line_error(cli("import-csv", source, "--out", out), 2, f"--out '{out}' exists: pass --force")
    (tmp_path / "sub").mkdir()
    climbing = tmp_path / "sub" / "missing" / ".." / ".." / out.name  # resolves to `out`
    assert_one_line_error(cli("import-csv", source, "--out", climbing), 2, f"(that is '{out}') exists")
    link = tmp_path / "link.parquet"
    link.symlink_to(out)
    assert_one_line_error(cli("import-csv", source, "--out", link), 2, f"(that is '{out}') exists")
    assert out.read_bytes() == before and not (tmp_path / "sub" / "missing").exists()
    assert_one_line_error(cli("import-csv", source, "--out", tmp_path / "sub"), 2, "use a .parquet or .csv")


def test_a_broken_import_never_replaces_a_file_even_with_force(tmp_path: Path):
    """A source whose prices are words imports as all-NaN rows: written to a new file for inspection, but never
    over an existing one."""
    out, before = existing_candles(tmp_path)
    source = hours_csv(tmp_path, price="n/a")
    result = cli("import-csv", source, "--out", out, "--force")
    assert_one_line_error(result, 1, f"'{out}' was kept as it was", "fail validation (NaN values: 12 row(s))")
    assert "NaN values" in result.stdout  # the report still shows what was read
    assert out.read_bytes() == before and leftovers(tmp_path) == []


def test_force_replaces_a_file_with_the_complete_import(tmp_path: Path):
    out, before = existing_candles(tmp_path)
    result = cli("import-csv", hours_csv(tmp_path), "--out", out, "--force")
    assert result.returncode == 0, result.stderr
    replaced = load_candles(out)
    assert len(replaced) == 12 and replaced.index[-1] == pd.Timestamp("2024-01-01T11:00:00Z")
    assert out.read_bytes() != before and leftovers(tmp_path) == []


def test_a_written_file_that_does_not_read_back_whole_replaces_nothing(tmp_path: Path, monkeypatch):
    """The new file is read back before the rename: a writer that loses rows (a full disk the library did not
    report, say) leaves the old file in place."""
    from r1trade.data import store

    out, before = existing_candles(tmp_path)
    write_table = pq.write_table
    monkeypatch.setattr(store.pq, "write_table", lambda table, where: write_table(table.slice(0, 10), where))
    with pytest.raises(DataError, match=rf"'{out}' was not replaced: .* reads back as 10 rows, not 300"):
        save_candles(make_synthetic_candles(300, seed=1), out)
    assert out.read_bytes() == before and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- bounded reading


def test_a_header_of_two_megabytes_is_refused_before_pandas(tmp_path: Path):
    """A header that repeats one name a million times (pandas renamed the copies in quadratic time)."""
    path = tmp_path / "wide.csv"
    path.write_text("timestamp,open,high,low,close,volume" + ",x" * 1_000_000 + "\n" + "2024-01-01T00:00:00Z" + BAR)
    out = tmp_path / "out.parquet"
    message = "line 1 is longer than 65,536 bytes"
    assert_one_line_error(cli("data-info", path), 1, f"'{path}'", message)
    assert_one_line_error(cli("import-csv", path, "--out", out), 1, f"'{path}'", message)
    assert not out.exists()


def test_a_header_of_too_many_columns_is_refused(tmp_path: Path):
    path = tmp_path / "columns.csv"
    path.write_text("timestamp,open,high,low,close,volume" + ",x" * 20_000 + "\n" + "2024-01-01T00:00:00Z" + BAR)
    for args in (["data-info", path], ["import-csv", path, "--out", tmp_path / "out.parquet"]):
        assert_one_line_error(cli(*args), 1, "has 20,006 columns; a candle file has at most 512")


def test_one_long_line_is_refused_without_reading_it_whole(tmp_path: Path):
    path = canonical_csv(tmp_path, ["2024-01-01T00:00:00Z"])
    with path.open("a") as handle:
        handle.write("9" * 1_000_000 + "\n")
    for args in (["data-info", path], ["import-csv", path, "--out", tmp_path / "out.parquet"]):
        assert_one_line_error(cli(*args), 1, f"'{path}': line 3 is longer than 65,536 bytes")


def test_repeated_names_are_refused_in_a_candle_file_and_skipped_in_an_import(tmp_path: Path):
    """A canonical file cannot say which of two columns is which; an import reads only the columns it uses, by
    position, so 400 copies of an unused name cost nothing."""
    path = tmp_path / "repeated.csv"
    rows = "".join(f"2024-01-01T0{hour}:00:00Z,1,2,0.5,1.5,10" + ",7" * 400 + "\n" for hour in range(3))
    path.write_text("timestamp,open,high,low,close,volume" + ",x" * 400 + "\n" + rows)
    assert_one_line_error(cli("data-info", path), 1, f"'{path}': the header names column 'x' more than once")
    out = tmp_path / "out.parquet"
    result = cli("import-csv", path, "--out", out)
    assert result.returncode == 0, result.stderr
    assert load_candles(out)[["open", "close"]].to_numpy().tolist() == [[1.0, 1.5]] * 3


def test_line_lengths_are_measured_across_pieces(tmp_path: Path, monkeypatch):
    """The scan reads 4-byte pieces here, so lines cross pieces. With a limit of 3 bytes: `ab` (2) and the
    `\\r\\n` ending are fine, `cdef` (4) on line 2 is not; a last line `ghij` without a newline is line 3."""
    from r1trade.data import csv_bounds

    monkeypatch.setattr(csv_bounds, "_CHUNK_BYTES", 4)
    monkeypatch.setattr(csv_bounds, "MAX_LINE_BYTES", 3)
    path = tmp_path / "lines.csv"
    for data, line in ((b"ab\r\ncdef\nxy\n", 2), (b"ab\r\nc\r\nghij", 3), (b"abcd\n", 1)):
        path.write_bytes(data)
        with pytest.raises(DataError, match=rf"line {line} is longer than 3 bytes"):
            csv_bounds.check_line_lengths(path)
    path.write_bytes(b"abc\r\nabc\nabc")
    csv_bounds.check_line_lengths(path)  # every line at the limit


# --------------------------------------------------------------------------- day and month


def dated_csv(
    tmp_path: Path, fmt: str, *, bars: int = 12 * 24, start: str = "2024-01-01", freq: str = "1h"
) -> Path:
    """`bars` bars from `start`, `freq` apart, with their times written as `fmt`."""
    stamps = pd.date_range(start, periods=bars, freq=freq)
    path = tmp_path / "dated.csv"
    path.write_text("date,open,high,low,close,volume\n" + "".join(f"{t.strftime(fmt)}{BAR}" for t in stamps))
    return path


@pytest.mark.parametrize(
    ("fmt", "order"),
    [("%d/%m/%Y %H:%M", "day/month/year"), ("%m/%d/%Y %H:%M", "month/day/year"), ("%d.%m.%Y %H:%M", "day/month")],
)
def test_twelve_days_of_ambiguous_dates_are_read_in_the_regular_order(tmp_path: Path, fmt: str, order: str):
    """12 days of hourly bars: every day is at most 12, so both orders give dates. Read the wrong way, the 24
    bars of each day sit on the 1st of a month, 11 jumps of a month between them: the regular order wins."""
    out = tmp_path / "out.parquet"
    result = cli("import-csv", dated_csv(tmp_path, fmt), "--out", out)
    assert result.returncode == 0, result.stderr
    assert order in result.stdout and "11 steps break the spacing" in result.stdout
    assert "2024-01-01 00:00 → 2024-01-12 23:00 UTC" in result.stdout
    assert load_candles(out).attrs["timeframe"] == "1h"


def test_dates_that_read_alike_both_ways_are_refused_until_named(tmp_path: Path):
    """Two bars on 01/02/2024: the 1st of February or the 2nd of January, an hour apart either way."""
    source = dated_csv(tmp_path, "%d/%m/%Y %H:%M", bars=2, start="2024-02-01")
    out = tmp_path / "out.parquet"
    assert_one_line_error(
        cli("import-csv", source, "--out", out), 2, "read day first or month first alike",
        "--date-format '%d/%m/%Y %H:%M' (day first) or '%m/%d/%Y %H:%M' (month first)",
    )
    assert not out.exists()
    result = cli("import-csv", source, "--out", out, "--date-format", "%d/%m/%Y %H:%M")
    assert result.returncode == 0, result.stderr
    assert "2024-02-01 00:00 → 2024-02-01 01:00 UTC" in result.stdout
    assert_one_line_error(cli("import-csv", source, "--out", tmp_path / "o.csv", "--date-format", "%Q"), 2,
                          "bad --date-format '%Q'")


def test_a_day_above_twelve_rules_the_other_order_out(tmp_path: Path):
    """40 daily bars: 13/01/2024 has no month 13, so the dates are read day first."""
    source = dated_csv(tmp_path, "%d/%m/%Y", bars=40, freq="1D")
    result = cli("import-csv", source, "--out", tmp_path / "o.parquet")
    assert result.returncode == 0, result.stderr
    assert "day/month/year dates (month first gives no date for some)" in result.stdout
    assert "2024-01-01 00:00 → 2024-02-09 00:00 UTC" in result.stdout


def test_dates_mixed_with_other_forms_are_refused(tmp_path: Path):
    source = tmp_path / "mixed.csv"
    source.write_text("date,open,high,low,close,volume\n" + "01/02/2024 00:00" + BAR + "2024-01-02 01:00" + BAR)
    assert_one_line_error(cli("import-csv", source, "--out", tmp_path / "o.parquet"), 1,
                          "mix dates like '01/02/2024 00:00' with others like '2024-01-02 01:00'")


# --------------------------------------------------------------------------- a checkpoint's bar length


@pytest.fixture
def hourly_checkpoint(tmp_path: Path) -> Path:
    """A checkpoint folder's config.yaml alone: the smoke config, trained on the hourly sample (the check reads
    nothing else, so no model is needed to reach it)."""
    from r1trade.config import load_config

    folder = tmp_path / "step-1"
    load_config("smoke").save(folder)
    return folder


@pytest.mark.slow
def test_a_checkpoint_is_refused_candles_of_another_bar_length(tmp_path: Path, hourly_checkpoint: Path):
    four_hours = save_candles(make_synthetic_candles(2000, freq="4h"), tmp_path / "btc_4h.parquet")
    out = tmp_path / "report"
    args = ["backtest", "--checkpoint", hourly_checkpoint, "--data", four_hours, "--strategy", "buy_and_hold",
            "--out", out]
    assert_one_line_error(cli(*args), 2, f"'{hourly_checkpoint}' was trained on 1h candles and {four_hours} "
                          "holds 4h candles", "--allow-timeframe-change")
    assert not out.exists()
    allowed = cli(*args, "--allow-timeframe-change")  # past the check, to the (model-less) checkpoint itself
    assert_one_line_error(allowed, 2, f"incomplete checkpoint '{hourly_checkpoint}'")
    hourly = save_candles(make_synthetic_candles(2000), tmp_path / "btc_1h.parquet")
    assert_one_line_error(cli(*args[:3], "--data", hourly, *args[5:]), 2, "incomplete checkpoint")


def test_paper_replay_is_refused_candles_of_another_bar_length(tmp_path: Path, hourly_checkpoint: Path):
    """The same check before a paper run opens its journal: nothing is written."""
    four_hours = save_candles(make_synthetic_candles(2000, freq="4h"), tmp_path / "btc_4h.parquet")
    journal = tmp_path / "paper.sqlite"
    args = ["paper", "--checkpoint", hourly_checkpoint, "--journal", journal, "--replay", four_hours]
    assert_one_line_error(cli(*args), 2, f"'{hourly_checkpoint}' was trained on 1h candles and '{four_hours}' "
                          "holds 4h candles", "--allow-timeframe-change")
    assert not journal.exists()


def test_the_bar_length_of_a_config_s_candles(tmp_path: Path):
    from r1trade.config import load_config
    from r1trade.data.source import candle_timeframe

    quarter_hours = make_synthetic_candles(50, freq="15min")
    quarter_hours.attrs["timeframe"] = "15m"  # stated in the file's metadata: read without its rows
    stated = save_candles(quarter_hours, tmp_path / "stated.parquet")
    spaced = canonical_csv(tmp_path, ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"])
    cases = {
        ("data.source=synthetic",): "1h",
        ("data.source=synthetic", "data.synthetic.timeframe=4h"): "4h",
        (): "1h",  # the shipped hourly sample
        (f"data.path={stated}",): "15m",
        (f"data.path={spaced}",): "1d",  # no metadata: the bar spacing
        (f"data.path={tmp_path / 'gone.parquet'}",): None,
    }
    for overrides, timeframe in cases.items():
        assert candle_timeframe(load_config(None, list(overrides))) == timeframe, overrides


def test_bar_lengths_are_compared_as_durations(tmp_path: Path):
    from r1trade.data.source import refuse_timeframe_change

    refuse_timeframe_change(tmp_path, {"1h"}, "60m", "c.parquet")  # the same hour, written another way
    refuse_timeframe_change(tmp_path, set(), "4h", "c.parquet")  # the training candles cannot be told
    refuse_timeframe_change(tmp_path, {"1h", "4h"}, "4h", "c.parquet")  # trained on both
    with pytest.raises(UsageError, match="trained on 1d candles and c.parquet holds 24m candles"):
        refuse_timeframe_change(tmp_path, {"1d"}, "24m", "c.parquet")
