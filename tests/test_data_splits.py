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
