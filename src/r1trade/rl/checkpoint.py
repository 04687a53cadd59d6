"""Checkpoints that resume training exactly: weights, optimizer, scheduler, RNG states and the update count.

A checkpoint is a directory `runs/<name>/checkpoints/step-N/` written under a temporary name and renamed into
place, so a crash mid-write never leaves a checkpoint that looks complete. Under DeepSpeed ZeRO the optimiser
state is sharded across processes: each process writes its shard with DeepSpeed's own checkpointing into
`deepspeed/`, and a resume needs the same number of processes.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from r1trade.agent.model import (
    AgentModels,
    load_agent_models,
    load_critic,
    load_policy,
    save_critic,
    save_policy,
)
from r1trade.config import Config, load_config
from r1trade.errors import UsageError

if TYPE_CHECKING:
    from r1trade.rl.trainer import Trainer

STATE_FILE = "trainer_state.json"
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "state"


@dataclass
class TrainingState:
    step: int = 0  # finished updates


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step}"


def save_checkpoint(trainer: Trainer) -> Path:
    """Write the trainer's full state for its current step; returns the checkpoint directory. Called on every
    process: each writes its random-number states (and under DeepSpeed its optimiser shard), the main one the rest."""
    accelerator = trainer.accelerator
    final = checkpoint_dir(trainer.run_dir, trainer.state.step)
    temporary = final.with_name(f".tmp-{final.name}")
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    if trainer.deepspeed is not None:
        trainer.deepspeed.save_checkpoint(
            str(temporary / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, exclude_frozen_parameters=True, save_latest=False
        )
    torch.save(  # every process its own: each sampled its own episodes
        {
            "generator": trainer.generator.get_state(),
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
            "grad_norm_mean": trainer.grad_norm_mean,
        },
        temporary / _rng_file(accelerator.process_index),
    )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_main_state(trainer, temporary)
        if final.exists():
            shutil.rmtree(final)
        temporary.rename(final)
    accelerator.wait_for_everyone()
    return final


def _write_main_state(trainer: Trainer, directory: Path) -> None:
    save_policy(trainer.models, directory / "policy")
    save_critic(trainer.models, directory / "critic")
    optimizer = trainer.optimizer.state_dict() if trainer.deepspeed is None else None  # else in deepspeed/
    torch.save({"optimizer": optimizer, "scheduler": trainer.scheduler.state_dict()}, directory / "optimizer.pt")
    trainer.config.save(directory)
    (directory / STATE_FILE).write_text(json.dumps(asdict(trainer.state)) + "\n")


def _rng_file(process_index: int) -> str:
    return "rng.pt" if process_index == 0 else f"rng-{process_index}.pt"


def checkpoint_step(path: Path) -> int | None:
    """N for a directory named `step-N`, else None."""
    number = path.name.removeprefix("step-")
    return int(number) if path.name.startswith("step-") and number.isdigit() else None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of `run_dir` as (step, directory), by step."""
    return sorted(
        (step, path) for path in (run_dir / "checkpoints").glob("step-*")
        if (step := checkpoint_step(path)) is not None and (path / STATE_FILE).is_file()
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in `run_dir`, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def load_checkpoint(path: Path, trainer: Trainer) -> TrainingState:
    """Restore everything `save_checkpoint` wrote into a freshly built trainer."""
    _require_complete(path)
    load_policy(trainer.models, path / "policy")
    load_critic(trainer.models, path / "critic")
    optim = torch.load(path / "optimizer.pt", weights_only=False)
    written_by_deepspeed = optim["optimizer"] is None
    if written_by_deepspeed != (trainer.deepspeed is not None):
        launched = "under DeepSpeed" if written_by_deepspeed else "without DeepSpeed"
        raise UsageError(f"checkpoint '{path}' was written {launched}: resume it the same way")
    if trainer.deepspeed is not None:  # optimiser shards and fp32 master weights
        trainer.deepspeed.load_checkpoint(
            str(path / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, load_module_strict=False, load_lr_scheduler_states=False
        )
    else:
        trainer.optimizer.load_state_dict(optim["optimizer"])
    trainer.scheduler.load_state_dict(optim["scheduler"])
    rng_file = path / _rng_file(trainer.accelerator.process_index)
    if not rng_file.exists():
        raise UsageError(f"checkpoint '{path}' was written by fewer processes: resume it with as many as wrote it")
    rng = torch.load(rng_file, weights_only=False)
    trainer.generator.set_state(rng["generator"])
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    trainer.grad_norm_mean = rng["grad_norm_mean"]
    return TrainingState(**json.loads((path / STATE_FILE).read_text()))


def load_trained_agent(path: Path) -> tuple[Config, AgentModels]:
    """The config a checkpoint was trained with and its policy, ready for evaluation."""
    _require_complete(path)
    config = load_config(path / "config.yaml")
    models = load_agent_models(config.model, seed=config.seed)
    load_policy(models, path / "policy")
    return config, models


def _require_complete(path: Path) -> None:
    if not path.is_dir():
        raise UsageError(f"checkpoint not found: '{path}' (look in runs/<name>/checkpoints/)")
    missing = [
        name for name in ("policy", "critic", "optimizer.pt", "rng.pt", "config.yaml", STATE_FILE)
        if not (path / name).exists()
    ]
    if missing:
        raise UsageError(f"incomplete checkpoint '{path}': missing {', '.join(missing)}")
