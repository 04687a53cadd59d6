"""The agents of a walk-forward run (`train.walk_forward`): which checkpoint plays which fold of a backtest.

Fold k's agent trained on every bar before fold k's test window less the embargo, so it may play fold k only,
and only if the backtest cuts the folds its training was planned for: the run's K and span, on the same data
and `data.split`. `check_fold_windows` refuses any other folds, so no agent is ever scored on bars it saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from r1trade.config import Config, load_config
from r1trade.data.source import load_config_candles
from r1trade.data.splits import describe_fold_split, fold_split, walk_forward_folds
from r1trade.errors import UsageError
from r1trade.outputs import fold_run_dir
from r1trade.rl.checkpoint_paths import list_checkpoints


@dataclass(frozen=True)
class WalkForwardRun:
    """A run folder of fold agents: the config it was trained with and fold k's checkpoint at index k - 1."""

    run_dir: Path
    config: Config
    checkpoints: tuple[Path, ...]

    @property
    def folds(self) -> int:
        return len(self.checkpoints)

    @property
    def span(self) -> str:
        return self.config.train.walk_forward_span

    def folds_asked(self, walk_forward: int | None, span: str | None) -> tuple[int, str]:
        """The backtest's K and span: the run's; `--walk-forward` and `--walk-forward-span` may only repeat them."""
        if walk_forward is not None and walk_forward != self.folds:
            raise UsageError(
                f"--walk-forward {walk_forward}: '{self.run_dir}' trained {self.folds} fold agents "
                f"(train.walk_forward {self.folds}): give --walk-forward {self.folds} or leave it out"
            )
        if span is not None and span != self.span:
            raise UsageError(
                f"--walk-forward-span {span}: the fold agents of '{self.run_dir}' were trained for span "
                f"{self.span} (train.walk_forward_span): give --walk-forward-span {self.span} or leave it out"
            )
        return self.folds, self.span


def is_walk_forward_run(path: Path) -> bool:
    """Whether `path` is a run folder that `r1trade train` wrote with `train.walk_forward` (its config says so)."""
    saved = path / "config.yaml"
    return saved.is_file() and load_config(saved).train.walk_forward is not None


def load_walk_forward_run(run_dir: Path, *, step: int | None = None) -> WalkForwardRun:
    """The run in `run_dir` with each fold's last checkpoint, or its `step-N` for `step` N; a missing fold or
    checkpoint is a one-line UsageError."""
    config = load_config(run_dir / "config.yaml")
    folds = config.train.walk_forward
    assert folds is not None  # is_walk_forward_run
    finish = f"finish the run with r1trade train --resume {run_dir}"
    checkpoints = []
    for number in range(1, folds + 1):
        fold_dir = fold_run_dir(run_dir, number)
        if not fold_dir.is_dir():
            raise UsageError(
                f"walk-forward run '{run_dir}' has no {fold_dir.name} (train.walk_forward {folds}): {finish}"
            )
        found = dict(list_checkpoints(fold_dir))
        if not found:
            raise UsageError(f"fold {number} of '{run_dir}' has no complete checkpoint: {finish}")
        if step is not None and step not in found:
            steps = ", ".join(f"step-{s}" for s in found)
            raise UsageError(f"--step {step}: fold {number} of '{run_dir}' has no step-{step} (it has {steps})")
        checkpoints.append(found[max(found) if step is None else step])
    return WalkForwardRun(run_dir, config, tuple(checkpoints))


def check_fold_windows(run: WalkForwardRun, config: Config) -> None:
    """Refuse a backtest (`config`, with the run's K and span) whose folds are not those each agent trained
    for: its data, `data.split` or `backtest.split` differ from the run's."""
    candles, _ = load_config_candles(config)
    embargo = config.data.split.embargo_bars
    folds = walk_forward_folds(
        candles, config.data.split, folds=run.folds, span=run.span, split=config.backtest.split
    )
    for fold, checkpoint in zip(folds, run.checkpoints, strict=True):
        trained = load_config(checkpoint / "config.yaml").data.split
        expected = fold_split(candles, fold, embargo)
        if trained != expected:
            raise UsageError(
                f"fold {fold.number} of '{run.run_dir}' was trained for {describe_fold_split(trained)}, but this "
                f"backtest's fold {fold.number} has {describe_fold_split(expected)}: backtest with the run's data, "
                "data.split and backtest.split (leave out --config to use its config.yaml)"
            )
