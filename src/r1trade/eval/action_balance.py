"""Does a warm start sample every action it was shown? RL learns which action to take by comparing the actions it
samples, so a warm start that almost never samples one of them leaves RL no trades of it to learn from.

SmolLM2's tool-gated warm start of seed 1 sampled long at none of its first update's decisions, on two CPU kinds,
and its run never read the tool's answer; seed 0's sampled long at 35 % and read (results-log section 65).
`warmstart.min_action_share` checks a trained warm start on the episodes of RL's first update, sampled as RL
samples them, before RL spends hours on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from r1trade.config import Config
from r1trade.env.information import decision_kind
from r1trade.env.trading_env import make_envs
from r1trade.models.loading import load_base_model
from r1trade.rl.trainer import rollout_starts
from r1trade.rollout.backend import sampling_from_config
from r1trade.rollout.build import transformers_engine
from r1trade.rollout.loop import Trajectory

DEMONSTRATED_KINDS = {"long": "Long", "short": "Short", "hold": "Hold", "close": "Close"}
"""The decision kind (`decision_kind`) of each action a random warm start demonstrates."""


def action_shares(decisions: Sequence[Mapping[str, Any]], actions: Sequence[str]) -> dict[str, float]:
    """Each of `actions`' share of the decisions that took one of them; forced holds and other actions aside. With
    no such decision every share is 0.

    >>> trade = lambda target: {"forced_hold": False, "order": {"action": "place_order", "target": target}}
    >>> action_shares([trade(1), trade(-1), trade(-1), trade(-1), {"forced_hold": True}], ["long", "short"])
    {'long': 0.25, 'short': 0.75}
    """
    kinds = [decision_kind(info) for info in decisions]
    counts = {action: kinds.count(DEMONSTRATED_KINDS[action]) for action in actions}
    total = sum(counts.values())
    return {action: count / total if total else 0.0 for action, count in counts.items()}


def first_update_shares(config: Config, model_dir: Path) -> dict[str, float]:
    """`action_shares` of `warmstart.actions` over the decisions of `first_update_rollout`."""
    trajectories = first_update_rollout(config, model_dir)
    decisions = [turn.info for t in trajectories for turn in t.turns if turn.info.get("decision_done")]
    return action_shares(decisions, config.warmstart.actions)


def first_update_rollout(config: Config, model_dir: Path) -> list[Trajectory]:
    """The episodes of RL's first update (`rollout_starts`) played by the model in `model_dir`, sampled with the
    rollout's settings from RL's generator seed: before its first step, RL's policy is this model."""
    model, tokenizer = load_base_model(config.model.model_copy(update={"name_or_path": str(model_dir)}))
    engine = transformers_engine(model.eval(), tokenizer, sampling_from_config(config.rollout))
    groups, seeds = rollout_starts(config, step=0)
    generator = torch.Generator().manual_seed(config.seed)
    return engine.run(make_envs(config, len(seeds), "train"), seeds, groups=groups, generator=generator)
