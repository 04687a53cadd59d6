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


def _cut(candles: pd.DataFrame, ends: tuple[int, int, int], embargo: int) -> Splits:
    """Split at positional boundaries `ends` (exclusive ends of train, validation and test), dropping `embargo`
    bars between consecutive splits."""
    train_end, val_end, test_end = ends
    parts = (
        candles.iloc[:train_end],
        candles.iloc[min(train_end + embargo, val_end) : val_end],
        candles.iloc[val_end + embargo : test_end],
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
    return _cut(candles, (train_end, val_end, n), embargo_bars)


def split_by_dates(
    candles: pd.DataFrame,
    *,
    train_end: pd.Timestamp,
    validation_end: pd.Timestamp,
    test_end: pd.Timestamp | None = None,
    embargo_bars: int = 0,
) -> Splits:
    """Train up to and including `train_end`, validation up to `validation_end` (none if it is `train_end`),
    test after it up to `test_end` (default: the last bar)."""
    index = candles.index
    train_stop = int(index.searchsorted(_utc(train_end), side="right"))
    val_stop = int(index.searchsorted(_utc(validation_end), side="right"))
    test_stop = len(index) if test_end is None else int(index.searchsorted(_utc(test_end), side="right"))
    return _cut(candles, (train_stop, val_stop, test_stop), embargo_bars)


def make_splits(candles: pd.DataFrame, config: SplitConfig) -> Splits:
    """Apply a `data.split` config section."""
    if config.method == "dates":
        assert config.train_end is not None and config.validation_end is not None  # checked by the config
        return split_by_dates(
            candles,
            train_end=pd.Timestamp(config.train_end),
            validation_end=pd.Timestamp(config.validation_end),
            test_end=None if config.test_end is None else pd.Timestamp(config.test_end),
            embargo_bars=config.embargo_bars,
        )
    return split_by_fraction(
        candles, train=config.train, validation=config.validation, embargo_bars=config.embargo_bars
    )


def after_train(candles: pd.DataFrame, splits: Splits, embargo: int) -> pd.DataFrame:
    """Every bar after the train split, less the `embargo` bars right after it (a walk-forward's span "all")."""
    start = int(candles.index.searchsorted(splits.train.index[-1], side="right")) + embargo
    span = candles.iloc[start:]
    span.attrs = dict(candles.attrs)
    return span


def fold_bounds(bars: int, folds: int, embargo: int) -> list[tuple[int, int]]:
    """(first, last) positions, inclusive, of `folds` consecutive folds of `bars` bars, `embargo` bars apart.

    The bars left after the gaps are shared out as evenly as possible, the earlier folds taking one extra.
    """
    if folds < 2:
        raise ConfigError(f"a walk-forward needs 2 or more folds, not {folds}")
    usable = bars - (folds - 1) * embargo
    size, extra = divmod(max(usable, 0), folds)
    if size < 1:
        raise ConfigError(
            f"{bars} bars cannot hold {folds} folds {embargo} bars apart (data.split.embargo_bars): use fewer folds"
        )
    bounds, first = [], 0
    for k in range(folds):
        last = first + size + (k < extra) - 1
        bounds.append((first, last))
        first = last + 1 + embargo
    return bounds


@dataclass(frozen=True)
class Fold:
    """Walk-forward fold `number` (from 1) in positions of the whole candle series: its test window is bars
    `test_first` to `test_last`, and the agent trained for it sees bars 0 to `train_stop` - 1, every bar before
    the window less the embargo right before it (an expanding window)."""

    number: int
    train_stop: int
    test_first: int
    test_last: int


def expanding_folds(start: int, bars: int, folds: int, embargo: int) -> list[Fold]:
    """The `folds` folds (`fold_bounds`) of the `bars` bars from position `start`, each training on every bar
    up to `embargo` bars before its test window, as the train split ends `embargo` bars before the next split."""
    cut = []
    for number, (first, last) in enumerate(fold_bounds(bars, folds, embargo), start=1):
        train_stop = start + first - embargo
        if train_stop < 1:
            raise ConfigError(
                f"walk-forward fold {number} starts at bar {start + first}: no bar lies {embargo} bars "
                "(data.split.embargo_bars) before it to train on; cut the folds from a later split"
            )
        cut.append(Fold(number, train_stop, start + first, start + last))
    return cut


def walk_forward_folds(
    candles: pd.DataFrame, config: SplitConfig, *, folds: int, span: str, split: str
) -> list[Fold]:
    """The folds a walk-forward over `candles` cuts (as `backtest --walk-forward`): from the split named `split`
    of `config` (span "split"), or from every bar after the train split and its embargo (span "all")."""
    splits = make_splits(candles, config)
    evaluated = splits.get(split) if span == "split" else after_train(candles, splits, config.embargo_bars)
    start = int(candles.index.searchsorted(evaluated.index[0])) if len(evaluated) else len(candles)
    return expanding_folds(start, len(evaluated), folds, config.embargo_bars)


def train_then_test(*, train_end: pd.Timestamp, test_end: pd.Timestamp, embargo_bars: int) -> SplitConfig:
    """A `data.split` by dates without a validation split: train up to `train_end`, then, `embargo_bars` later,
    test up to `test_end`. A walk-forward fold's agent trains on such a split (its test split is the fold's
    window), and a model plays the span after the train split as the test split of one."""
    train = train_end.to_pydatetime()
    return SplitConfig(
        method="dates", train_end=train, validation_end=train, test_end=test_end.to_pydatetime(),
        embargo_bars=embargo_bars,
    )


def fold_split(candles: pd.DataFrame, fold: Fold, embargo: int) -> SplitConfig:
    """The `data.split` of `fold`'s agent: its training bars as the train split, its window as the test split."""
    index = candles.index
    return train_then_test(
        train_end=index[fold.train_stop - 1], test_end=index[fold.test_last], embargo_bars=embargo
    )


def describe_fold_split(config: SplitConfig) -> str:
    """A fold agent's data (`fold_split`) in words, for messages; any other split by its method."""
    if config.train_end is None or config.test_end is None:
        return f"data.split method {config.method}"
    return (
        f"training up to {config.train_end:%Y-%m-%d %H:%M} UTC and a test window up to "
        f"{config.test_end:%Y-%m-%d %H:%M} UTC"
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
