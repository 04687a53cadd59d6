"""The smoke config as a `train.engine: trl` run: the tiny model with a Qwen template, groups of 2, one optimiser
step an update; and `r1trade` run as a command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from r1trade.config import Config, load_config

TRL = [
    "train.engine=trl", "model.name_or_path=tiny-random-qwen", "model.lora.enabled=true", "env.prompt=compact",
    "train.algorithm=grpo", "train.group_size=2", "rollout.num_envs=2", "train.minibatch_size=2",
    "train.micro_batch_size=2", "train.epochs=1",
]
SHORT_EPISODES = ["rollout.max_new_tokens=16", "env.episode_decisions=1", "env.max_tool_calls=1"]
"""One decision of one call an episode: an update takes seconds on a CPU."""


def trl_config(*overrides: str) -> Config:
    return load_config("smoke", [*TRL, *overrides])


def run_r1trade(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`r1trade ARGS` in a subprocess, offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "r1trade.cli", *args], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
