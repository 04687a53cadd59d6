"""`train.engine: trl`: the GRPOConfig a run's config maps to, and the settings TRL cannot honour, refused.

Mapped: `train.learning_rate`, `warmup_updates` (optimiser steps, as in r1trade's loop), `max_grad_norm`,
`group_size` → `num_generations`, `epochs` → `num_iterations`, `kl_coef` → `beta` (TRL's KL is the k3 estimator in
the loss, as r1trade's group algorithms use it), `clip_low`/`clip_high` → `epsilon`/`epsilon_high`, `entropy_coef`,
`grpo`/`dr_grpo` → `scale_rewards` group/none, `seed`, `rollout.temperature`/`top_p`, `model.gradient_checkpointing`.
One update is one generation round of `rollout.num_envs` episodes per process, trained in minibatches of
`train.minibatch_size` rows (`per_device_train_batch_size` = `micro_batch_size`, accumulated) for `epochs` passes,
so `updates` → `max_steps` = updates × epochs × num_envs / minibatch_size optimiser steps.
TRL caps the whole multi-turn completion, tool results included, not each turn: `max_completion_length` defaults to
`rollout.max_new_tokens` × the most turns an episode can take (`episode_decisions` × `max_tool_calls`), the most
turns also cap the tool-calling rounds, and `train.trl_args.max_completion_length` raises the cap where tool results
are long. `train.trl_args` sets any other GRPOConfig argument (vLLM, bf16, ...), not the mapped ones, nor those
that could make TRL load code (`r1trade.config.TRL_ARGS_REFUSED`): TRL gets `trust_remote_code` false, in
`model_init_kwargs` too, for the reference model it loads itself.

Refused, each in one line: algorithms other than grpo and dr_grpo (TRL 1.16 has no PPO trainer and its
RLOOTrainer takes no `environment_factory`), credit settings (one advantage per completion), the critic, the mask
ablations, StarPO-S group filtering and DAPO's dynamic sampling, GiGPO's step groups, sequence-level loss
averaging, the KL in the reward, greedy sampling, and full fine-tuning with a KL for a model not loaded from a
folder (TRL loads its reference from the policy's folder).
`logprob_chunk`, `share_prefix`, `minibatches`, `old_logprobs` and the echo-trap thresholds tune r1trade's own
loop and have no effect here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from r1trade.config import Config, ModelConfig, TrainConfig
from r1trade.errors import ConfigError
from r1trade.models.loading import loads_from_directory

ALGORITHMS = {"grpo": "group", "dr_grpo": "none"}
"""The algorithms TRL's GRPOTrainer runs, with the `scale_rewards` that makes them."""

_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("credit", "GRPOTrainer gives a completion one advantage, its episode reward against its group's"),
    ("gamma", "GRPOTrainer gives a completion one advantage, its episode reward against its group's"),
    ("lam", "GRPOTrainer gives a completion one advantage, its episode reward against its group's"),
    ("turn_gamma", "GRPOTrainer gives a completion one advantage, its episode reward against its group's"),
    ("decision_advantage_coef", "GRPOTrainer has no per-decision baseline"),
    ("critic_learning_rate", "GRPOTrainer has no critic"),
    ("value_coef", "GRPOTrainer has no critic"),
    ("value_clip", "GRPOTrainer has no critic"),
    ("loss_mask", "GRPOTrainer always trains on the model's own tokens (tool results masked by tool_mask)"),
    ("advantage_mask", "GRPOTrainer always trains on the model's own tokens (tool results masked by tool_mask)"),
    ("top_group_frac", "GRPOTrainer keeps every group"),
    ("dynamic_sampling", "GRPOTrainer keeps every group"),
    ("step_groups", "GRPOTrainer gives a completion one advantage, its episode reward against its group's"),
    ("loss_aggregation", "r1trade maps its group algorithms to GRPOTrainer's token-level loss_type"),
    ("side_balance_coef", "GRPOTrainer's loss has no per-token choice"),
)
"""train.* keys whose non-default values TRL cannot reproduce, and why."""


def check_trl_settings(config: Config) -> None:
    """Refuse, in one line, the first setting of `config` that TRL's GRPOTrainer cannot honour (exit 2)."""
    train = config.train
    if train.algorithm not in ALGORITHMS:
        raise ConfigError(
            f"train.engine trl trains with TRL's GRPOTrainer: set train.algorithm to grpo or dr_grpo, not "
            f"{train.algorithm} (TRL 1.16 has no PPO trainer, and its RLOOTrainer takes no environment_factory)"
        )
    for key, why in _UNSUPPORTED:
        value, default = getattr(train, key), TrainConfig.model_fields[key].default
        if value != default:
            raise ConfigError(f"train.engine trl: train.{key} {value!r} has no TRL counterpart ({why}); "
                              f"leave it at {default!r}")
    if train.kl_placement == "reward":
        raise ConfigError("train.engine trl: GRPOTrainer's KL is a term of its loss; set train.kl_placement to auto "
                          "or loss, not reward")
    model = config.model
    if (model.critic, model.critic_name_or_path) != (ModelConfig.model_fields["critic"].default, None):
        raise ConfigError("train.engine trl: GRPOTrainer has no critic; leave model.critic and critic_name_or_path")
    if not model.lora.enabled and train.kl_coef > 0 and not loads_from_directory(model.name_or_path):
        raise ConfigError(
            f"train.engine trl: full fine-tuning with train.kl_coef > 0 needs a model directory TRL can load its "
            f"reference from; '{model.name_or_path}' has none: enable model.lora or set train.kl_coef 0"
        )
    if config.rollout.temperature == 0:
        raise ConfigError("train.engine trl: GRPOTrainer samples; set rollout.temperature above 0")
    if config.rollout.num_envs % train.group_size:
        raise ConfigError(f"train.engine trl: rollout.num_envs ({config.rollout.num_envs}) must be a multiple of "
                          f"train.group_size ({train.group_size}): TRL generates whole groups")
    if config.rollout.num_envs % train.minibatch_size or train.minibatch_size % train.micro_batch_size:
        raise ConfigError(f"train.engine trl: rollout.num_envs ({config.rollout.num_envs}) must be a multiple of "
                          f"train.minibatch_size ({train.minibatch_size}), and that of train.micro_batch_size "
                          f"({train.micro_batch_size}): TRL steps on whole accumulated minibatches")


def steps_per_update(config: Config) -> int:
    """Optimiser steps in one update: `epochs` passes over `num_envs` episodes in minibatches."""
    return config.train.epochs * config.rollout.num_envs // config.train.minibatch_size


def most_turns(config: Config) -> int:
    """The most model turns an episode can take: every decision using all its tool calls."""
    return config.env.episode_decisions * config.env.max_tool_calls


def grpo_arguments(config: Config, run_dir: Path) -> dict[str, Any]:
    """GRPOConfig's keyword arguments for `config` (checked by `check_trl_settings` first), with `train.trl_args`
    on top; a `trl_args` key that r1trade maps from its own keys is refused."""
    check_trl_settings(config)
    train, rollout = config.train, config.rollout
    mapped: dict[str, Any] = {
        "seed": config.seed,
        "learning_rate": train.learning_rate,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": train.warmup_updates,
        "weight_decay": 0.0,
        "max_grad_norm": train.max_grad_norm,
        "num_generations": train.group_size,
        "per_device_train_batch_size": train.micro_batch_size,
        "gradient_accumulation_steps": train.minibatch_size // train.micro_batch_size,
        "steps_per_generation": rollout.num_envs // train.micro_batch_size,
        "num_iterations": train.epochs,
        "max_steps": train.updates * steps_per_update(config),
        "beta": train.kl_coef,
        "epsilon": train.clip_low,
        "epsilon_high": train.clip_high,
        "entropy_coef": train.entropy_coef,
        "scale_rewards": ALGORITHMS[train.algorithm],
        "loss_type": "dapo",  # a mean over the minibatch's sampled tokens, as r1trade's losses
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "max_tool_calling_iterations": most_turns(config),
        "activation_checkpointing": config.model.gradient_checkpointing,
        "output_dir": str(run_dir),
        "save_strategy": "no",  # r1trade writes its own checkpoints
        "logging_steps": 1,
        "report_to": "none",  # `train.tensorboard` logs r1trade's per-update metrics
        "shuffle_dataset": False,  # the windows are drawn at random already
        "disable_tqdm": True,
        "dataloader_pin_memory": torch.cuda.is_available(),
    }
    clashes = sorted(set(train.trl_args) & set(mapped))
    if clashes:
        raise ConfigError(f"train.trl_args.{clashes[0]} is set from r1trade's own config keys (see "
                          "r1trade.integrations.trl.settings): set those instead")
    defaults = {
        "use_vllm": False,
        "bf16": False,
        "max_completion_length": rollout.max_new_tokens * most_turns(config),
        "use_cache": True,  # transformers' Trainer turns the KV cache off, and `generate` would redo the whole context
    }
    no_model_code = {"trust_remote_code": False, "model_init_kwargs": {"trust_remote_code": False}}
    return {**defaults, **mapped, **train.trl_args, **no_model_code}
