"""`r1trade train`: build models and environments from a config, train with a live progress bar, save the run.

With `train.walk_forward` K it trains K agents one after another, each a run of its own in
`runs/<name>/fold-<k>/`: fold k's agent trains on every bar before fold k's test window less
`data.split.embargo_bars` (an expanding window), the test windows being the K folds that
`backtest --walk-forward K` cuts from `backtest.split` (or, with `train.walk_forward_span: all`, from every bar
after the train split). Each fold's `config.yaml` holds that data as a `data.split` by dates (train up to the
bar before the embargo, no validation split, test up to the window's last bar), so its splits.json, probes and
replays are the fold's. Training reads nothing but the train split, so there is no validation data to stop on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from r1trade.config import Config, load_config
from r1trade.data.source import asset_configs, asset_labels, load_config_candles, load_config_splits
from r1trade.data.splits import Splits, describe_fold_split, fold_split, walk_forward_folds
from r1trade.env.trading_env import make_envs
from r1trade.errors import ConfigError, UsageError
from r1trade.models.loading import load_agent_models
from r1trade.outputs import clear_run_folder, fold_run_dir, has_run, locked_run_folder, write_file
from r1trade.rl.checkpoint import seed_random_states
from r1trade.rl.checkpoint_paths import latest_checkpoint, list_checkpoints
from r1trade.rl.trainer import Trainer


def train_run(
    config: Config, run_dir: Path, *, resume: bool = False, force: bool = False, console: Console | None = None
) -> Path:
    """Train `config` into `run_dir` (resuming from its last checkpoint if asked); returns the final checkpoint,
    or with `train.walk_forward` the run folder of the fold agents (`_train_folds`)."""
    console = console or Console()
    if config.train.engine == "trl":  # what TRL cannot honour is refused before the run folder is touched
        from r1trade.integrations.trl.settings import check_trl_settings

        check_trl_settings(config)
    if config.train.walk_forward is not None:
        return _train_folds(config, run_dir, resume=resume, force=force, console=console)
    return _train_agent(config, run_dir, resume=resume, force=force, console=console)


def _train_agent(config: Config, run_dir: Path, *, resume: bool, force: bool, console: Console) -> Path:
    """Train one agent of `config` into `run_dir`; returns its final checkpoint.

    The run folder is locked for the whole run. A fresh run refuses a folder that holds an earlier run unless
    `force` clears it; a resumed run needs a complete checkpoint before any data or model is loaded, and rewrites
    its config only once that checkpoint has loaded."""
    with locked_run_folder(run_dir):
        if not resume:
            _claim_fresh(run_dir, force=force)
        elif latest_checkpoint(run_dir) is None:
            raise UsageError(f"cannot resume: '{run_dir}' has no complete checkpoint")
        seed_random_states(config.seed)  # torch's, NumPy's and Python's: a resumed run then draws as this one
        splits = load_config_splits(config)  # each candle file read and split once, for the replays and the record
        make_envs(config, 1, "train", splits)  # builds (and caches) the market replays, failing early on bad data
        models = load_agent_models(config.model, seed=config.seed) if config.train.engine == "r1trade" else None
        writer = _tensorboard(run_dir) if config.train.tensorboard else None
        try:
            with _progress(config, console) as (progress, task):

                def on_update(metrics: dict) -> None:
                    progress.update(task, completed=metrics["update"], figures=_figures(metrics))
                    for warning in metrics.get("warnings", []):
                        progress.console.print(f"[yellow]update {metrics['update']}: {warning}[/yellow]")
                    if writer is not None:
                        _write_scalars(writer, metrics)

                if models is None:  # train.engine trl: TRL's GRPOTrainer on the same env, into this run folder
                    from r1trade.integrations.trl.engine import TRLTrainer

                    trainer = TRLTrainer(config, run_dir, on_update=on_update)
                else:
                    trainer = Trainer(
                        config, models, lambda n: make_envs(config, n, "train"), run_dir, on_update=on_update
                    )
                if resume:
                    _resume(trainer, run_dir)
                    progress.update(task, completed=trainer.state.step)
                write_file(run_dir / "config.yaml", config.to_yaml())
                _record_splits(config, splits, run_dir)
                return trainer.train()
        finally:
            if writer is not None:
                writer.close()


def _train_folds(config: Config, run_dir: Path, *, resume: bool, force: bool, console: Console) -> Path:
    """Train one agent per walk-forward fold (`fold_configs`) into `run_dir`/fold-<k>/, one after another, with
    `_train_agent`; returns `run_dir`, which keeps the config as given.

    A resumed run skips the folds that have finished `train.updates`, continues a fold from its last checkpoint
    and starts a fold that has none; it refuses when every fold has finished, or when a fold's data is no longer
    what it was trained on (the data or the split keys changed)."""
    folds = fold_configs(config)
    with locked_run_folder(run_dir):
        if not resume:
            _claim_fresh(run_dir, force=force)
        done = [_finished_updates(fold_run_dir(run_dir, number)) for number in range(1, len(folds) + 1)]
        if resume:
            _check_resumable(run_dir, folds, done)
        write_file(run_dir / "config.yaml", config.to_yaml())
        for number, (fold, finished) in enumerate(zip(folds, done, strict=True), start=1):
            fold_dir = fold_run_dir(run_dir, number)
            if finished >= fold.train.updates:
                console.print(f"fold {number} of {len(folds)}: already trained ({finished} updates), skipped")
                continue
            console.print(f"fold {number} of {len(folds)}: {describe_fold_split(fold.data.split)}")
            checkpoint = _train_agent(fold, fold_dir, resume=finished > 0, force=True, console=console)
            console.print(f"fold {number}: final checkpoint {checkpoint}", markup=False, highlight=False)
    return run_dir


def _claim_fresh(run_dir: Path, *, force: bool) -> None:
    """A fresh run refuses a folder that holds an earlier run (or fold runs) unless `force` clears it."""
    if not has_run(run_dir):
        return
    if not force:
        raise UsageError(
            f"run directory '{run_dir}' holds an earlier run: pass --resume {run_dir} to continue it, "
            "--force to start over, or choose another name with --set name=..."
        )
    clear_run_folder(run_dir)


def fold_configs(config: Config) -> list[Config]:
    """The config of each fold's agent (`config` has `train.walk_forward` K): `config` with the fold's data as
    its `data.split` (`fold_split`), whose test split the fold's own backtest plays, and no walk-forward of its
    own."""
    assert config.train.walk_forward is not None
    if len(config.data.paths) > 1:
        raise ConfigError(
            f"train.walk_forward trains on one candle file and data.paths lists {len(config.data.paths)}: "
            "train a walk-forward run per file (--set data.paths=[] --set data.path=FILE)"
        )
    candles, _ = load_config_candles(config)
    embargo = config.data.split.embargo_bars
    folds = walk_forward_folds(
        candles, config.data.split, folds=config.train.walk_forward, span=config.train.walk_forward_span,
        split=config.backtest.split,
    )
    return [
        config.model_copy(update={
            "data": config.data.model_copy(update={"split": fold_split(candles, fold, embargo)}),
            "train": config.train.model_copy(update={"walk_forward": None}),
            "backtest": config.backtest.model_copy(update={"split": "test"}),
        })
        for fold in folds
    ]


def _finished_updates(fold_dir: Path) -> int:
    """The updates a fold's last complete checkpoint holds; 0 if it has none (or was never started)."""
    found = list_checkpoints(fold_dir)
    return found[-1][0] if found else 0


def _check_resumable(run_dir: Path, folds: list[Config], done: list[int]) -> None:
    """Refuse to resume a walk-forward run with nothing left to do, or whose folds' data has changed."""
    for number, fold in enumerate(folds, start=1):
        saved = fold_run_dir(run_dir, number) / "config.yaml"
        trained = load_config(saved).data.split if saved.is_file() else fold.data.split
        if trained != fold.data.split:
            raise UsageError(
                f"cannot resume: fold {number} of '{run_dir}' was trained for {describe_fold_split(trained)}, "
                f"but this config's fold {number} has {describe_fold_split(fold.data.split)} (the data, "
                "data.split, backtest.split or train.walk_forward changed): start over with --force"
            )
    planned = folds[0].train.updates
    if all(finished >= planned for finished in done):
        raise UsageError(
            f"cannot resume: every fold of '{run_dir}' has finished train.updates {planned}: raise it to "
            f"continue (--set train.updates={planned + 10})"
        )


def _resume(trainer: Trainer, run_dir: Path) -> None:
    """Load the run's last checkpoint (`_train_agent` has checked there is one); a run with nothing left to do is a
    usage error."""
    if trainer.resume() is None:
        raise UsageError(f"cannot resume: '{run_dir}' has no complete checkpoint")
    done, planned = trainer.state.step, trainer.config.train.updates
    if done >= planned:
        raise UsageError(
            f"cannot resume: '{run_dir}' has finished {done} updates and train.updates is {planned}: "
            f"raise it to continue (--set train.updates={done + 10})"
        )


@contextmanager
def _progress(config: Config, console: Console) -> Iterator[tuple[Progress, TaskID]]:
    """A live progress bar with an update's key figures."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), console=console,
    ) as progress:
        yield progress, progress.add_task(
            f"{config.train.algorithm} {config.name}", total=config.train.updates, figures=""
        )


def _figures(metrics: dict) -> str:
    """The key numbers of an update for the progress bar."""
    parts = [f"return {metrics['episode_return']:+.3f}"]
    if "valid_call_rate" in metrics:
        parts.append(f"valid {metrics['valid_call_rate']:.0%}")
    if "direction_accuracy" in metrics:
        parts.append(f"dir {metrics['direction_accuracy']:.0%}")
    if "episode_pnl_pct" in metrics:
        parts.append(f"pnl {metrics['episode_pnl_pct']:+.2f}%")
    parts += [f"kl {metrics.get('kl_ref', 0.0):.3f}", f"H {metrics.get('entropy', 0.0):.2f}"]
    return " · ".join(parts)


def _record_splits(config: Config, splits: list[Splits], run_dir: Path) -> None:
    """The splits the run used (`load_config_splits`); with several candle files (`data.paths`), each file's, by
    its label."""
    labels = asset_labels(asset_configs(config))
    described = {label: parts.describe() for label, parts in zip(labels, splits, strict=True)}
    recorded = described if config.data.paths else next(iter(described.values()))
    write_file(run_dir / "splits.json", json.dumps(recorded, indent=1) + "\n")


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("train.tensorboard needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(str(run_dir / "tensorboard"))


def _write_scalars(writer, metrics: dict) -> None:
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(key, value, metrics["update"])
