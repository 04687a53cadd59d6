"""The agent's models as rollouts and training hold them (`AgentModels`, built by `r1trade.models.loading`), the
reference policy the KL term compares with, and the parameters each optimiser group trains."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from peft import PeftModel
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r1trade.config import ModelConfig
from r1trade.models.scoring import Critic


@dataclass
class AgentModels:
    """Everything rollouts and training need from the model side; `load_agent_models` returns it in eval mode."""

    policy: nn.Module
    """The causal LM that acts: a peft model with a LoRA adapter, or the full transformers model."""
    tokenizer: PreTrainedTokenizerBase
    critic: Critic
    reference: PreTrainedModel | None
    """A frozen copy of the base model for full fine-tuning; None with LoRA (the adapter is switched off instead)."""
    config: ModelConfig

    @property
    def lora(self) -> bool:
        """True when the policy trains a LoRA adapter rather than all its weights."""
        return isinstance(self.policy, PeftModel)


@contextmanager
def reference_context(models: AgentModels) -> Iterator[nn.Module]:
    """Yield a model that gives the reference policy's log-probs (for the KL term), with gradients off.

    With LoRA it is the policy itself with its adapter disabled (no second copy in memory); for full fine-tuning
    it is the frozen copy taken at load time. A value-head critic called inside also sees the adapter disabled.
    """
    with torch.no_grad():
        if models.reference is not None:
            yield models.reference
        else:
            with models.policy.disable_adapter():
                yield models.policy


def trainable_parameters(models: AgentModels) -> dict[str, list[nn.Parameter]]:
    """Disjoint trainable parameters: `policy` (adapter or all weights) and `critic` (head, plus its own backbone)."""
    return {
        "policy": [p for p in models.policy.parameters() if p.requires_grad],
        "critic": [p for p in models.critic.parameters() if p.requires_grad],
    }
