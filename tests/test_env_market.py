"""Market replay features, sentiment import and proxy, and the no-look-ahead property of every feature."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ta
from env_fixtures import random_candles

from r1trade.env.market import MarketReplay, format_price, parse_indicator
from r1trade.env.sentiment import (
    PROXY_SOURCE,
    align_sentiment,
    load_sentiment_csv,
    market_sentiment_proxy,
    sentiment_label,
)
from r1trade.errors import ConfigError, DataError

ALL_INDICATORS = ["rsi_14", "macd_hist", "bb_pctb", "bb_pctb_10", "atr_14", "sma_20", "ema_50", "volume_z",
                  "volume_z_10", "roc_12", "adx_14"]


def test_indicator_names_parse_and_bad_ones_are_explained() -> None:
    spec = parse_indicator("rsi_7")
    assert (spec.kind, spec.window, spec.label) == ("rsi", 7, "RSI7")
    assert parse_indicator("bb_pctb").window == 20 and parse_indicator("volume_z").label == "VolZ"
    for bad in ("rsi_", "macd_hist_3", "sma", "foo_3", "rsi_0", "RSI_14"):
        with pytest.raises(ConfigError):
            parse_indicator(bad)


def test_features_are_in_display_units() -> None:
    candles = random_candles(200, seed=1)
    replay = MarketReplay.build(candles, indicators=["rsi_14", "sma_20", "atr_14"])
    close = candles["close"]
    t = 150
    expected_sma = (close.iloc[t] / close.iloc[t - 19 : t + 1].mean() - 1) * 100
    assert replay.feature_values["sma_20"][t] == pytest.approx(expected_sma)
    expected_atr = ta.volatility.AverageTrueRange(candles.high, candles.low, close, 14).average_true_range()
    assert replay.feature_values["atr_14"][t] == pytest.approx(expected_atr.iloc[t] / close.iloc[t] * 100)
    assert replay.feature_text["sma_20"][t] == f"SMA20 {expected_sma:+.2f}%"
    assert replay.feature_text["rsi_14"][3] == "RSI14 n/a"  # not enough history yet


def test_price_formatting() -> None:
    assert format_price(11234.56) == "11234.6"
    assert format_price(0.000123456) == "0.00012346"
    assert format_price(float("nan")) == "n/a"


@pytest.mark.parametrize("cut", [60, 137, 250])
def test_no_feature_at_bar_t_depends_on_later_bars(cut: int) -> None:
    candles = random_candles(300, seed=2)
    altered = candles.copy()
    rng = np.random.default_rng(99)
    future = altered.index[cut + 1 :]
    scale = rng.uniform(0.5, 2.0, len(future))
    for column in ("open", "high", "low", "close"):
        altered.loc[future, column] *= scale
    altered.loc[future, "volume"] = rng.uniform(100, 1000, len(future))
    first = MarketReplay.build(candles, indicators=ALL_INDICATORS)
    second = MarketReplay.build(altered, indicators=ALL_INDICATORS)
    for name in ALL_INDICATORS:
        assert first.feature_text[name][: cut + 1] == second.feature_text[name][: cut + 1], name
        np.testing.assert_array_equal(
            first.feature_values[name][: cut + 1], second.feature_values[name][: cut + 1]
        )
        assert first.feature_text[name][cut + 1 :] != second.feature_text[name][cut + 1 :]
    np.testing.assert_array_equal(first.sentiment[: cut + 1], second.sentiment[: cut + 1])
    np.testing.assert_array_equal(first.volatility[: cut + 1], second.volatility[: cut + 1])
    assert first.candle_lines[: cut + 1] == second.candle_lines[: cut + 1]


def test_sentiment_proxy_is_bounded_and_labelled() -> None:
    candles = random_candles(400, seed=3)
    values = market_sentiment_proxy(candles)
    assert np.isnan(values[:24]).all()
    assert np.nanmin(values) >= 0 and np.nanmax(values) <= 100
    assert np.nanstd(values) > 5  # it moves
    replay = MarketReplay.build(candles, indicators=["rsi_14"])
    assert replay.sentiment_source == PROXY_SOURCE
    assert [sentiment_label(v) for v in (10, 30, 50, 60, 90)] == [
        "Extreme Fear", "Fear", "Neutral", "Greed", "Extreme Greed"
    ]


def test_sentiment_csv_import_and_alignment_never_uses_a_later_value(tmp_path: Path) -> None:
    path = tmp_path / "fng.csv"
    path.write_text("date,value,classification\n2024-01-02,70,Greed\n2024-01-01,20,Extreme Fear\n")
    series = load_sentiment_csv(path)
    assert series.tolist() == [20.0, 70.0] and series.index.tz is not None
    assert series.attrs["source"] == "sentiment file fng.csv"
    candles = random_candles(48)  # hourly from 2024-01-01 00:00
    replay = MarketReplay.build(candles, indicators=["rsi_14"], sentiment=series)
    # Bar 22 (22:00) closes at 23:00, before the 2024-01-02 value exists; bar 23 closes at midnight: it does.
    assert replay.sentiment[22] == 20.0 and replay.sentiment[23] == 70.0
    assert replay.sentiment_source == "sentiment file fng.csv"
    early = align_sentiment(series, pd.DatetimeIndex(["2023-12-31 12:00"], tz="UTC"))
    assert math.isnan(early[0])


def test_sentiment_csv_with_unix_seconds_and_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "unix.csv"
    good.write_text("timestamp,fng_value\n1704067200,55\n")
    assert load_sentiment_csv(good).index[0] == pd.Timestamp("2024-01-01", tz="UTC")
    bad = tmp_path / "bad.csv"
    bad.write_text("when,score\n2024-01-01,55\n")
    with pytest.raises(DataError, match="need a time column"):
        load_sentiment_csv(bad)
    out_of_range = tmp_path / "range.csv"
    out_of_range.write_text("date,value\n2024-01-01,155\n")
    with pytest.raises(DataError, match=r"line\(s\) \[2\]"):
        load_sentiment_csv(out_of_range)


def test_too_short_data_is_refused() -> None:
    with pytest.raises(DataError):
        MarketReplay.build(random_candles(1), indicators=["rsi_14"])
