"""A text bandit: the sanity check that an RL algorithm can learn at all (CartPole before Atari).

The model is asked for a word (once, or once per decision); its *action* is the first character it writes, and the
reward depends on that action alone: `reward` if it is an ASCII letter, 0 otherwise. Everything it writes after
the first character is noise the reward ignores, so a turn of `max_new_tokens` tokens buries one deciding token
among many others, as a trade call's side hides among its reasoning. Because the action is the first sampled token's first character,
the probability of the rewarded action is known exactly from the policy's next-token distribution at the prompt
(`rewarded_probability`), without sampling.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r1trade.models.chat import ChatTokens

REWARDED = frozenset(string.ascii_letters)
SYSTEM = "Reply with one word."


def is_rewarded(text: str) -> bool:
    """Whether a reply's action (its first character) is the rewarded one."""
    return bool(text) and text[0] in REWARDED


class LetterBandit:
    """`decisions` decisions per episode, each rewarded `reward` when the reply starts with an ASCII letter, else 0.

    `noise` adds to each decision a reward shared by every member of a start-state group (drawn from the episode
    seed and the decision index, like a market move that every member of the group faces at that bar): it changes
    no comparison within a group at the same decision, but swamps the action's signal across groups and, in an
    episode's return, the other decisions' signal.
    """

    def __init__(self, reward: float = 1.0, noise: float = 0.0, decisions: int = 1) -> None:
        self.reward = reward
        self.noise = noise
        self.decisions = decisions
        self.seed: int | None = None
        self.decision = 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        self.seed, self.decision = seed, 0
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Your word:"}], {}

    def step(self, text: str) -> tuple[list[dict], float, bool, bool, dict]:
        action = self.reward if is_rewarded(text) else 0.0
        shared = 0.0
        if self.noise > 0:
            generator = torch.Generator().manual_seed((self.seed or 0) * 7919 + self.decision)
            shared = self.noise * float(torch.randn((), generator=generator))
        info = {
            "reward_components": {"action": action, "shared_noise": shared},
            "parse_error": None,
            "decision_index": self.decision,
        }
        self.decision += 1
        done = self.decision >= self.decisions
        messages = [{"role": "tool", "content": "ok"}]
        if not done:
            messages.append({"role": "user", "content": "Your word:"})
        return messages, action + shared, done, False, info


def rewarded_token_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """Ids of the tokens whose text starts with a rewarded character. -> (V,) bool

    A token that decodes to a partial UTF-8 byte can only complete a non-ASCII character, never a rewarded one.
    """
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    return torch.tensor([is_rewarded(text) for text in texts])


@torch.no_grad()
def rewarded_probability(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, temperature: float = 1.0
) -> float:
    """P(the first sampled token starts with a rewarded character) under the policy at the bandit's prompt."""
    messages, _ = LetterBandit().reset(seed=0)
    ids = torch.tensor([ChatTokens(tokenizer).context(messages)], device=model.device)
    logits = model(input_ids=ids).logits[0, -1].float() / temperature  # (V,)
    probs = torch.softmax(logits, dim=-1)
    mask = rewarded_token_ids(tokenizer).to(probs.device)
    return float(probs[: len(mask)][mask].sum())


def learning_curve(
    config, run_dir, *, reward: float = 1.0, noise: float = 0.0, decisions: int = 1
) -> list[float]:
    """Train on the bandit with the real `Trainer` for `config.train.updates` updates. -> P(rewarded action) at the
    first decision, before the first update and after each one (exact, at the rollout temperature)."""
    from r1trade.models.loading import load_agent_models
    from r1trade.rl.trainer import Trainer

    models = load_agent_models(config.model, seed=config.seed)
    temperature = config.rollout.temperature if config.rollout.temperature > 0 else 1.0

    def probability() -> float:
        return rewarded_probability(models.policy, models.tokenizer, temperature=temperature)

    curve = [probability()]
    trainer = Trainer(
        config, models, lambda n: [LetterBandit(reward, noise, decisions) for _ in range(n)], Path(run_dir),
        on_update=lambda _: curve.append(probability()),
    )
    trainer.train()
    return curve
