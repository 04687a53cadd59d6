"""A config's candles, whichever source its `data` section names: candle files or a seeded generator.

A config with several candle files (`data.paths`: assets or bar lengths) is handled as one config per file
(`asset_configs`); the functions here that read candles take one of those.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from r1trade.config import Config, load_config
from r1trade.data.splits import SPLIT_NAMES, Splits, make_splits
from r1trade.data.store import (
    ValidationReport,
    candle_file_timeframe,
    load_candles,
    load_clean_candles,
    timeframe_to_timedelta,
    validate_candles,
)
from r1trade.data.synthetic import DecisionGrid, EdgeStats, decision_grid, measure_edge, synthetic_candles
from r1trade.errors import DataError, UsageError


def synthetic_interval(config: Config) -> int:
    """Bars per planted interval: `data.synthetic.interval`, else `env.decision_every`."""
    return config.data.synthetic.interval or config.env.decision_every


def asset_configs(config: Config) -> list[Config]:
    """One config per candle file of `data.paths`, each naming its file as `data.path`; else `[config]`."""
    if not config.data.paths:
        return [config]
    return [
        config.model_copy(update={"data": config.data.model_copy(update={"path": path, "paths": []})})
        for path in config.data.paths
    ]


def asset_labels(assets: list[Config]) -> list[str]:
    """Short, distinct names of one-file configs' candles, for report folders and tables: each file's name
    without its suffix (`btc_usd_1h`; numbered `1-...`, `2-...` when two files share one), or `synthetic`."""
    stems = [Path(a.data.path).stem if a.data.source == "file" else "synthetic" for a in assets]
    if len(set(stems)) == len(stems):
        return stems
    return [f"{number}-{stem}" for number, stem in enumerate(stems, start=1)]


def _one_file(config: Config) -> None:
    """Refuse a config with several candle files where one set of candles is read."""
    if len(config.data.paths) > 1:
        raise UsageError(
            f"data.paths lists {len(config.data.paths)} candle files and this command reads one: name it "
            "instead (data-info FILE, backtest --data FILE, or --set data.paths=[] --set data.path=FILE)"
        )


def read_config_candles(config: Config) -> pd.DataFrame:
    """Candles of `config.data` (the file at `data.path`, or generated), not validated (for `data-info`)."""
    _one_file(config)
    if config.data.source == "file":
        return load_candles(Path(config.data.path))
    return synthetic_candles(config.data.synthetic, interval=synthetic_interval(config))


def load_config_candles(config: Config) -> tuple[pd.DataFrame, ValidationReport]:
    """Validated candles of `config.data` (the file at `data.path`, or generated) and their validation report.

    The one place runs get their candles from (env replays, backtests, run records).
    """
    _one_file(config)
    if config.data.source == "file":
        return load_clean_candles(Path(config.data.path))
    candles = read_config_candles(config)
    report = validate_candles(candles)
    if not report.ok:  # a generator bug, never the user's data
        details = "; ".join(problem.describe() for problem in report.errors)
        raise DataError(f"generated candles fail validation: {details}")
    return candles, report


def load_config_splits(config: Config) -> list[Splits]:
    """The splits (`data.split`) of each of the config's candle files (`asset_configs`), each file read once: what
    a training run builds its replays from and records."""
    return [make_splits(load_config_candles(asset)[0], asset.data.split) for asset in asset_configs(config)]


def candle_timeframe(config: Config) -> str | None:
    """The bar length of one-file `config`'s candles (`asset_configs`): generated, `data.synthetic.timeframe`; a
    file, the timeframe it states or its bar spacing; None for a file that is not there or cannot be read."""
    _one_file(config)
    if config.data.source == "synthetic":
        return config.data.synthetic.timeframe
    path = Path(config.data.path)
    if not path.is_file():
        return None
    try:
        return candle_file_timeframe(path)
    except DataError:
        return None


def checkpoint_timeframes(checkpoint: Path) -> set[str]:
    """The bar lengths of the candles a checkpoint (or a walk-forward run) trained on, as its `config.yaml` names
    them; empty when they cannot be told (no config, candle files gone)."""
    saved = checkpoint / "config.yaml"
    if not saved.is_file():
        return set()
    return {tf for asset in asset_configs(load_config(saved)) if (tf := candle_timeframe(asset))}


def check_checkpoint_timeframe(checkpoint: Path, config: Config) -> None:
    """Refuse to play a checkpoint on `config`'s candles when their bar length is not one it trained on
    (`refuse_timeframe_change`)."""
    trained = checkpoint_timeframes(checkpoint)
    for asset in asset_configs(config):
        refuse_timeframe_change(checkpoint, trained, candle_timeframe(asset), describe_source(asset))


def refuse_timeframe_change(checkpoint: Path, trained: set[str], timeframe: str | None, candles: str) -> None:
    """Refuse `candles` of bar length `timeframe` for a checkpoint `trained` on others: a policy that learnt what a
    4-bar move of hourly bars means reads 4h bars as the same, a day as four hours. Nothing is refused when either
    side cannot be told (None, or an empty `trained`)."""
    lengths = {timeframe_to_timedelta(known) for known in trained}  # 60m is 1h
    if lengths and timeframe is not None and timeframe_to_timedelta(timeframe) not in lengths:
        raise UsageError(
            f"'{checkpoint}' was trained on {' and '.join(sorted(trained))} candles and {candles} holds "
            f"{timeframe} candles: give candles of its bar length, or pass --allow-timeframe-change"
        )


def source_key(config: Config) -> tuple:
    """What identifies the candles of `config.data` (for caches): the file and its mtime, or the generator."""
    _one_file(config)
    if config.data.source == "file":
        path = Path(config.data.path)
        return ("file", str(path), path.stat().st_mtime_ns if path.exists() else None)
    return ("synthetic", config.data.synthetic.model_dump_json(), synthetic_interval(config))


def describe_source(config: Config) -> str:
    """`data/sample/btc_usd_1h.parquet` (several files: their paths joined by commas), or
    `synthetic planted_edge (p=0.8, seed=0, interval 4 bars)`."""
    if config.data.source == "file":
        return ", ".join(config.data.paths or [config.data.path])
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
