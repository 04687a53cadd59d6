"""Time-ordered splits: train / validation / test and walk-forward folds, never shuffled across time.

An embargo of `k` bars drops the `k` bars between consecutive splits, so features or labels that span a few bars
(indicators, the pattern reward's forward horizon) cannot leak from one split into the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd

from r1trade.config import SplitConfig
from r1trade.errors import ConfigError

SPLIT_NAMES = ("train", "validation", "test")


@dataclass(frozen=True)
class Splits:
    train: pd.DataFrame
    validation: pd.DataFrame
    test: pd.DataFrame

    def get(self, name: str) -> pd.DataFrame:
        if name not in SPLIT_NAMES:
            raise ConfigError(f"unknown split '{name}': use one of {', '.join(SPLIT_NAMES)}")
        return getattr(self, name)

    def describe(self) -> dict[str, dict[str, str | int | None]]:
        """Row counts and time ranges, recorded with each run."""
        return {name: _describe(self.get(name)) for name in SPLIT_NAMES}


def _describe(frame: pd.DataFrame) -> dict[str, str | int | None]:
    if frame.empty:
        return {"rows": 0, "start": None, "end": None}
    return {"rows": len(frame), "start": frame.index[0].isoformat(), "end": frame.index[-1].isoformat()}


def _cut(candles: pd.DataFrame, ends: tuple[int, int], embargo: int) -> Splits:
    """Split at positional boundaries `ends` (exclusive ends of train and validation), dropping `embargo` bars."""
    train_end, val_end = ends
    parts = (
        candles.iloc[:train_end],
        candles.iloc[min(train_end + embargo, val_end) : val_end],
        candles.iloc[val_end + embargo :],
    )
    for part in parts:
        part.attrs = dict(candles.attrs)
    splits = Splits(*parts)
    if splits.train.empty or splits.test.empty:
        raise ConfigError(
            f"split leaves an empty train or test set ({len(candles)} bars, embargo {embargo}): "
            "adjust data.split"
        )
    return splits


def split_by_fraction(
    candles: pd.DataFrame, *, train: float, validation: float, embargo_bars: int = 0
) -> Splits:
    """First `train` of the bars, then `validation`, then the rest as test."""
    n = len(candles)
    train_end = int(round(n * train))
    val_end = int(round(n * (train + validation)))
    return _cut(candles, (train_end, val_end), embargo_bars)


def split_by_dates(
    candles: pd.DataFrame, *, train_end: pd.Timestamp, validation_end: pd.Timestamp, embargo_bars: int = 0
) -> Splits:
    """Train up to and including `train_end`, validation up to `validation_end`, test after it."""
    index = candles.index
    train_stop = int(index.searchsorted(_utc(train_end), side="right"))
    val_stop = int(index.searchsorted(_utc(validation_end), side="right"))
    return _cut(candles, (train_stop, val_stop), embargo_bars)


def make_splits(candles: pd.DataFrame, config: SplitConfig) -> Splits:
    """Apply a `data.split` config section."""
    if config.method == "dates":
        assert config.train_end is not None and config.validation_end is not None  # checked by the config
        return split_by_dates(
            candles,
            train_end=pd.Timestamp(config.train_end),
            validation_end=pd.Timestamp(config.validation_end),
            embargo_bars=config.embargo_bars,
        )
    return split_by_fraction(
        candles, train=config.train, validation=config.validation, embargo_bars=config.embargo_bars
    )


def walk_forward(
    candles: pd.DataFrame,
    *,
    train_bars: int,
    test_bars: int,
    embargo_bars: int = 0,
    expanding: bool = False,
) -> Iterator[tuple[pd.DataFrame, pd.DataFrame]]:
    """Successive (train, test) folds marching forward by `test_bars`; test windows never overlap.

    With `expanding`, every fold's train window starts at the first bar; otherwise it is a rolling window
    of `train_bars` bars ending `embargo_bars` before its test window.
    """
    if train_bars <= 0 or test_bars <= 0 or embargo_bars < 0:
        raise ConfigError("walk_forward needs train_bars > 0, test_bars > 0 and embargo_bars >= 0")
    start = 0
    while True:
        train_stop = start + train_bars
        test_start = train_stop + embargo_bars
        test_stop = test_start + test_bars
        if test_stop > len(candles):
            return
        train_start = 0 if expanding else start
        yield candles.iloc[train_start:train_stop], candles.iloc[test_start:test_stop]
        start += test_bars


def _utc(ts: pd.Timestamp) -> pd.Timestamp:
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
