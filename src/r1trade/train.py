"""`r1trade train`: build models and environments from a config, train with a live progress bar, save the run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from r1trade.agent.loading import load_agent_models
from r1trade.config import Config
from r1trade.data.source import asset_configs, asset_labels, load_config_splits
from r1trade.data.splits import Splits
from r1trade.env.trading_env import make_envs
from r1trade.errors import UsageError
from r1trade.outputs import clear_run_folder, has_run, locked_run_folder, write_file
from r1trade.rl.trainer import Trainer


def train_run(
    config: Config, run_dir: Path, *, resume: bool = False, force: bool = False, console: Console | None = None
) -> Path:
    """Train `config` into `run_dir` (resuming from its last checkpoint if asked); returns the final checkpoint.

    The run folder is locked for the whole run. A fresh run refuses a folder that holds an earlier run unless
    `force` clears it; a resumed run rewrites its config only once its checkpoint has loaded."""
    console = console or Console()
    if config.train.engine == "trl":  # what TRL cannot honour is refused before the run folder is touched
        from r1trade.integrations.trl.settings import check_trl_settings

        check_trl_settings(config)
    with locked_run_folder(run_dir):
        if not resume and has_run(run_dir):
            if not force:
                raise UsageError(
                    f"run directory '{run_dir}' holds an earlier run: pass --resume {run_dir} to continue it, "
                    "--force to start over, or choose another name with --set name=..."
                )
            clear_run_folder(run_dir)
        torch.manual_seed(config.seed)
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


def _resume(trainer: Trainer, run_dir: Path) -> None:
    """Load the run's last checkpoint; a run with no checkpoint, or with nothing left to do, is a usage error."""
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
