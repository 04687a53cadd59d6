"""Checkpoints of a TRL run in the layout of `r1trade.rl.checkpoint`, so `backtest --checkpoint` and `probe-run`
read them as they read a native run's: `policy/` (`save_policy`: the LoRA adapter or the full model, the tokenizer,
the model identity), `critic/` (a value head as initialised: GRPO trains none), the optimiser, scheduler and
random-number states (`save_state`: safetensors and JSON, no pickles), `config.yaml` and `trainer_state.json`.
Written under a temporary name and renamed into place, as native checkpoints are.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from torch import nn
from transformers import PreTrainedTokenizerBase

from r1trade.agent.models import AgentModels
from r1trade.agent.scoring import Critic
from r1trade.config import Config
from r1trade.errors import OutputError
from r1trade.outputs import replace_folder
from r1trade.rl.checkpoint import (
    OPTIMIZER_STEM,
    STATE_FILE,
    checkpoint_dir,
    latest_checkpoint,
    save_critic,
    save_policy,
)
from r1trade.rl.state_files import save_state
from r1trade.safe_load import first_line

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
        models = AgentModels(model, tokenizer, Critic("value_head", model, seed=config.seed), None, config.model)
        save_policy(models, temporary / "policy")
        save_critic(models, temporary / "critic")
        optimizer_state = None if sharded_optimizer else optimizer.state_dict()
        save_state({"optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, temporary, OPTIMIZER_STEM)
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        save_state(rng, temporary, RNG_STEM)
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
