from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from r1trade.data.csv_import import import_candle_csv
from r1trade.data.store import (
    candles_from_ohlcv,
    load_candles,
    load_clean_candles,
    save_candles,
    timeframe_to_timedelta,
    validate_candles,
)
from r1trade.errors import DataError, OutputError, UsageError


def test_parquet_and_csv_round_trip_keep_values_and_metadata(candles, tmp_path: Path):
    for name in ("c.parquet", "c.csv"):
        path = save_candles(candles, tmp_path / name)
        back = load_candles(path)
        pd.testing.assert_frame_equal(back, candles, check_freq=False, rtol=1e-9)
        assert back.attrs == candles.attrs
        assert str(back.index.tz) == "UTC" and list(back.dtypes) == [np.float64] * 5


def test_clean_data_has_no_problems(candles):
    report = validate_candles(candles)
    assert report.ok and report.problems == [] and report.gaps.count == 0
    assert report.rows == 500 and report.timeframe == "1h"


def test_every_defect_is_reported_with_its_rows(candles):
    bad = candles.copy()
    bad.iloc[3, bad.columns.get_loc("close")] = np.nan
    bad.iloc[5, bad.columns.get_loc("open")] = -1.0
    bad.iloc[7, bad.columns.get_loc("high")] = bad.iloc[7]["low"] * 0.5  # high below open/close
    bad.iloc[9, bad.columns.get_loc("low")] = bad.iloc[9]["high"] * 2  # low above open/close
    bad.iloc[11, bad.columns.get_loc("volume")] = -5.0
    report = validate_candles(bad)
    kinds = {p.kind: p for p in report.errors}
    assert set(kinds) == {
        "NaN values", "non-positive prices", "high below max(open, close)",
        "low above min(open, close)", "negative volume",
    }
    stamp = lambda i: f"{bad.index[i]:%Y-%m-%d %H:%M}"
    assert kinds["NaN values"].where == [stamp(3)]
    assert kinds["negative volume"].where == [stamp(11)]
    assert stamp(7) in kinds["high below max(open, close)"].where


def test_duplicates_and_disorder_are_errors(candles):
    shuffled = candles.iloc[[0, 1, 3, 2, 4, 4, 5]]
    kinds = {p.kind: p.count for p in validate_candles(shuffled).errors}
    assert kinds == {"non-monotonic timestamps": 1, "duplicate timestamps": 1}


def test_report_range_is_earliest_to_latest_whatever_the_order(candles):
    unordered = candles.iloc[[3, 0, 7, 1]]
    report = validate_candles(unordered)
    assert (report.start, report.end) == (candles.index[0], candles.index[7])
    assert "non-monotonic timestamps" in [p.kind for p in report.errors]


def test_gaps_are_counted_but_not_errors(candles):
    gappy = candles.drop(candles.index[[10, 11, 12, 50]])  # one 3-bar hole and one 1-bar hole
    report = validate_candles(gappy)
    assert report.ok
    assert (report.gaps.count, report.gaps.largest_bars, report.gaps.missing_bars) == (2, 3, 4)
    assert report.gaps.largest_at == f"{candles.index[9]:%Y-%m-%d %H:%M}"


def test_off_grid_spacing_is_an_error(candles):
    shifted = candles.copy()
    shifted.index = shifted.index.where(shifted.index != shifted.index[5], shifted.index[5] + pd.Timedelta("30min"))
    assert [p.kind for p in validate_candles(shifted).errors] == ["spacing not a multiple of 1h"]


def test_loading_for_training_refuses_bad_rows(candles, tmp_path: Path):
    bad = candles.copy()
    bad.iloc[4, 0] = np.nan
    path = save_candles(bad, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=rf"NaN values: 1 row\(s\) at {candles.index[4]:%Y-%m-%d %H:%M}"):
        load_clean_candles(path)


def test_missing_and_corrupt_files_give_clear_errors(tmp_path: Path):
    with pytest.raises(UsageError, match="candle file not found"):
        load_candles(tmp_path / "nope.parquet")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="cannot read candles"):
        load_candles(corrupt)
    with pytest.raises(UsageError, match="use a .parquet or .csv"):
        save_candles(pd.DataFrame(), tmp_path / "x.json")


def test_failed_write_leaves_existing_file_intact(candles, tmp_path: Path, monkeypatch):
    path = save_candles(candles, tmp_path / "c.parquet")
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("pyarrow.parquet.write_table", boom)
    with pytest.raises(OutputError, match=f"could not write {path}: disk full"):
        save_candles(candles.iloc[:10], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.parquet"]


def test_ccxt_rows_become_canonical_candles():
    rows = [[1_700_000_000_000, 1, 2, 0.5, 1.5, 10], [1_700_003_600_000, 1.5, 2, 1, 1.2, 3]]
    candles = candles_from_ohlcv(rows, symbol="BTC/USDT", timeframe="1h", source="ccxt:binance")
    assert candles.index[0] == pd.Timestamp("2023-11-14 22:13:20", tz="UTC")
    assert candles["close"].tolist() == [1.5, 1.2] and candles.attrs["symbol"] == "BTC/USDT"


def test_cryptodatadownload_import_handles_banner_order_and_am_pm(tmp_path: Path):
    csv = tmp_path / "cdd.csv"
    csv.write_text(
        "Timestamps are UTC timezone,https://www.CryptoDataDownload.com\n"
        "date,symbol,open,high,low,close,volume_btc,volume\n"
        "2019-10-17 01-PM,BTCUSD,3,4,2,3.5,7,21\n"
        "2019-10-17 12-PM,BTCUSD,2,3,1,3,6,18\n"
        "2019-10-17 11-AM,BTCUSD,1,2,0.5,2,5,10\n"
    )
    candles = import_candle_csv(csv, fmt="cryptodatadownload").candles
    assert list(candles.index.strftime("%H")) == ["11", "12", "13"]
    assert candles["volume"].tolist() == [5.0, 6.0, 7.0]  # base-asset volume, as ccxt reports it
    assert candles.attrs["symbol"] == "BTC/USD"
    assert validate_candles(candles).ok


def test_shipped_sample_is_the_documented_series(sample_path: Path):
    candles, report = load_clean_candles(sample_path)
    assert report.rows == 20_111 and report.timeframe == "1h"
    assert report.start == pd.Timestamp("2017-07-01 11:00", tz="UTC")
    assert report.end == pd.Timestamp("2019-10-17 09:00", tz="UTC")
    assert report.gaps.count == 0
    assert [p.count for p in report.problems] == [28]  # zero-volume filled hours: a warning, not an error
    assert candles.attrs["symbol"] == "BTC/USD"


@pytest.mark.parametrize(("text", "hours"), [("1h", 1), ("4h", 4), ("15m", 0.25), ("1d", 24), ("1w", 168)])
def test_timeframes(text: str, hours: float):
    assert timeframe_to_timedelta(text) == pd.Timedelta(hours=hours)


@pytest.mark.parametrize("text", ["", "h", "0h", "1y", "-1h"])
def test_bad_timeframes(text: str):
    with pytest.raises(UsageError, match="bad timeframe"):
        timeframe_to_timedelta(text)
