"""Checkpoints that resume training exactly: weights, optimizer, scheduler, RNG states and the update count.

A checkpoint is a directory `runs/<name>/checkpoints/step-N/` written under a temporary name and renamed into
place, so a crash mid-write never leaves a checkpoint that looks complete.
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

from r1trade.agent.model import AgentModels, load_agent_models, load_critic, load_policy, save_critic, save_policy
from r1trade.config import Config, load_config
from r1trade.errors import UsageError

if TYPE_CHECKING:
    from r1trade.rl.trainer import Trainer

STATE_FILE = "trainer_state.json"


@dataclass
class TrainingState:
    step: int = 0  # finished updates


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step}"


def save_checkpoint(trainer: Trainer) -> Path:
    """Write the trainer's full state for its current step; returns the checkpoint directory."""
    final = checkpoint_dir(trainer.run_dir, trainer.state.step)
    temporary = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    save_policy(trainer.models, temporary / "policy")
    save_critic(trainer.models, temporary / "critic")
    torch.save(
        {"optimizer": trainer.optimizer.state_dict(), "scheduler": trainer.scheduler.state_dict()},
        temporary / "optimizer.pt",
    )
    torch.save(
        {
            "generator": trainer.generator.get_state(),
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
            "grad_norm_mean": trainer.grad_norm_mean,
        },
        temporary / "rng.pt",
    )
    trainer.config.save(temporary)
    (temporary / STATE_FILE).write_text(json.dumps(asdict(trainer.state)) + "\n")
    if final.exists():
        shutil.rmtree(final)
    temporary.rename(final)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in `run_dir`, or None."""
    found = [
        (int(path.name.removeprefix("step-")), path)
        for path in (run_dir / "checkpoints").glob("step-*")
        if (path / STATE_FILE).is_file() and path.name.removeprefix("step-").isdigit()
    ]
    return max(found)[1] if found else None


def load_checkpoint(path: Path, trainer: Trainer) -> TrainingState:
    """Restore everything `save_checkpoint` wrote into a freshly built trainer."""
    _require_complete(path)
    load_policy(trainer.models, path / "policy")
    load_critic(trainer.models, path / "critic")
    optim = torch.load(path / "optimizer.pt", weights_only=False)
    trainer.optimizer.load_state_dict(optim["optimizer"])
    trainer.scheduler.load_state_dict(optim["scheduler"])
    rng = torch.load(path / "rng.pt", weights_only=False)
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
