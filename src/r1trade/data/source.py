"""A config's candles, whichever source its `data` section names: a candle file or a seeded generator."""

from __future__ import annotations

import pandas as pd

from r1trade.config import Config, resolve_path
from r1trade.data.splits import SPLIT_NAMES, make_splits
from r1trade.data.store import ValidationReport, load_candles, load_clean_candles, validate_candles
from r1trade.data.synthetic import DecisionGrid, EdgeStats, decision_grid, measure_edge, synthetic_candles
from r1trade.errors import DataError


def synthetic_interval(config: Config) -> int:
    """Bars per planted interval: `data.synthetic.interval`, else `env.decision_every`."""
    return config.data.synthetic.interval or config.env.decision_every


def read_config_candles(config: Config) -> pd.DataFrame:
    """Candles of `config.data` (the file at `data.path`, or generated), not validated (for `data-info`)."""
    if config.data.source == "file":
        return load_candles(resolve_path(config.data.path))
    return synthetic_candles(config.data.synthetic, interval=synthetic_interval(config))


def load_config_candles(config: Config) -> tuple[pd.DataFrame, ValidationReport]:
    """Validated candles of `config.data` (the file at `data.path`, or generated) and their validation report.

    The one place runs get their candles from (env replays, backtests, run records).
    """
    if config.data.source == "file":
        return load_clean_candles(resolve_path(config.data.path))
    candles = read_config_candles(config)
    report = validate_candles(candles)
    if not report.ok:  # a generator bug, never the user's data
        details = "; ".join(problem.describe() for problem in report.errors)
        raise DataError(f"generated candles fail validation: {details}")
    return candles, report


def source_key(config: Config) -> tuple:
    """What identifies the candles of `config.data` (for caches): the file and its mtime, or the generator."""
    if config.data.source == "file":
        path = resolve_path(config.data.path)
        return ("file", str(path), path.stat().st_mtime_ns if path.exists() else None)
    return ("synthetic", config.data.synthetic.model_dump_json(), synthetic_interval(config))


def describe_source(config: Config) -> str:
    """`data/sample/btc_usd_1h.parquet`, or `synthetic planted_edge (p=0.8, seed=0, interval 4 bars)`."""
    if config.data.source == "file":
        return config.data.path
    synthetic = config.data.synthetic
    return (
        f"synthetic {synthetic.kind} (p={synthetic.p:g}, seed={synthetic.seed}, interval "
        f"{synthetic_interval(config)} bars)"
    )


def split_edges(config: Config, candles: pd.DataFrame) -> dict[str, EdgeStats]:
    """How often an `env.decision_every`-bar interval's sign repeats the previous one's, per split.

    The naive edge a momentum (> 0.5) or reversal (< 0.5) rule on the last interval has, counted on the split's
    own grid: generated data on its planted intervals, a candle file on intervals from the split's first bar.
    """
    splits = make_splits(candles, config.data.split)
    fallback = DecisionGrid(every=config.env.decision_every, first=0)
    parts = {name: splits.get(name) for name in SPLIT_NAMES}
    return {
        name: measure_edge(part, decision_grid(part) or fallback) for name, part in parts.items() if len(part)
    }
