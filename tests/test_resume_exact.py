"""A run killed and resumed twice ends as a run that never stopped: every file of every checkpoint byte for byte,
and every line of the metrics log but its wall-clock timings.

Both runs go through the CLI in this process, each from its own working folder with the same relative
`output_dir`, so that the configs they write are the same too. Each start of `train` begins as a new process
would: torch's, NumPy's and Python's global generators seeded from the operating system (in one process they
would carry over from run to run, and hide a state a resumed run does not restore). A kill is the process ending
right after a checkpoint is written, with nothing of r1trade's running after it. The first one leaves, besides,
what a kill -9 while the step-4 checkpoint was being written leaves: the log of updates 3 and 4, the last line cut
short, and a half-written checkpoint folder."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from r1trade.cli import main
from r1trade.rl import trainer as trainer_module

TRAIN = [
    "--config", "smoke", "--set", "output_dir=runs", "--set", "env.episode_decisions=2", "--set",
    "env.max_tool_calls=1", "--set", "rollout.max_new_tokens=12", "--set", "train.epochs=1", "--set",
    "train.checkpoint_every=2",
]
"""The smoke config (the tiny random model, two episodes an update) at its shortest: one call a decision."""
RUN = Path("runs") / "smoke"
TIMING = {"rollout_seconds", "score_seconds", "update_seconds", "rollout_tokens_per_s", "update_tokens_per_s",
          "peak_memory_mb"}
"""The metrics that measure the machine, not the run: wall-clock seconds and rates of each phase, and the
process's peak memory."""


def run_files(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run folder but its metrics log (compared without timings) and its lock, by path."""
    return {
        str(path.relative_to(run_dir)): path.read_bytes() for path in sorted(run_dir.rglob("*"))
        if path.is_file() and path.name not in {"metrics.jsonl", ".lock"}
    }


def metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{key: value for key, value in json.loads(line).items() if key not in TIMING} for line in lines]


def leave_what_a_kill_leaves(run_dir: Path) -> None:
    """As if killed while writing step-4: updates 3 and 4 logged (the last line cut), `.tmp-step-4` half written."""
    log = run_dir / "metrics.jsonl"
    last = json.loads(log.read_text().splitlines()[-1])
    third = json.dumps({**last, "update": 3, "episode_return": 9.0})
    log.write_text(log.read_text() + third + "\n" + json.dumps({**last, "update": 4})[:40])
    partial = run_dir / "checkpoints" / ".tmp-step-4" / "policy"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"\0" * 100)


class Killed(BaseException):
    """Stands for kill -9: no handler of the CLI catches it (it is not an Exception), nothing after it runs."""


def killed_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Training dies right after the checkpoint of update `step` is written."""
    save = trainer_module.save_checkpoint

    def save_then_die(run_dir: Path, state, **parts) -> Path:
        path = save(run_dir, state, **parts)
        if state.step == step:
            raise Killed
        return path

    monkeypatch.setattr(trainer_module, "save_checkpoint", save_then_die)


def new_process() -> None:
    """The global random-number states a new process starts with: torch, NumPy and Python seed theirs from the
    operating system."""
    torch.seed()
    np.random.seed()
    random.seed()


def train(*args: str) -> None:
    new_process()
    assert main(["train", *args]) == 0


@pytest.fixture
def global_generators() -> Iterator[None]:
    """Puts back the process's global random-number states the test reseeds."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    yield
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


@pytest.mark.usefixtures("global_generators")
def test_a_run_killed_and_resumed_twice_matches_a_run_that_never_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for folder in (straight, stopped):
        folder.mkdir()
    monkeypatch.chdir(straight)
    train(*TRAIN, "--set", "train.updates=6")

    monkeypatch.chdir(stopped)
    for step, args in ((2, [*TRAIN, "--set", "train.updates=6"]), (4, ["--resume", str(RUN)])):
        with monkeypatch.context() as patch:
            killed_after(patch, step)
            new_process()
            with pytest.raises(Killed):
                main(["train", *args])
        if step == 2:
            leave_what_a_kill_leaves(RUN)
    train("--resume", str(RUN))

    resumed, whole = run_files(stopped / RUN), run_files(straight / RUN)
    assert sorted(resumed) == sorted(whole)
    assert {f"checkpoints/step-{n}/rng.safetensors" for n in (2, 4, 6)} <= set(whole)
    for name, content in whole.items():
        assert resumed[name] == content, name
    assert [row["update"] for row in metrics(stopped / RUN)] == [1, 2, 3, 4, 5, 6]
    assert metrics(stopped / RUN) == metrics(straight / RUN)
