"""Stopping a training run with a signal: the first SIGTERM or SIGINT ends it after the update under way, at a
checkpoint it resumes from exactly; a second ends it at once with the last complete checkpoint kept; the process's
own signal handling is back afterwards. In this process through the CLI, and in a real process sent a real
SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume_exact import RUN, TRAIN, global_generators, metrics, run_files, train  # noqa: F401

from r1trade.cli import main
from r1trade.rl import trainer as trainer_module

ROOT = Path(__file__).resolve().parents[1]


def signalled_at(monkeypatch: pytest.MonkeyPatch, step: int, signals: list[int]) -> None:
    """The process sends itself `signals` right after update `step` is logged."""
    log = trainer_module.Trainer._log

    def log_then_signal(self, record: dict) -> None:
        log(self, record)
        if record["update"] == step:
            for number in signals:
                os.kill(os.getpid(), number)

    monkeypatch.setattr(trainer_module.Trainer, "_log", log_then_signal)


@pytest.mark.usefixtures("global_generators")
def test_a_run_stopped_by_sigterm_resumes_as_a_run_that_never_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for folder in (straight, stopped):
        folder.mkdir()
    monkeypatch.chdir(straight)
    train(*TRAIN, "--set", "train.updates=3")  # checkpoints at 2 and 3

    monkeypatch.chdir(stopped)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with monkeypatch.context() as patch:
        signalled_at(patch, 1, [signal.SIGTERM])
        assert main(["train", *TRAIN, "--set", "train.updates=3"]) == 130
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    err = capsys.readouterr().err
    assert "SIGTERM: stopping after this update" in err
    step_1 = (RUN / "checkpoints" / "step-1").resolve()
    assert f"training stopped at {step_1}; continue with: r1trade train --resume {RUN.resolve()}\n" in err
    assert [row["update"] for row in metrics(RUN)] == [1]  # update 1 finished, checkpointed off its schedule
    train("--resume", str(RUN))

    resumed, whole = run_files(stopped / RUN), run_files(straight / RUN)
    extra = {name for name in resumed if name.startswith("checkpoints/step-1/")}
    assert extra and sorted(set(resumed) - extra) == sorted(whole)
    for name, content in whole.items():
        assert resumed[name] == content, name
    assert metrics(stopped / RUN) == metrics(straight / RUN)


@pytest.mark.usefixtures("global_generators")
def test_a_second_signal_stops_at_once_and_keeps_the_last_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        signalled_at(patch, 3, [signal.SIGINT, signal.SIGINT])  # Ctrl-C twice after update 3 is logged
        assert main(["train", *TRAIN, "--set", "train.updates=4"]) == 130
    err = capsys.readouterr().err
    assert f"training stopped at {(RUN / 'checkpoints' / 'step-2').resolve()}; continue with:" in err
    assert sorted(path.name for path in (RUN / "checkpoints").iterdir()) == ["step-2"]  # nothing saved at 3
    train("--resume", str(RUN))  # update 3 again, then 4
    assert [row["update"] for row in metrics(RUN)] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_real_sigterm_ends_a_real_run_at_a_checkpoint(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "r1trade.cli", "train", *TRAIN, "--set", "train.updates=200",
               "--set", f"output_dir={tmp_path}"]
    log = tmp_path / "smoke" / "metrics.jsonl"
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        deadline = time.monotonic() + 300
        while not (log.is_file() and log.read_text().count("\n") >= 1):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=300)
    assert run.returncode == 130, err[-2000:]
    assert "SIGTERM: stopping after this update" in err
    done = [json.loads(line)["update"] for line in log.read_text().splitlines()]
    checkpoints = [path.name for path in (tmp_path / "smoke" / "checkpoints").iterdir()]
    assert done[-1] < 200 and f"step-{done[-1]}" in checkpoints  # the last update logged is the one saved
    assert f"stopped at {tmp_path / 'smoke' / 'checkpoints' / f'step-{done[-1]}'}; continue with:" in err
