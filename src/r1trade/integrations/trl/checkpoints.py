"""Checkpoints of a TRL run in the layout of `r1trade.rl.checkpoint`, so `backtest --checkpoint` and `probe-run`
read them as they read a native run's: `policy/` (`save_policy`: the LoRA adapter or the full model, the tokenizer,
the model identity), `critic/` (a value head as initialised: GRPO trains none), the optimiser, scheduler and
random-number states (`save_state`: safetensors and JSON, no pickles), `config.yaml` and `trainer_state.json`.
Written under a temporary name and renamed into place, as native checkpoints are.

A resumed run reads them back without a pickle (`read_training_states`, `load_trl_policy`): the policy goes into
TRL's model before training, and `RestoreTraining` puts the optimiser, scheduler and random-number states into
TRL's run as its first step begins, where a run that never stopped stood when it wrote the checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from torch import nn
from transformers import PreTrainedTokenizerBase, TrainerCallback

from r1trade.config import Config
from r1trade.errors import CheckpointError, OutputError
from r1trade.models.agent_models import AgentModels
from r1trade.models.scoring import Critic
from r1trade.outputs import replace_folder
from r1trade.rl.checkpoint import (
    OPTIMIZER_STEM,
    STATE_FILE,
    check_rng_states,
    checkpoint_dir,
    damaged_if_refused,
    latest_checkpoint,
    load_policy,
    save_critic,
    save_policy,
)
from r1trade.rl.state_files import load_state, save_state
from r1trade.safe_load import first_line, read_json_object

RNG_STEM = "rng"
"""The main process's random-number states, named as `r1trade.rl.checkpoint` names them."""


def save_trl_checkpoint(
    config: Config,
    run_dir: Path,
    update: int,
    *,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: Any,
    scheduler: Any,
    sharded_optimizer: bool,
) -> Path:
    """Write `runs/<name>/checkpoints/step-<update>` from the trainer's model, optimiser and scheduler (on the main
    process); `sharded_optimizer` (DeepSpeed) stores no optimiser state, as a native DeepSpeed checkpoint keeps it
    elsewhere. Returns the checkpoint directory."""
    final = checkpoint_dir(run_dir, update)
    temporary = final.with_name(f".tmp-{final.name}")
    try:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
        models = _agent_models(config, model, tokenizer)
        save_policy(models, temporary / "policy")
        save_critic(models, temporary / "critic")
        optimizer_state = None if sharded_optimizer else optimizer.state_dict()
        save_state({"optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, temporary, OPTIMIZER_STEM)
        save_state(_rng_states(), temporary, RNG_STEM)
        config.save(temporary)
        (temporary / STATE_FILE).write_text(json.dumps({"step": update}) + "\n")
        replace_folder(temporary, final)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        kept = latest_checkpoint(run_dir)
        raise OutputError(
            f"could not write checkpoint {final}: {getattr(exc, 'strerror', None) or first_line(exc)}; "
            + (f"the last complete checkpoint is {kept}" if kept else "no complete checkpoint yet")
        ) from None
    return final


def _agent_models(config: Config, model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> AgentModels:
    """TRL's model as r1trade's policy checkpoints take it, beside a value head as initialised (GRPO trains none)."""
    return AgentModels(model, tokenizer, Critic("value_head", model, seed=config.seed), None, config.model)


def _rng_states() -> dict[str, Any]:
    """This process's random-number states; on a GPU also the CUDA generator, which TRL's sampling draws from."""
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


@dataclass(frozen=True)
class TrainingStates:
    """What a TRL checkpoint holds for resuming besides its policy."""

    path: Path
    update: int
    """The updates finished when it was written."""
    optimizer: dict[str, Any] | None
    """The optimiser's state dict; None when it was written under DeepSpeed, which keeps the state sharded."""
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    """The main process's random-number states."""


def read_training_states(path: Path) -> TrainingStates:
    """The update count, optimiser, scheduler and random-number states of the checkpoint `path` (safetensors and
    JSON only); a damaged file is a one-line `CheckpointError` naming it."""
    update = _finished_updates(path / STATE_FILE)
    saved = load_state(path, OPTIMIZER_STEM)
    with damaged_if_refused(path / OPTIMIZER_STEM):
        optimizer, scheduler = saved["optimizer"], saved["scheduler"]
    rng = load_state(path, RNG_STEM)
    check_rng_states(rng, path / RNG_STEM)  # refused now, before TRL starts training
    return TrainingStates(path, update, optimizer, scheduler, rng)


def _finished_updates(path: Path) -> int:
    """N of the checkpoint's `{"step": N}` (`trainer_state.json`), checked as the native trainer checks it."""
    saved = read_json_object(path)
    update = saved.get("step")
    if set(saved) != {"step"} or type(update) is not int or update < 0:
        raise CheckpointError(f"{path}: expected {{'step': N}} with a whole number N, found {json.dumps(saved)[:80]}")
    return update


def load_trl_policy(config: Config, model: nn.Module, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Load a checkpoint's policy (`save_policy`: the LoRA adapter or the full weights, as safetensors) into TRL's
    model in place, refusing one written for another model config."""
    load_policy(_agent_models(config, model, tokenizer), directory)


class RestoreTraining(TrainerCallback):
    """Puts a checkpoint's optimiser, scheduler and random-number states into TRL's run as its first step begins.

    TRL builds the optimiser and the scheduler only once training starts, and its dataloader draws from torch's
    generator as it starts a pass; a run that never stopped had done both long before the checkpoint, so from here
    on the two runs draw alike. Only the main process wrote its random-number states: the other processes keep
    the seeds TRL gave them."""

    def __init__(self, saved: TrainingStates) -> None:
        self.saved: TrainingStates | None = saved

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs) -> None:
        if self.saved is None:
            return
        saved, self.saved = self.saved, None
        with damaged_if_refused(saved.path / OPTIMIZER_STEM):
            optimizer.load_state_dict(saved.optimizer)
            lr_scheduler.load_state_dict(saved.scheduler)
        if state.is_world_process_zero:
            with damaged_if_refused(saved.path / RNG_STEM):
                _set_rng_states(saved.rng)


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
