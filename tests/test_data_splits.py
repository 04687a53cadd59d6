import numpy as np
import pandas as pd
import pytest

from r1trade.config import SplitConfig
from r1trade.data.splits import make_splits, split_by_dates, split_by_fraction, walk_forward
from r1trade.errors import ConfigError


def test_fraction_split_is_ordered_and_complete(candles):
    splits = split_by_fraction(candles, train=0.7, validation=0.1)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (350, 50, 100)
    assert splits.train.index[-1] < splits.validation.index[0] < splits.validation.index[-1] < splits.test.index[0]
    pd.testing.assert_frame_equal(pd.concat([splits.train, splits.validation, splits.test]), candles)


def test_embargo_drops_bars_between_splits(candles):
    splits = split_by_fraction(candles, train=0.7, validation=0.1, embargo_bars=5)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (350, 45, 95)
    assert splits.validation.index[0] == candles.index[355]
    assert splits.test.index[0] == candles.index[405]


def test_date_split_includes_the_end_timestamps(candles):
    splits = split_by_dates(
        candles,
        train_end=pd.Timestamp("2021-01-05 23:00"),
        validation_end=pd.Timestamp("2021-01-10 23:00", tz="UTC"),
        embargo_bars=2,
    )
    assert splits.train.index[-1] == pd.Timestamp("2021-01-05 23:00", tz="UTC")
    assert splits.validation.index[0] == pd.Timestamp("2021-01-06 02:00", tz="UTC")
    assert splits.test.index[0] == pd.Timestamp("2021-01-11 02:00", tz="UTC")


def test_make_splits_from_config_and_description(candles):
    splits = make_splits(candles, SplitConfig(train=0.5, validation=0.25, test=0.25))
    info = splits.describe()
    assert info["train"] == {"rows": 250, "start": "2021-01-01T00:00:00+00:00", "end": "2021-01-11T09:00:00+00:00"}
    assert info["test"]["rows"] == 125
    assert splits.test.attrs["symbol"] == "TEST/USD"


def test_empty_test_split_is_refused(candles):
    with pytest.raises(ConfigError, match="empty train or test"):
        split_by_dates(candles, train_end=pd.Timestamp("2030-01-01"), validation_end=pd.Timestamp("2031-01-01"))


def test_walk_forward_rolling_and_expanding(candles):
    folds = list(walk_forward(candles, train_bars=200, test_bars=100, embargo_bars=10))
    assert len(folds) == 2  # third fold would need bars up to 510
    (train0, test0), (train1, test1) = folds
    assert (train0.index[0], train0.index[-1]) == (candles.index[0], candles.index[199])
    assert (test0.index[0], test0.index[-1]) == (candles.index[210], candles.index[309])
    assert train1.index[0] == candles.index[100] and test1.index[0] == candles.index[310]
    expanding = list(walk_forward(candles, train_bars=200, test_bars=100, expanding=True))
    assert [len(train) for train, _ in expanding] == [200, 300, 400]
    assert all(train.index[-1] < test.index[0] for train, test in expanding)


def test_split_edges_count_sign_repeats_per_split():
    """Hand-worked: 2-bar intervals; train rises every interval (3 pairs, all repeat), validation is too short for a
    pair, test alternates up and down (2 pairs, none repeat)."""
    from r1trade.config import load_config
    from r1trade.data.source import split_edges

    train = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]  # ends 100, 102, 104, 106, 108: + + + +, 3 pairs
    validation = [108, 107]  # one end: no change, no pair
    test = [100, 101, 102, 101, 100, 101, 102, 103]  # ends 100, 102, 100, 102: + - +, 2 pairs
    close = np.array(train + validation + test, dtype=float)
    index = pd.date_range("2021-01-01", periods=len(close), freq="1h", tz="UTC", name="timestamp")
    candles = pd.DataFrame(
        {"open": close, "high": close + 1, "low": close - 1, "close": close, "volume": 1.0}, index=index
    )
    config = load_config(
        "smoke",
        ["env.decision_every=2", "data.split.method=fraction", "data.split.train=0.5",
         "data.split.validation=0.1", "data.split.test=0.4", "data.split.embargo_bars=0"],
    )
    edges = split_edges(config, candles)
    assert (edges["train"].pairs, edges["train"].repeat_rate) == (3, 1.0)
    assert edges["validation"].pairs == 0
    assert (edges["test"].pairs, edges["test"].repeat_rate) == (2, 0.0)
