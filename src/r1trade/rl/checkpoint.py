"""Checkpoints that resume training exactly: weights, optimizer, scheduler, RNG states and the update count.

A checkpoint is a directory `runs/<name>/checkpoints/step-N/` written under a temporary name and renamed into
place, so a crash or a full disk mid-write never leaves a checkpoint that looks complete, and the previous one
stays. Nothing in it is a pickle: weights are safetensors, optimizer and random-number states safetensors plus
JSON (`state_files`), and a full policy's `config.json` is checked for code of its own before transformers
reads it (`r1trade.models.trust`), so loading a checkpoint from elsewhere cannot run code. Under DeepSpeed ZeRO
the optimiser state is sharded across processes: each process writes its shard with DeepSpeed's own checkpointing into
`deepspeed/` (pickles, which a resume reads only once `deepspeed_files_are_plain` has vetted them), and a resume
needs the same number of processes. The policy and the critic are written by `save_policy` and `save_critic` (also
for TRL's runs), each with the model identity their loaders check.
"""

from __future__ import annotations

import json
import math
import pickle
import random
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from peft import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from r1trade.config import Config, ModelConfig, load_config
from r1trade.errors import CheckpointError, OutputError, UsageError
from r1trade.models.agent_models import AgentModels
from r1trade.models.loading import (
    TINY_RANDOM,
    TINY_RANDOM_QWEN,
    built_in_code,
    load_agent_models,
    model_dtype,
)
from r1trade.models.trust import require_no_model_code
from r1trade.outputs import replace_folder
from r1trade.rl.checkpoint_paths import STATE_FILE, checkpoint_dir, latest_checkpoint
from r1trade.rl.state_files import load_state, save_state, state_files
from r1trade.safe_load import first_line, read_json_object, read_tensors

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from r1trade.rl.distributed import Distributed

OPTIMIZER_STEM = "optimizer"
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "state"
DEEPSPEED_GLOBALS = frozenset({
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
})
"""The classes DeepSpeed's ZeRO shards may name beyond torch's safe types: an enum and two plain records."""


@dataclass
class TrainingState:
    step: int = 0  # finished updates


def save_checkpoint(
    run_dir: Path, state: TrainingState, *, config: Config, models: AgentModels, optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler, generator: torch.Generator, grad_norm_mean: float | None, distributed: Distributed,
) -> Path:
    """Write a training run's full state at `state.step`; returns the checkpoint directory. Called on every
    process: each writes its random-number states (and under DeepSpeed its optimiser shard), the main one the rest.
    `grad_norm_mean` is the running mean of the gradient norm the echo-trap warning compares against."""
    accelerator, deepspeed = distributed.accelerator, distributed.deepspeed
    final = checkpoint_dir(run_dir, state.step)
    temporary = final.with_name(f".tmp-{final.name}")
    try:
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        if deepspeed is not None:
            deepspeed.save_checkpoint(
                str(temporary / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, exclude_frozen_parameters=True, save_latest=False
            )
        save_state(  # every process its own: each sampled its own episodes
            {
                "generator": generator.get_state(),
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
                "grad_norm_mean": grad_norm_mean,
            },
            temporary, _rng_stem(accelerator.process_index),
        )
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_policy(models, temporary / "policy")
            save_critic(models, temporary / "critic")
            optimizer_state = optimizer.state_dict() if deepspeed is None else None  # else in deepspeed/
            save_state({"optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, temporary, OPTIMIZER_STEM)
            config.save(temporary)
            (temporary / STATE_FILE).write_text(json.dumps(asdict(state)) + "\n")
            replace_folder(temporary, final)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        where = str(getattr(exc, "filename", None) or temporary).replace(str(temporary), str(final))
        kept = latest_checkpoint(run_dir)
        raise OutputError(
            f"could not write checkpoint {where}: {getattr(exc, 'strerror', None) or first_line(exc)}; "
            + (f"the last complete checkpoint is {kept}" if kept else "no complete checkpoint yet")
        ) from None
    accelerator.wait_for_everyone()
    return final


def _rng_stem(process_index: int) -> str:
    return "rng" if process_index == 0 else f"rng-{process_index}"


def load_checkpoint(
    path: Path, *, models: AgentModels, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
    generator: torch.Generator, distributed: Distributed,
) -> tuple[TrainingState, float | None]:
    """Restore everything `save_checkpoint` wrote into freshly built parts of a run; returns the training state
    and the running mean of the gradient norm."""
    deepspeed = distributed.deepspeed
    _require_complete(path)
    load_policy(models, path / "policy")
    load_critic(models, path / "critic")
    optim = load_state(path, OPTIMIZER_STEM)
    written_by_deepspeed = optim.get("optimizer") is None
    if written_by_deepspeed != (deepspeed is not None):
        launched = "under DeepSpeed" if written_by_deepspeed else "without DeepSpeed"
        raise UsageError(f"checkpoint '{path}' was written {launched}: resume it the same way")
    with damaged_if_refused(path / OPTIMIZER_STEM):
        if deepspeed is not None:  # optimiser shards and fp32 master weights
            require_plain_deepspeed_files(path / DEEPSPEED_DIR)
            deepspeed.load_checkpoint(
                str(path / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, load_module_strict=False, load_lr_scheduler_states=False
            )
        else:
            optimizer.load_state_dict(optim["optimizer"])
        scheduler.load_state_dict(optim["scheduler"])
    stem = _rng_stem(distributed.process_index)
    if not state_files(path, stem)[0].exists():
        raise UsageError(f"checkpoint '{path}' was written by fewer processes: resume it with as many as wrote it")
    rng = load_state(path, stem)
    check_rng_states(rng, path / stem)
    with damaged_if_refused(path / stem):
        grad_norm_mean = rng["grad_norm_mean"]
        if grad_norm_mean is not None and not (_is_number(grad_norm_mean) and math.isfinite(grad_norm_mean)):
            raise ValueError(f"grad_norm_mean is {str(grad_norm_mean)[:40]!r}, not a number")
        generator.set_state(rng["generator"])
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
    return _training_state(path / STATE_FILE), grad_norm_mean


def seed_random_states(seed: int) -> None:
    """Seed every global random-number state a checkpoint keeps: torch's, NumPy's and Python's.

    NumPy and Python seed theirs from the operating system when a process starts. Left so, a run that never
    stopped and a run resumed from its checkpoint hold different states, so they save different `rng` files,
    and would draw differently from the first thing that used them."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


MT_KEYS = 624
"""Words in the Mersenne Twister's key, NumPy's legacy generator's and Python's alike."""


def check_rng_states(states: dict, stem: Path) -> None:
    """Refuse saved random-number states before any generator takes one: a bad one is a damaged checkpoint.

    torch's states are tried on a scratch generator. NumPy's and Python's are checked here, for the generators do
    not check everything: NumPy takes a key position past its key (and later reads beyond it), Python cuts keys
    to 32 bits."""
    with damaged_if_refused(stem):
        for name in ("generator", "torch", "cuda"):
            if name in states and not (
                isinstance(states[name], torch.Tensor) and states[name].dtype == torch.uint8 and states[name].dim() == 1
            ):
                raise ValueError(f"{name} is not a byte tensor")
        for name in ("generator", "torch"):
            if name in states:
                torch.Generator().set_state(states[name])
        _check_numpy_state(states["numpy"])
        _check_python_state(states["python"])


def _check_numpy_state(state: object) -> None:
    """`np.random.get_state()`: ('MT19937', 624 uint32 keys, position 0-624, has_gauss 0 or 1, a float)."""
    if not (isinstance(state, tuple) and len(state) == 5 and state[0] == "MT19937"):
        raise ValueError("numpy is not an MT19937 state")
    _, keys, position, has_gauss, gauss = state
    if not (isinstance(keys, np.ndarray) and keys.dtype == np.uint32 and keys.shape == (MT_KEYS,)):
        raise ValueError(f"numpy's key is not {MT_KEYS} 32-bit words")
    if not (type(position) is int and 0 <= position <= MT_KEYS):
        raise ValueError(f"numpy's key position is {str(position)[:40]}, not 0 to {MT_KEYS}")
    if type(has_gauss) is not int or has_gauss not in (0, 1) or not (_is_number(gauss) and math.isfinite(gauss)):
        raise ValueError("numpy's cached Gaussian is not a flag and a number")


def _check_python_state(state: object) -> None:
    """`random.getstate()`: (3, 624 32-bit keys and a position 0-624, None or a float)."""
    if not (isinstance(state, tuple) and len(state) == 3 and state[0] == 3 and isinstance(state[1], tuple)):
        raise ValueError("python is not a version-3 random state")
    *keys, position = state[1]
    if len(keys) != MT_KEYS or not all(type(key) is int and 0 <= key < 2**32 for key in keys):
        raise ValueError(f"python's key is not {MT_KEYS} 32-bit words")
    if not (type(position) is int and 0 <= position <= MT_KEYS):
        raise ValueError(f"python's key position is {str(position)[:40]}, not 0 to {MT_KEYS}")
    if state[2] is not None and not (_is_number(state[2]) and math.isfinite(state[2])):
        raise ValueError("python's cached Gaussian is not a number")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_trained_agent(path: Path, overrides: Sequence[str] = ()) -> tuple[Config, AgentModels]:
    """The config a checkpoint was trained with (`overrides`, `key=value`, applied to it) and its policy, ready
    for evaluation."""
    _require_complete(path)
    config = load_config(path / "config.yaml", list(overrides))
    models = load_agent_models(config.model, seed=config.seed)
    load_policy(models, path / "policy")
    return config, models


def require_plain_deepspeed_files(directory: Path) -> None:
    """Refuse DeepSpeed's pickled shards unless every object they name is a tensor, a number or a container.

    DeepSpeed reads its shards with a full unpickler; this reads their opcodes first, without running them."""
    for shard in sorted(directory.rglob("*.pt")):
        try:
            named = set(torch.serialization.get_unsafe_globals_in_checkpoint(shard))
        except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
            raise CheckpointError(f"{shard}: not a readable DeepSpeed shard ({first_line(exc)})") from None
        foreign = sorted(named - DEEPSPEED_GLOBALS)
        if foreign:
            raise CheckpointError(f"{shard}: refused, it would build {foreign[0]} (only plain state is loaded)")


@contextmanager
def damaged_if_refused(stem: Path) -> Iterator[None]:
    """A state that parsed but does not fit (a missing key, a wrong shape) is a damaged checkpoint."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, OverflowError) as exc:
        raise CheckpointError(f"{stem}.json: the saved state does not fit this run ({first_line(exc)})") from None


def _training_state(path: Path) -> TrainingState:
    saved = read_json_object(path)
    expected = {field.name for field in fields(TrainingState)}
    if set(saved) != expected or not all(type(value) is int and value >= 0 for value in saved.values()):
        raise CheckpointError(f"{path}: expected {{'step': N}} with a whole number N, found {json.dumps(saved)[:80]}")
    return TrainingState(**saved)


def _require_complete(path: Path) -> None:
    if not path.is_dir():
        raise UsageError(f"checkpoint not found: '{path}' (look in runs/<name>/checkpoints/)")
    if (path / "optimizer.pt").exists() and not state_files(path, OPTIMIZER_STEM)[0].exists():
        raise CheckpointError(
            f"checkpoint '{path}' keeps its state as pickles (optimizer.pt), which r1trade does not load: "
            "unpickling can run code"
        )
    needed = ["policy", "critic", "config.yaml", STATE_FILE]
    needed += [file.name for stem in (OPTIMIZER_STEM, _rng_stem(0)) for file in state_files(path, stem)]
    missing = [name for name in needed if not (path / name).exists()]
    if missing:
        raise UsageError(f"incomplete checkpoint '{path}': missing {', '.join(missing)}")


# --------------------------------------------------------------------------- the policy and the critic

_IDENTITY_FILE = "r1trade_model.json"
_DEFAULT_TINY_SHAPE = (
    ModelConfig.model_fields["tiny_layers"].default, ModelConfig.model_fields["tiny_hidden_size"].default
)


def save_policy(models: AgentModels, directory: Path) -> None:
    """Write the policy to `directory`: the LoRA adapter (peft format) or the full model as safetensors, the
    tokenizer, and the model identity that `load_policy` checks."""
    directory.mkdir(parents=True, exist_ok=True)
    models.policy.save_pretrained(directory)
    models.tokenizer.save_pretrained(directory)
    _write_identity(directory, "policy", models.config)


def load_policy(models: AgentModels, directory: Path) -> None:
    """Load a `save_policy` checkpoint into `models.policy` in place (optimizer references stay valid)."""
    _check_identity(directory, "policy", models.config)
    if models.lora:
        weights = read_tensors(directory / "adapter_model.safetensors")
        try:
            result = set_peft_model_state_dict(models.policy, weights)
        except RuntimeError as exc:  # a tensor of the wrong shape
            raise CheckpointError(f"{directory}: the adapter does not fit ({first_line(exc)})") from None
        missing = [key for key in result.missing_keys if "lora_" in key]
        if result.unexpected_keys or missing:
            raise UsageError(
                f"{directory}: the adapter does not fit the policy ({len(missing)} tensors missing)"
            )
    else:
        require_no_model_code(directory, files=["config.json"])  # a planted auto_map: refused before transformers
        try:  # safetensors only: a pickled pytorch_model.bin beside it is never read
            saved = AutoModelForCausalLM.from_pretrained(
                directory, dtype=model_dtype(models.config), use_safetensors=True, local_files_only=True,
                trust_remote_code=False,
            )
            models.policy.load_state_dict(saved.state_dict())
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
            raise CheckpointError(f"{directory}: cannot load the policy's weights ({first_line(exc)})") from None


def save_critic(models: AgentModels, directory: Path) -> None:
    """Write the critic's trainable tensors (the head, plus a separate backbone's adapter or weights) to
    `directory/critic.safetensors`, with the model identity that `load_critic` checks."""
    directory.mkdir(parents=True, exist_ok=True)
    named = models.critic.named_parameters()
    tensors = {name: p.detach().contiguous() for name, p in named if p.requires_grad}
    save_file(tensors, directory / "critic.safetensors")
    _write_identity(directory, "critic", models.config)


def load_critic(models: AgentModels, directory: Path) -> None:
    """Load a `save_critic` checkpoint into `models.critic` in place."""
    _check_identity(directory, "critic", models.config)
    tensors = read_tensors(directory / "critic.safetensors")
    expected = {name for name, p in models.critic.named_parameters() if p.requires_grad}
    if set(tensors) != expected:
        raise UsageError(
            f"{directory}: the checkpoint does not fit the critic"
            f" ({len(expected - set(tensors))} tensors missing, {len(set(tensors) - expected)} unexpected)"
        )
    try:
        models.critic.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # a tensor of the wrong shape
        raise CheckpointError(f"{directory}: the critic's tensors do not fit ({first_line(exc)})") from None


def _identity(part: str, model_config: ModelConfig) -> dict[str, object]:
    """What a checkpoint's weights depend on: the base model, the adapter shape and, for the critic, its kind."""
    lora = model_config.lora
    identity: dict[str, object] = {
        "part": part,
        "name_or_path": model_config.name_or_path,
        "lora": None,
    }
    if lora.enabled:
        identity["lora"] = {"r": lora.r, "alpha": lora.alpha, "target_modules": lora.target_modules}
    if built_in_code(model_config.name_or_path):
        identity["tiny_seed"] = model_config.tiny_seed
    shape = (model_config.tiny_layers, model_config.tiny_hidden_size)
    if model_config.name_or_path in (TINY_RANDOM, TINY_RANDOM_QWEN) and shape != _DEFAULT_TINY_SHAPE:
        identity["tiny_shape"] = list(shape)  # only off the default, so the checkpoints written before it still load
    if part == "critic":
        identity["critic"] = model_config.critic
        identity["critic_name_or_path"] = model_config.critic_name_or_path
    return identity


def _write_identity(directory: Path, part: str, model_config: ModelConfig) -> None:
    (directory / _IDENTITY_FILE).write_text(json.dumps(_identity(part, model_config), indent=1) + "\n")


def _check_identity(directory: Path, part: str, model_config: ModelConfig) -> None:
    path = directory / _IDENTITY_FILE
    if not path.is_file():
        raise UsageError(f"not a {part} checkpoint: {path} is missing")
    saved = read_json_object(path)
    if saved.get("part") != part:
        raise UsageError(f"not a {part} checkpoint: {directory} holds a {saved.get('part')}")
    expected = _identity(part, model_config)
    keys = [*expected, *(key for key in saved if key not in expected)]  # a key either side may lack
    differ = [f"{key} {saved.get(key)!r} vs {expected.get(key)!r}" for key in keys if saved.get(key) != expected.get(key)]
    if differ:
        raise UsageError(f"{directory} holds a {part} for another model config ({', '.join(differ)})")
