"""Helpers for the agent, rollout and trainer tests that play the tiny random agent (conftest's `tiny_agent`, built
in code, no download): its config, batched text for it, and a scripted text environment to play it in."""

from __future__ import annotations

import torch

from r1trade.config import ModelConfig
from r1trade.models.agent_models import AgentModels

TOOL_CALL = (
    '<tool_call>{"name": "place_order", "arguments": {"side": "buy", "size": 0.5, "view": "bullish"}}</tool_call>'
)
TEXTS = [f"Price 42017.5, RSI 71.3. {TOOL_CALL}", "Hold: the trend is up."]


def tiny_config(**changes: object) -> ModelConfig:
    return ModelConfig(name_or_path="tiny-random", **changes)


def batch(models: AgentModels, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, T) ids and attention mask."""
    models.tokenizer.padding_side = "left"
    encoded = models.tokenizer(texts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def perturb_trainable(module: torch.nn.Module, seed: int = 1) -> None:
    """Move every trainable weight (e.g. LoRA B, zero at init) so the model differs from its base."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))


class ScriptedEnv:
    """A text env with a fixed number of turns; resets its context every `reset_every` turns."""

    def __init__(self, turns: int = 3, reset_every: int = 0) -> None:
        self.turns, self.reset_every = turns, reset_every
        self.t = 0
        self.seen: list[str] = []

    def reset(self, seed=None, options=None):
        self.t, self.seed = 0, seed
        return [{"role": "system", "content": "You trade."}, {"role": "user", "content": f"Start {seed}: price 100"}], {}

    def step(self, text):
        self.seen.append(text)
        self.t += 1
        done = self.t >= self.turns
        info = {"turn": self.t, "context_reset": bool(self.reset_every) and self.t % self.reset_every == 0}
        if info["context_reset"]:
            messages = [{"role": "system", "content": "You trade."}, {"role": "user", "content": f"Summary {self.t}"}]
        else:
            messages = [{"role": "tool", "content": f"result {self.t}"}, {"role": "user", "content": f"price {100 + self.t}"}]
        return messages, float(self.t), done, False, info
