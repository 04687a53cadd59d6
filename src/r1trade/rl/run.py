"""`r1trade train`: build models and environments from a config, train with a live progress bar, save the run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from r1trade.agent.model import load_agent_models
from r1trade.config import Config
from r1trade.data.source import load_config_candles
from r1trade.data.splits import make_splits
from r1trade.env.trading_env import make_envs
from r1trade.errors import UsageError
from r1trade.rl.trainer import Trainer


def train_run(config: Config, run_dir: Path, *, resume: bool = False, console: Console | None = None) -> Path:
    """Train `config` into `run_dir` (resuming from its last checkpoint if asked); returns the final checkpoint."""
    console = console or Console()
    torch.manual_seed(config.seed)
    make_envs(config, 1, "train")  # builds (and caches) the market replay, failing early on bad data
    config.save(run_dir)
    _record_splits(config, run_dir)
    models = load_agent_models(config.model, seed=config.seed)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), console=console,
    ) as progress:
        task = progress.add_task(f"{config.train.algorithm} {config.name}", total=config.train.updates, figures="")

        def on_update(metrics: dict) -> None:
            progress.update(task, completed=metrics["update"], figures=_figures(metrics))
            for warning in metrics.get("warnings", []):
                progress.console.print(f"[yellow]update {metrics['update']}: {warning}[/yellow]")

        writer = _tensorboard(run_dir) if config.train.tensorboard else None
        trainer = Trainer(
            config, models, lambda n: make_envs(config, n, "train"), run_dir,
            on_update=lambda m: (on_update(m), writer and _write_scalars(writer, m)),
        )
        if resume:
            checkpoint = trainer.resume()
            if checkpoint is None:
                raise UsageError(f"cannot resume: '{run_dir}' has no complete checkpoint")
            progress.update(task, completed=trainer.state.step)
        try:
            return trainer.train()
        finally:
            if writer is not None:
                writer.close()


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


def _record_splits(config: Config, run_dir: Path) -> None:
    candles, _ = load_config_candles(config)
    splits = make_splits(candles, config.data.split).describe()
    (run_dir / "splits.json").write_text(json.dumps(splits, indent=1) + "\n")


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
