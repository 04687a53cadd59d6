"""`r1trade select-step`: the best step on figures worked by hand (ties to the earliest, NaN never), which
steps `--every` evaluates, and end to end through the CLI on a tiny two-checkpoint run: the choice, each
step's figure as `r1trade backtest --split validation` measures it, a stopped selection resumed at its next
step, and the test split refused."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from r1trade.backtest import step_selection
from r1trade.backtest.step_selection import (
    PROGRESS_FILE,
    SELECTION_FILE,
    best_step,
    scheduled_steps,
    select_step,
    steps_to_evaluate,
)
from r1trade.cli import main
from r1trade.errors import UsageError

TINY = ["train.updates=2", "train.checkpoint_every=1", "train.epochs=1", "train.algorithm=reinforce_pp",
        "env.episode_decisions=1", "env.max_tool_calls=1", "rollout.num_envs=1", "rollout.max_new_tokens=8",
        "model.cpu_kernels=off", "backtest.max_decisions=2", "backtest.agent_windows=1",
        "backtest.bootstrap_resamples=100"]
"""Two one-turn updates with a checkpoint after each, and two-decision backtests: seconds per stage."""


def settings(*items: str) -> list[str]:
    return [part for item in items for part in ("--set", item)]


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


# --------------------------------------------------------------------------- the choice, by hand


def test_the_highest_figure_wins() -> None:
    assert best_step({10: 52.5, 20: 61.0, 30: 57.25}) == 20
    assert best_step({1: -3.0, 2: -1.0}) == 2  # a figure below zero (a return) is still "higher is better"
    assert best_step({7: 50.0}) == 7
    assert best_step({10: 0.52, 20: 0.31, 30: 0.31, 40: 0.9}, lower_is_better=True) == 20  # a penalty: lowest, earliest


def test_a_tie_goes_to_the_earliest_step() -> None:
    # steps 20 and 40 both reach 60.0: the earlier one, the same figure for half the training
    assert best_step({40: 60.0, 10: 55.0, 20: 60.0, 30: 59.0}) == 20


def test_a_step_without_a_number_never_wins() -> None:
    assert best_step({10: math.nan, 20: 40.0}) == 20
    with pytest.raises(UsageError, match="no evaluated step has a number"):
        best_step({10: math.nan, 20: math.nan})


def test_every_picks_the_multiples_and_the_last() -> None:
    assert steps_to_evaluate([10, 20, 30, 40, 45], 20) == [20, 40, 45]
    assert steps_to_evaluate([10, 20, 30], 1) == [10, 20, 30]
    assert steps_to_evaluate([5], 10) == [5]  # the last step always


def test_a_checkpoint_written_by_a_stop_is_no_candidate() -> None:
    assert scheduled_steps([20, 21, 40, 60], 20, 60) == [20, 40, 60]  # stopped at 21, resumed to the end
    assert scheduled_steps([20, 21, 35], 20, 60) == [20, 35]  # stopped at 35 and not resumed: where it ends
    assert scheduled_steps([1, 2, 3], 1, 3) == [1, 2, 3]


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run with checkpoints at steps 1 and 2."""
    root = tmp_path_factory.mktemp("select")
    assert main(["train", "--config", "smoke", *settings(*TINY, f"output_dir={root}")]) == 0
    return root / "smoke"


def test_select_step_through_the_cli(run_dir: Path, capsys, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "r1trade.cli", "select-step", str(run_dir), "--split", "validation"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    saved = json.loads((run_dir / SELECTION_FILE).read_text())
    assert (saved["split"], saved["metric"], saved["every"]) == ("validation", "Direction Accuracy [%]", 1)
    figures = {row["step"]: row["value"] for row in saved["figures"]}
    assert list(figures) == [1, 2]
    # the highest figure, the earlier step on a tie
    expected = 1 if figures[1] >= figures[2] else 2
    assert saved["step"] == expected and saved["value"] == figures[expected]
    assert saved["checkpoint"] == str(run_dir / "checkpoints" / f"step-{expected}")
    assert f"selected step-{expected}" in done.stdout and "step    2: Direction Accuracy [%]" in done.stdout

    # each figure is the agent's row of the backtest on the validation split
    for step, value in figures.items():
        report = tmp_path / f"step-{step}"
        checkpoint = run_dir / "checkpoints" / f"step-{step}"
        args = ["backtest", "--checkpoint", str(checkpoint), "--split", "validation",
                "--strategy", "buy_and_hold", "--out", str(report)]
        assert main(args) == 0
        document = json.loads((report / "metrics.json").read_text())
        assert document["strategies"][f"agent (step-{step})"]["Direction Accuracy [%]"] == value
    capsys.readouterr()


def test_the_test_split_and_bad_input_are_refused_in_one_line(run_dir: Path, capsys, tmp_path: Path) -> None:
    (run_dir / SELECTION_FILE).unlink(missing_ok=True)
    cases = [
        (["select-step", str(run_dir), "--split", "test"], "choose a step on validation or train"),
        (["select-step", str(tmp_path)], "is not a run directory"),
        (["select-step", str(run_dir), "--up-to", "0"], "--up-to 0: give a step of 1 or more"),
        (["select-step", str(run_dir), "--metric", "Direction Acuracy [%]"],
         "has no row 'Direction Acuracy [%]' (did you mean 'Direction Accuracy [%]'?)"),
    ]
    for args, message in cases:
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and message in err and one_line(err), err
        assert not (run_dir / SELECTION_FILE).exists()


def test_up_to_chooses_among_the_first_steps_and_reuses_what_was_measured(run_dir: Path, monkeypatch) -> None:
    (run_dir / SELECTION_FILE).unlink(missing_ok=True)
    measured: list[str] = []
    figure = step_selection._figure
    monkeypatch.setattr(step_selection, "_figure",
                        lambda config, checkpoint, metric: measured.append(checkpoint.name) or figure(
                            config, checkpoint, metric))
    first = select_step(run_dir, up_to=1)  # a budget of one update: step 2 is not a candidate
    assert (first.step, list(first.figures), measured) == (1, [1], ["step-1"])
    saved = json.loads((run_dir / SELECTION_FILE).read_text())
    assert saved["up_to"] == 1 and saved["step"] == 1
    whole = select_step(run_dir)  # the whole run: step 1's figure kept, only step 2 measured
    assert measured == ["step-1", "step-2"] and whole.figures[1] == first.figures[1] and whole.up_to is None
    (run_dir / SELECTION_FILE).unlink()


def test_a_run_stopped_and_resumed_chooses_among_its_schedules_steps(run_dir: Path, tmp_path: Path,
                                                                    monkeypatch) -> None:
    """Read with `train.checkpoint_every: 2`, the run's step-1 is what a stop after update 1 leaves behind."""
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    (resumed / SELECTION_FILE).unlink(missing_ok=True)
    config = resumed / "config.yaml"
    config.write_text(config.read_text().replace("checkpoint_every: 1\n", "checkpoint_every: 2\n"))
    measured: list[str] = []
    monkeypatch.setattr(step_selection, "_figure",
                        lambda config, checkpoint, metric: measured.append(checkpoint.name) or 50.0)
    assert select_step(resumed).step == 2 and measured == ["step-2"]


class Stop(Exception):
    """Stands for a stop (SIGTERM, Ctrl-C) between two steps."""


def test_a_stopped_selection_resumes_at_its_next_step(run_dir: Path, monkeypatch) -> None:
    (run_dir / SELECTION_FILE).unlink(missing_ok=True)

    def stop_after_step_1(step: int, value: float) -> None:
        raise Stop

    with pytest.raises(Stop):
        select_step(run_dir, on_step=stop_after_step_1)
    progress = json.loads((run_dir / PROGRESS_FILE).read_text())
    assert not (run_dir / SELECTION_FILE).exists()
    assert progress["split"] == "validation" and [row["step"] for row in progress["figures"]] == [1]

    # a figure no backtest of this run gives, so that its use shows step 1 was not measured again
    progress["figures"][0]["value"] = 101.0
    (run_dir / PROGRESS_FILE).write_text(json.dumps(progress))
    measured: list[str] = []
    figure = step_selection._figure
    monkeypatch.setattr(step_selection, "_figure",
                        lambda config, checkpoint, metric: measured.append(checkpoint.name) or figure(
                            config, checkpoint, metric))
    selection = select_step(run_dir)
    assert measured == ["step-2"]
    assert selection.figures[1] == 101.0 and selection.step == 1
    assert not (run_dir / PROGRESS_FILE).exists()  # the choice written, the progress goes

    # figures of another metric are not this selection's: every step is measured again
    (run_dir / SELECTION_FILE).unlink()
    (run_dir / PROGRESS_FILE).write_text(json.dumps({**progress, "metric": "Return [%]"}))
    measured.clear()
    assert select_step(run_dir).figures[1] != 101.0 and measured == ["step-1", "step-2"]
    (run_dir / SELECTION_FILE).unlink()


@pytest.mark.parametrize("damaged", [PROGRESS_FILE, SELECTION_FILE])
def test_a_damaged_earlier_measurement_is_refused_in_one_line_and_nothing_is_written(
    run_dir: Path, capsys, damaged: str
) -> None:
    """A stopped selection's figures and a finished one's are both reused, so a damaged file is named, not
    measured over: no selection is written, and a damaged earlier one is kept as it was."""
    for content in ['{"split": "validation", "metric": "Direction Accuracy [%]", "figures": [{"step": "x"}]}',
                    "[1, 2]", "{not json"]:
        (run_dir / damaged).write_text(content)
        code = main(["select-step", str(run_dir)])
        err = capsys.readouterr().err
        assert code != 0 and damaged in err and one_line(err), err
        if damaged == SELECTION_FILE:
            assert (run_dir / SELECTION_FILE).read_text() == content
        else:
            assert not (run_dir / SELECTION_FILE).exists()
    (run_dir / damaged).unlink()
