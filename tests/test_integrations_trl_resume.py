"""`r1trade train --resume` of a `train.engine: trl` run: a run resumed from its step-1 checkpoint trains update 2
as a run that never stopped does (the same weights, optimiser state, windows and metrics), a SIGTERM ends a run at
such a checkpoint, and the CLI refuses a run with no checkpoint or nothing left to do in one line, and extends a
finished run by `--set train.updates`."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from peft import get_peft_model_state_dict
from rich.console import Console
from trl_fixtures import SHORT_EPISODES, run_r1trade, trl_config

from r1trade.config import load_config
from r1trade.errors import TrainingInterrupted
from r1trade.integrations.trl import window_rows
from r1trade.integrations.trl.engine import TRLTrainer
from r1trade.integrations.trl.run_log import RunLog
from r1trade.rl.checkpoint import OPTIMIZER_STEM
from r1trade.rl.checkpoint_paths import list_checkpoints
from r1trade.rl.state_files import load_state
from r1trade.safe_load import read_tensors
from r1trade.train import train_run

ADAPTER = Path("policy") / "adapter_model.safetensors"
TRAINING_FIGURES = ("episode_return", "valid_call_rate", "reward/format", "loss", "kl_ref", "entropy", "grad_norm",
                    "learning_rate", "clipfrac")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained 2 updates without stopping, checkpointed after each."""
    run_dir = tmp_path_factory.mktemp("trl") / "straight"
    config = trl_config(*SHORT_EPISODES, "train.updates=2", "train.checkpoint_every=1")
    train_run(config, run_dir, console=Console(file=io.StringIO()))
    return run_dir


def updates(run_dir: Path) -> list[int]:
    return [record["update"] for record in records(run_dir)]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_tensors(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert found.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(found[key], tensor), key


def test_a_run_resumed_from_step_1_trains_update_2_as_a_run_that_never_stopped(straight_run: Path, tmp_path: Path):
    resumed = tmp_path / "resumed"
    shutil.copytree(straight_run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-2")  # as if the run had stopped after update 1
    config = load_config(resumed / "config.yaml")
    trainer = TRLTrainer(config, resumed)

    step_1 = resumed / "checkpoints" / "step-1"
    assert trainer.resume() == step_1 and trainer.state.step == 1
    assert updates(resumed) == [1]  # update 2's record is cut: it is trained again
    policy = {key: tensor.detach() for key, tensor in get_peft_model_state_dict(trainer.trainer.model).items()}
    assert_same_tensors(policy, read_tensors(step_1 / ADAPTER))
    second_window = window_rows(config, 2)[1:]  # one window an update: groups of 2 in 2 episodes
    assert trainer.trainer.train_dataset.to_list() == second_window

    trainer.train()

    assert updates(resumed) == [1, 2]
    assert [step for step, _ in list_checkpoints(resumed)] == [1, 2]
    assert {(env.episode.start, env.episode.seed) for env in trainer.trainer.environments} == {
        (second_window[0]["start"], second_window[0]["seed"])
    }
    straight, again = straight_run / "checkpoints" / "step-2", resumed / "checkpoints" / "step-2"
    assert_same_tensors(read_tensors(again / ADAPTER), read_tensors(straight / ADAPTER))
    straight_state, resumed_state = load_state(straight, OPTIMIZER_STEM), load_state(again, OPTIMIZER_STEM)
    assert resumed_state["scheduler"] == straight_state["scheduler"]
    adam = resumed_state["optimizer"]["state"]
    assert adam and all(parameter["step"].item() == 2 for parameter in adam.values())  # Adam went on from step 1
    for index, parameter in straight_state["optimizer"]["state"].items():
        assert_same_tensors(adam[index], parameter)
    expected, found = records(straight_run)[1], records(resumed)[1]
    assert {key: found[key] for key in TRAINING_FIGURES} == {key: expected[key] for key in TRAINING_FIGURES}


def test_a_sigterm_during_update_1_ends_the_run_after_it_at_a_step_1_checkpoint_of_the_same_weights(
    straight_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    add_episode, before = RunLog.add_episode, signal.getsignal(signal.SIGTERM)

    def add_then_signal(self: RunLog, episode) -> None:
        add_episode(self, episode)
        if not self.stop.asked:
            os.kill(os.getpid(), signal.SIGTERM)  # while update 1 is still playing its episodes

    monkeypatch.setattr(RunLog, "add_episode", add_then_signal)
    stopped = tmp_path / "stopped"
    config = trl_config(*SHORT_EPISODES, "train.updates=2", "train.checkpoint_every=2")
    with pytest.raises(TrainingInterrupted) as interrupted:
        train_run(config, stopped, console=Console(file=io.StringIO()))
    assert interrupted.value.checkpoint == stopped / "checkpoints" / "step-1"  # off the every-2 schedule
    assert signal.getsignal(signal.SIGTERM) == before
    assert updates(stopped) == [1] and [step for step, _ in list_checkpoints(stopped)] == [1]
    straight = straight_run / "checkpoints" / "step-1"
    assert_same_tensors(read_tensors(stopped / "checkpoints" / "step-1" / ADAPTER), read_tensors(straight / ADAPTER))


@pytest.mark.slow
def test_the_cli_refuses_a_resume_with_nothing_to_do_in_one_line_and_extends_a_run(straight_run: Path,
                                                                                   tmp_path: Path):
    run_dir = tmp_path / "run"
    shutil.copytree(straight_run, run_dir)
    finished = run_r1trade("train", "--resume", str(run_dir), cwd=tmp_path)
    assert finished.returncode == 2 and len(finished.stderr.strip().splitlines()) == 1
    assert "has finished 2 updates and train.updates is 2" in finished.stderr
    assert updates(run_dir) == [1, 2]

    extended = run_r1trade("train", "--resume", str(run_dir), "--set", "train.updates=3", cwd=tmp_path)
    assert extended.returncode == 0, extended.stderr[-2000:]
    assert updates(run_dir) == [1, 2, 3]
    assert [step for step, _ in list_checkpoints(run_dir)] == [1, 2, 3]
    assert load_config(run_dir / "config.yaml").train.updates == 3

    fresh = tmp_path / "fresh"
    trl_config(*SHORT_EPISODES).save(fresh)  # a run folder whose run never reached a checkpoint
    unstarted = run_r1trade("train", "--resume", str(fresh), cwd=tmp_path)
    assert unstarted.returncode == 2 and len(unstarted.stderr.strip().splitlines()) == 1
    assert f"cannot resume: '{fresh}' has no complete checkpoint" in unstarted.stderr
