"""The smoke config as a `train.engine: trl` run: the tiny model with a Qwen template, groups of 2, one optimiser
step an update."""

from __future__ import annotations

from r1trade.config import Config, load_config

TRL = [
    "train.engine=trl", "model.name_or_path=tiny-random-qwen", "model.lora.enabled=true", "env.prompt=compact",
    "train.algorithm=grpo", "train.group_size=2", "rollout.num_envs=2", "train.minibatch_size=2",
    "train.micro_batch_size=2", "train.epochs=1",
]


def trl_config(*overrides: str) -> Config:
    return load_config("smoke", [*TRL, *overrides])
