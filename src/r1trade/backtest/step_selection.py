"""`r1trade select-step`: which checkpoint of a run to keep, chosen on held-out data other than the test
split.

Each chosen checkpoint plays the split greedily exactly as `r1trade backtest --checkpoint step-N --split
validation --strategy buy_and_hold` plays it (the run's own config), and the step whose agent row has the
best figure of the metric wins (the highest, or the lowest for a row of `LOWER_IS_BETTER` such as the
mandate's penalty); a tie goes to the earliest step (the same figure for less training), and a
step whose figure is not a number never wins. The test split is refused: a step picked on it would make the
test figure the best of several tries. The figures and the choice go to `RUN/selected_step.json`, written last
and whole. Each figure is also saved as it is measured (`RUN/selecting_step.json`, removed once the choice is
written), so a selection that is stopped resumes at the next step: on a pretrained model each step is minutes.
A step an earlier selection of the same split and metric measured is not measured again (delete both files to
measure every step again).
"""

from __future__ import annotations

import difflib
import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r1trade.backtest.report_runs import LOWER_IS_BETTER
from r1trade.backtest.runner import run_backtest
from r1trade.config import Config, load_config
from r1trade.errors import UsageError
from r1trade.outputs import locked_run_folder, write_file
from r1trade.rl.checkpoint_paths import list_checkpoints
from r1trade.safe_load import read_json_object

SELECTION_FILE = "selected_step.json"
PROGRESS_FILE = "selecting_step.json"
DEFAULT_METRIC = "Direction Accuracy [%]"
SELECTION_SPLITS = ("validation", "train")
"""Splits a step may be chosen on; never the test split."""


@dataclass(frozen=True)
class StepSelection:
    """The chosen `step` of `run_dir` by `metric` on `split`, with each evaluated step's figure (step → value,
    NaN where the report had none); `every`: the spacing of the evaluated steps (`steps_to_evaluate`); `up_to`:
    the last step that could be chosen (None: any)."""

    run_dir: Path
    split: str
    metric: str
    every: int
    figures: dict[int, float]
    step: int
    up_to: int | None = None

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / f"step-{self.step}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.run_dir), "split": self.split, "metric": self.metric, "every": self.every,
            "up_to": self.up_to, "figures": _rows(self.figures),
            "step": self.step, "checkpoint": str(self.checkpoint), "value": self.figures[self.step],
        }


def best_step(figures: Mapping[int, float], *, lower_is_better: bool = False) -> int:
    """The step with the highest figure (the lowest with `lower_is_better`), the earliest of equals; NaN never
    wins.

    >>> best_step({10: 55.0, 20: 60.0, 30: 60.0, 40: float("nan")})
    20
    >>> best_step({10: 0.4, 20: 0.3, 30: 0.3}, lower_is_better=True)
    20
    """
    numbers = {step: value for step, value in figures.items() if not math.isnan(value)}
    if not numbers:
        raise UsageError("no evaluated step has a number for the metric: choose another --metric")
    sign = 1 if lower_is_better else -1
    return min(numbers, key=lambda step: (sign * numbers[step], step))


def steps_to_evaluate(steps: Sequence[int], every: int) -> list[int]:
    """The saved steps that are multiples of `every`, and the last one (as `probe-run --every` picks them).

    >>> steps_to_evaluate([10, 20, 30, 40, 45], 20)
    [20, 40, 45]
    """
    return sorted({*(step for step in steps if step % every == 0), *steps[-1:]})


def scheduled_steps(steps: Sequence[int], checkpoint_every: int, updates: int) -> list[int]:
    """The saved `steps` that the run's schedule writes (multiples of `checkpoint_every`, and step `updates`),
    and the last one: a checkpoint written only because the run was stopped there is no candidate, so a run
    stopped and resumed chooses among the steps of one that never stopped.

    >>> scheduled_steps([20, 21, 40, 60], 20, 60)
    [20, 40, 60]
    """
    return [step for step in steps if step % checkpoint_every == 0 or step in (updates, steps[-1])]


def checkpoints_up_to(run_dir: Path, up_to: int | None) -> list[tuple[int, Path]]:
    """The run's complete checkpoints (`list_checkpoints`) at steps up to `up_to` (all: None)."""
    return [(step, path) for step, path in list_checkpoints(run_dir) if up_to is None or step <= up_to]


def check_selectable(config: Config, what: str) -> None:
    """A step is chosen for one agent on one candle file: walk-forward runs and several files are refused;
    `what` names the run or config in the message."""
    if config.train.walk_forward is not None:
        raise UsageError(
            f"{what} trains one agent per walk-forward fold (train.walk_forward), so it has no one step to "
            "choose: backtest it with `r1trade backtest --checkpoint RUN --step N`"
        )
    if len(config.data.paths) > 1:
        raise UsageError(
            f"{what} trains on {len(config.data.paths)} candle files (data.paths): a step is chosen on one "
            "file's split (--set data.paths=[] --set data.path=FILE)"
        )


def select_step(
    run_dir: Path,
    *,
    split: str = "validation",
    metric: str = DEFAULT_METRIC,
    every: int = 1,
    up_to: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> StepSelection:
    """Backtest the chosen checkpoints of `run_dir` up to step `up_to` (all: None) on `split`
    (`scheduled_steps`, then `steps_to_evaluate`), pick the best by `metric` (`best_step`) and write
    `RUN/selected_step.json`; `on_step(step, value)` is called as each is measured. The run folder is locked
    meanwhile: a run still training there is refused, not read half-way."""
    if split not in SELECTION_SPLITS:
        raise UsageError(
            f"--split {split}: choose a step on {' or '.join(SELECTION_SPLITS)}; the test split is kept for "
            "the chosen step's own backtest"
        )
    if every < 1:
        raise UsageError(f"--every {every}: give 1 or more")
    if up_to is not None and up_to < 1:
        raise UsageError(f"--up-to {up_to}: give a step of 1 or more")
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"'{run_dir}' is not a run directory (no config.yaml)")
    config = load_config(run_dir / "config.yaml", [f"backtest.split={split}"])
    check_selectable(config, f"'{run_dir}'")
    with locked_run_folder(run_dir):
        checkpoints = dict(checkpoints_up_to(run_dir, up_to))
        if not checkpoints:
            after = "" if up_to is None else f" up to step {up_to}"
            raise UsageError(f"'{run_dir}' has no complete checkpoint{after} to choose from")
        measured = _measured_before(run_dir, split, metric)
        figures: dict[int, float] = {}
        scheduled = scheduled_steps(list(checkpoints), config.train.checkpoint_every, config.train.updates)
        for step in steps_to_evaluate(scheduled, every):
            if step in measured:
                figures[step] = measured[step]
            else:
                figures[step] = _figure(config, checkpoints[step], metric)
                measured[step] = figures[step]
                write_file(run_dir / PROGRESS_FILE, _figures_json(split, metric, measured))
            if on_step is not None:
                on_step(step, figures[step])
        chosen = best_step(figures, lower_is_better=metric in LOWER_IS_BETTER)
        selection = StepSelection(run_dir, split, metric, every, figures, chosen, up_to)
        write_file(run_dir / SELECTION_FILE, json.dumps(selection.to_dict(), indent=1) + "\n")
        (run_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return selection


def read_selection(run_dir: Path) -> StepSelection | None:
    """The selection `select_step` wrote into `run_dir`, or None when there is none."""
    path = run_dir / SELECTION_FILE
    if not path.is_file():
        return None
    saved = read_json_object(path)
    try:
        up_to = saved.get("up_to")  # absent from the selections written before it was recorded
        return StepSelection(run_dir, str(saved["split"]), str(saved["metric"]), int(saved["every"]),
                             _figures(saved["figures"]), int(saved["step"]), None if up_to is None else int(up_to))
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path} is not what `r1trade select-step` writes: delete it to choose again") \
            from None


def _rows(figures: Mapping[int, float]) -> list[dict[str, Any]]:
    """Figures as JSON rows by step, NaN written as null."""
    return [{"step": step, "value": None if math.isnan(value) else value}
            for step, value in sorted(figures.items())]


def _figures(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """`_rows` read back; raises KeyError, TypeError or ValueError on rows it did not write."""
    return {int(row["step"]): math.nan if row["value"] is None else float(row["value"]) for row in rows}


def _figures_json(split: str, metric: str, figures: Mapping[int, float]) -> str:
    return json.dumps({"split": split, "metric": metric, "figures": _rows(figures)}, indent=1) + "\n"


def _measured_before(run_dir: Path, split: str, metric: str) -> dict[int, float]:
    """The figures of the same split and metric that an earlier selection of this run measured (step → value):
    a finished one's (`SELECTION_FILE`: another --every or --up-to reuses them), then a stopped one's. A
    checkpoint never changes once written, and `train --force` removes both files with the checkpoints."""
    measured: dict[int, float] = {}
    for path in (run_dir / SELECTION_FILE, run_dir / PROGRESS_FILE):
        if not path.is_file():
            continue
        saved = read_json_object(path)
        try:
            if (saved["split"], saved["metric"]) == (split, metric):
                measured.update(_figures(saved["figures"]))
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{path} is not what `r1trade select-step` writes: delete it to measure again") \
                from None
    return measured


def _figure(config: Config, checkpoint: Path, metric: str) -> float:
    """The agent's `metric` on the config's split, by the backtest's own machinery (its report discarded)."""
    with tempfile.TemporaryDirectory(prefix="r1trade-select-") as scratch:
        report = Path(scratch) / "report"
        outcome = run_backtest(config, strategy="buy_and_hold", checkpoint=checkpoint, out_dir=report)
    rows = outcome.runs[0].rows  # the agent's row: models come first
    if metric not in rows:
        close = difflib.get_close_matches(metric, list(rows), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"the agent's report has no row '{metric}'{hint}")
    value = rows[metric]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
