"""`r1trade import-csv` reads the common candle CSV layouts without `--format`, and repairs nothing."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from r1trade.cli import main
from r1trade.data.csv_import import import_candle_csv, normalise
from r1trade.data.store import load_candles, save_candles, validate_candles
from r1trade.errors import DataError, UsageError

HOURS = pd.date_range("2024-01-01", periods=3, freq="1h", tz="UTC", name="timestamp")
OHLCV = [(1.0, 2.0, 0.5, 1.5, 10.0), (1.5, 2.0, 1.0, 1.2, 3.0), (1.2, 1.3, 1.1, 1.25, 4.0)]
MS = [1704067200000, 1704070800000, 1704074400000]  # HOURS as epoch milliseconds


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str, name: str = "in.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rows(stamps: list, sep: str = ",") -> str:
    return "".join(sep.join(map(str, (stamp, *bar))) + "\n" for stamp, bar in zip(stamps, OHLCV, strict=True))


def assert_three_hours(candles: pd.DataFrame) -> None:
    assert list(candles.index) == list(HOURS)
    assert candles[["open", "high", "low", "close", "volume"]].to_numpy().tolist() == [list(b) for b in OHLCV]
    assert validate_candles(candles).ok and candles.attrs["timeframe"] == "1h"


def test_canonical_csv_through_the_cli_without_format(capsys, tmp_path: Path):
    iso = [f"{t:%Y-%m-%dT%H:%M:%SZ}" for t in HOURS]
    source = write(tmp_path, "timestamp,open,high,low,close,volume\n" + rows(iso))
    out_path = tmp_path / "out.parquet"
    code, out, err = run(capsys, "import-csv", str(source), "--out", str(out_path))
    assert code == 0, err
    assert "canonical CSV" in out and "ISO 8601" in out and "problems" in out
    candles = load_candles(out_path)
    assert_three_hours(candles)
    assert candles.attrs["symbol"] == "UNKNOWN"


def test_canonical_file_keeps_its_metadata_line(tmp_path: Path, candles: pd.DataFrame):
    source = save_candles(candles.iloc[:50], tmp_path / "saved.csv")  # `# {"symbol": ...}` above the header
    imported = import_candle_csv(source)
    assert imported.layout == "canonical"
    assert imported.candles.attrs == {"symbol": "TEST/USD", "timeframe": "1h", "source": "synthetic"}
    np.testing.assert_allclose(imported.candles.to_numpy(), candles.iloc[:50].to_numpy(), rtol=1e-9)


def test_cryptodatadownload_banner_is_detected(capsys, tmp_path: Path):
    source = write(
        tmp_path,
        "Timestamps are UTC timezone,https://www.CryptoDataDownload.com\n"
        "date,symbol,open,high,low,close,volume_btc,volume\n"
        "2024-01-01 02-AM,BTCUSD,1.2,1.3,1.1,1.25,4,5\n"
        "2024-01-01 01-AM,BTCUSD,1.5,2,1,1.2,3,3.6\n"
        "2024-01-01 12-AM,BTCUSD,1,2,0.5,1.5,10,15\n",
    )
    code, out, err = run(capsys, "import-csv", str(source), "--out", str(tmp_path / "cdd.parquet"))
    assert code == 0, err
    assert "CryptoDataDownload export" in out and "rows reversed" in out and "BTC/USD" in out
    candles = load_candles(tmp_path / "cdd.parquet")
    assert_three_hours(candles)  # base-asset volume, not the USD `volume` column
    assert candles.attrs["source"] == "CryptoDataDownload (in.csv)"
    forced = import_candle_csv(source, fmt="cryptodatadownload").candles
    pd.testing.assert_frame_equal(forced, candles, check_freq=False)


def test_newer_cryptodatadownload_layout_with_unix_ms(tmp_path: Path):
    source = write(
        tmp_path,
        "https://www.CryptoDataDownload.com\n"
        "unix,date,symbol,open,high,low,close,Volume BTC,Volume USDT,tradecount\n"
        + "".join(
            f"{ms},{t:%Y-%m-%d %H:%M:%S},BTCUSDT,{','.join(map(str, bar))},99,7\n"
            for ms, t, bar in reversed(list(zip(MS, HOURS, OHLCV, strict=True)))
        ),
    )
    imported = import_candle_csv(source)
    assert imported.layout == "cryptodatadownload" and "epoch ms" in imported.description
    assert_three_hours(imported.candles)
    assert imported.candles.attrs["symbol"] == "BTC/USDT"


def test_binance_kline_export_with_ms_open_time(tmp_path: Path):
    header = (
        "open_time,open,high,low,close,volume,close_time,quote_asset_volume,number_of_trades,"
        "taker_buy_base_asset_volume,taker_buy_quote_asset_volume,ignore\n"
    )
    body = "".join(
        f"{ms},{','.join(map(str, bar))},{ms + 3_599_999},15,5,3,4,0\n"
        for ms, bar in zip(MS, OHLCV, strict=True)
    )
    imported = import_candle_csv(write(tmp_path, header + body))
    assert imported.layout == "exchange"
    assert "'open_time'" in imported.description and "epoch ms" in imported.description
    assert "volume from 'volume'" in imported.description
    assert_three_hours(imported.candles)


def test_epoch_seconds_in_a_time_column(tmp_path: Path):
    seconds = [m // 1000 for m in MS]
    imported = import_candle_csv(write(tmp_path, "time,open,high,low,close,volume\n" + rows(seconds)))
    assert "epoch s" in imported.description
    assert_three_hours(imported.candles)


def test_epoch_units_are_told_apart_per_value(tmp_path: Path):
    # an export that switched from milliseconds to microseconds mid-file (as Binance's spot dumps did in 2025)
    stamps = [MS[0], MS[1] * 1000, float(MS[2])]
    imported = import_candle_csv(write(tmp_path, "timestamp,open,high,low,close,volume\n" + rows(stamps)))
    assert "epoch ms and us" in imported.description
    assert_three_hours(imported.candles)


def test_capitalised_headers_with_a_date_column_and_extra_columns(tmp_path: Path):
    days = pd.date_range("2024-01-01", periods=3, freq="1D", tz="UTC")
    body = "".join(
        f"{t:%Y-%m-%d},{o},{h},{lo},{c},{c},{v}\n" for t, (o, h, lo, c, v) in zip(days, OHLCV, strict=True)
    )
    imported = import_candle_csv(write(tmp_path, "Date,Open,High,Low,Close,Adj Close,Volume\n" + body))
    assert imported.layout == "exchange"
    assert list(imported.candles.index) == list(days) and imported.candles.attrs["timeframe"] == "1d"
    assert imported.candles["close"].tolist() == [1.5, 1.2, 1.25]


def test_datetime_column_semicolons_spaces_and_a_byte_order_mark(tmp_path: Path):
    stamps = [f"{t:%Y-%m-%d %H:%M:%S}" for t in HOURS]
    text = "\ufeffDatetime ; Open ; High ; Low ; Close ; Volume\n" + rows(stamps, sep=" ; ")
    assert_three_hours(import_candle_csv(write(tmp_path, text)).candles)


def test_separate_date_and_time_columns_are_joined(tmp_path: Path):
    body = "".join(
        f"2024-01-01,{t:%H:%M},{','.join(map(str, bar))}\n" for t, bar in zip(HOURS, OHLCV, strict=True)
    )
    imported = import_candle_csv(write(tmp_path, "Date,Time,Open,High,Low,Close,Volume\n" + body))
    assert "time from 'Date' and 'Time'" in imported.description
    assert_three_hours(imported.candles)


def test_headerless_ccxt_rows(capsys, tmp_path: Path):
    source = write(tmp_path, rows(MS))
    out_path = tmp_path / "c.parquet"
    code, out, err = run(capsys, "import-csv", str(source), "--out", str(out_path), "--symbol", "BTC/USDT")
    assert code == 0, err
    assert "headerless ccxt rows" in out
    candles = load_candles(tmp_path / "c.parquet")
    assert_three_hours(candles)
    assert candles.attrs["symbol"] == "BTC/USDT"


def test_ccxt_rows_saved_by_pandas_with_an_index_column(tmp_path: Path):
    frame = pd.DataFrame([[ms, *bar] for ms, bar in zip(MS, OHLCV, strict=True)],
                         columns=["timestamp", "open", "high", "low", "close", "volume"])
    frame.to_csv(tmp_path / "ohlcv.csv")  # the unnamed first column is pandas' row number
    imported = import_candle_csv(tmp_path / "ohlcv.csv")
    assert imported.layout == "exchange" and "epoch ms" in imported.description
    assert_three_hours(imported.candles)


def test_short_column_names_as_in_ccxt_records(tmp_path: Path):
    assert_three_hours(import_candle_csv(write(tmp_path, "ts,o,h,l,c,v\n" + rows(MS))).candles)


def test_undetectable_layout_is_one_line_exit_2(capsys, tmp_path: Path):
    source = write(tmp_path, "when,price,amount\n2024-01-01,1,2\n")
    code, out, err = run(capsys, "import-csv", str(source), "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and not (tmp_path / "x.parquet").exists()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "found columns when, price, amount" in err
    assert "expected a time column (timestamp, date, time" in err and "open, high, low, close, volume" in err
    assert "--format" in err


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        ("open_time,open,high,low,close,volume\n" + rows(MS), "canonical", "header is timestamp,open,high"),
        ("timestamp,open,high,low,close,volume\n" + rows(MS), "ccxt", "headerless ccxt rows need"),
        ("timestamp,open,high,low,close,volume\n" + rows(MS), "excel", "unknown --format 'excel'"),
    ],
)
def test_format_override_is_checked(capsys, tmp_path: Path, text: str, fmt: str, message: str):
    source = write(tmp_path, text)
    args = ["import-csv", str(source), "--out", str(tmp_path / "x.parquet"), "--format", fmt]
    code, _, err = run(capsys, *args)
    assert code == 2 and message in err


def test_format_override_picks_the_layout(tmp_path: Path):
    source = write(tmp_path, "timestamp,open,high,low,close,volume\n" + rows(MS))
    imported = import_candle_csv(source, fmt="exchange", timeframe="1h", symbol="ETH/USD")
    assert imported.layout == "exchange" and imported.candles.attrs["symbol"] == "ETH/USD"
    assert_three_hours(imported.candles)
    with pytest.raises(DataError, match="no base-asset volume column"):
        import_candle_csv(source, fmt="cryptodatadownload")


def test_bad_values_are_reported_not_repaired(capsys, tmp_path: Path):
    # out of order (but not newest-first throughout, so kept as is) and a price that is not a number
    iso = ["2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z", "2024-01-01T01:00:00Z"]
    text = "timestamp,open,high,low,close,volume\n" + rows(iso).replace("1.2,1.3", "n/a,1.3")
    source = write(tmp_path, text)
    code, out, _ = run(capsys, "import-csv", str(source), "--out", str(tmp_path / "bad.parquet"))
    assert code == 1 and "rows reversed" not in out  # written as read, but not usable: exit 1 after the report
    assert "non-monotonic timestamps" in out and "NaN values" in out and "refuse it" in out
    candles = load_candles(tmp_path / "bad.parquet")
    assert len(candles) == 3 and list(candles.index.strftime("%H")) == ["00", "02", "01"]
    assert np.isnan(candles["open"].iloc[2])


def test_newest_first_file_with_a_repeated_hour_is_reversed_and_the_duplicate_reported(tmp_path: Path):
    iso = ["2024-01-01T01:00:00Z", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"]
    imported = import_candle_csv(write(tmp_path, "timestamp,open,high,low,close,volume\n" + rows(iso)))
    assert "rows reversed" in imported.description
    assert list(imported.candles.index.strftime("%H")) == ["00", "00", "01"]
    assert imported.candles["volume"].tolist() == [4.0, 3.0, 10.0]  # whole rows, in reverse file order
    report = validate_candles(imported.candles)
    assert [p.kind for p in report.errors] == ["duplicate timestamps"]


def test_unreadable_times_name_the_values(tmp_path: Path):
    with pytest.raises(DataError, match=r"unreadable times in 'timestamp' such as \['yesterday'\]"):
        import_candle_csv(write(tmp_path, "timestamp,open,high,low,close,volume\nyesterday,1,2,0.5,1.5,1\n"))
    with pytest.raises(DataError, match="not epoch seconds"):
        import_candle_csv(write(tmp_path, "timestamp,open,high,low,close,volume\n20240101,1,2,0.5,1.5,1\n"))


def test_missing_file_and_bad_timeframe_are_usage_errors(capsys, tmp_path: Path):
    with pytest.raises(UsageError, match="CSV file not found"):
        import_candle_csv(tmp_path / "nowhere.csv")
    source = write(tmp_path, rows(MS))
    args = ["import-csv", str(source), "--out", str(tmp_path / "x.parquet"), "--timeframe", "1x"]
    code, _, err = run(capsys, *args)
    assert code == 2 and "bad timeframe '1x'" in err


@pytest.mark.parametrize(
    ("name", "normalised"),
    [
        ("Open Time", "open_time"), ("openTime", "open_time"), ("Volume (BTC)", "volume_btc"),
        (" Close ", "close"),
    ],
)
def test_header_names_are_normalised(name: str, normalised: str):
    assert normalise(name) == normalised


def test_the_sample_written_back_as_cryptodatadownload_imports_to_itself(sample_path: Path, tmp_path: Path):
    # the shipped sample's documented conversion, replayed: its original layout, newest row first
    sample = load_candles(sample_path)
    frame = sample.iloc[::-1]
    dates = frame.index.strftime("%Y-%m-%d %I-%p")
    prices = {c: frame[c].to_numpy() for c in ("open", "high", "low", "close")}
    text = "Timestamps are UTC timezone,https://www.CryptoDataDownload.com\n" + pd.DataFrame({
        "date": dates, "symbol": "BTCUSD", **prices,
        "volume_btc": frame["volume"].to_numpy(), "volume": (frame["volume"] * frame["close"]).to_numpy(),
    }).to_csv(index=False, float_format="%.10g")
    source = write(tmp_path, text, "Coinbase_BTCUSD_1h.csv")
    imported = import_candle_csv(source)
    assert imported.layout == "cryptodatadownload"
    pd.testing.assert_frame_equal(imported.candles, sample, check_freq=False)
    assert imported.candles.attrs == sample.attrs


def test_an_empty_epoch_time_is_named(tmp_path: Path):
    text = "timestamp,open,high,low,close,volume\n" + rows([MS[0], "", MS[2]])
    with pytest.raises(DataError, match=r"unreadable times in 'timestamp' such as \['\(empty\)'\]"):
        import_candle_csv(write(tmp_path, text))
