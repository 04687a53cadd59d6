"""Can the trainer learn at all? A text bandit on the tiny model, through the real `Trainer` (CartPole before Atari).

The reward depends only on the first character the model writes (an ASCII letter earns 1), so P(rewarded action)
is known exactly from the policy at the prompt. Each algorithm must raise it from about 0.5 to at least 0.9 within a
fixed budget; with long turns, where one deciding token hides among many, credit per turn must beat token-level
GAE (lambda 0.95), whose reward fades over the turn's tokens and whose critic noise does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from r1trade.config import Config, load_config
from r1trade.rl.bandit import learning_curve


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny model runs fastest on one thread (and two threads fight on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bandit_config(*, turn_tokens: int, updates: int, seed: int = 0, **train) -> Config:
    overrides = [
        f"seed={seed}", "model.name_or_path=tiny-random", "model.lora.enabled=false", "rollout.num_envs=16",
        f"rollout.max_new_tokens={turn_tokens}", f"train.updates={updates}", "train.learning_rate=0.01",
        "train.critic_learning_rate=0.003", "train.epochs=2", "train.minibatch_size=8", "train.micro_batch_size=8",
        "train.kl_coef=0", "train.entropy_coef=0", "train.checkpoint_every=1000",
        # the value head shares the policy's backbone: a small value loss keeps it from shaking the policy
        "train.value_coef=0.1",
    ]
    return load_config(None, overrides + [f"train.{key}={value}" for key, value in train.items()])


@pytest.mark.parametrize(
    "train",
    [{"algorithm": "ppo", "credit": "turn"}, {"algorithm": "grpo", "group_size": 4}, {"algorithm": "reinforce_pp"}],
    ids=["ppo-turn", "grpo", "reinforce_pp"],
)
def test_each_algorithm_learns_the_bandit(tmp_path: Path, train: dict) -> None:
    curve = learning_curve(bandit_config(turn_tokens=8, updates=25, **train), tmp_path)
    assert 0.35 < curve[0] < 0.65, curve  # about even odds before training
    assert curve[-1] >= 0.9, curve


@pytest.mark.slow
def test_token_level_gae_learns_less_than_turn_level_credit_with_long_turns(tmp_path: Path) -> None:
    """32-token turns, the deciding token first: mean P over the last five updates, over two seeds."""
    finals = {}
    for credit in ("turn", "token"):
        tails = []
        for seed in (0, 1):
            config = bandit_config(turn_tokens=32, updates=20, seed=seed, credit=credit, lam=0.95)
            curve = learning_curve(config, tmp_path / f"{credit}-{seed}")
            tails.append(sum(curve[-5:]) / 5)
        finals[credit] = sum(tails) / len(tails)
    assert finals["token"] < 0.9, finals
    assert finals["turn"] > finals["token"] + 0.08, finals
