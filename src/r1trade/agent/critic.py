"""The backbone forward pass shared by policy and critic, and the critic: a value per token position.

`backbone_hidden` runs a causal LM (or its LoRA wrapper) up to the final norm, without the 49k-vocab head, so the
trainer can compute the policy's log-probs (in chunks) and a value head's values from one forward pass.
"""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from peft import PeftModel
from torch import nn
from transformers import DynamicCache, PreTrainedModel

CriticKind = Literal["value_head", "separate"]


def causal_lm(model: nn.Module) -> PreTrainedModel:
    """The transformers causal LM inside `model` (unwrapping a peft model; its LoRA layers stay in place)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token, so left padding changes no output. -> (B, T)"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)


def backbone_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, share_prefix: bool = False
) -> torch.Tensor:
    """Final hidden states (after the last norm) of a causal LM for (B, T) token ids. -> (B, T, H)

    With `share_prefix`, the leading tokens every row has in common (`common_prefix_length`: the system prompt,
    and the first observation too where the rows replay the same window) go through the model once for the
    batch; each row then runs only its own tokens, attending to the prefix's keys and values. The result, and its
    gradients (the prefix's sum over the rows that read it), are those of the plain pass up to float rounding.
    """
    decoder = causal_lm(model).get_decoder()
    positions = position_ids_from_mask(attention_mask)  # (B, T)
    shared = common_prefix_length(input_ids, attention_mask) if share_prefix else 0
    if shared == 0:
        # rows padded on the right only need no mask: causality alone keeps every real token from the padding,
        # and the causal kernel skips the masked half of the scores
        mask = None if right_padded(attention_mask) else attention_mask
        output = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
        return output.last_hidden_state  # (B, T, H); padding positions hold values nothing reads
    rows = input_ids.shape[0]
    prefix = decoder(
        input_ids=input_ids[:1, :shared], attention_mask=attention_mask[:1, :shared],
        position_ids=positions[:1, :shared], use_cache=True,
    )
    # every row reads the prefix's keys and values (B, H_kv, P, D): a view, so their gradients add up in it
    cache = DynamicCache(
        [(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1))
         for layer in prefix.past_key_values.layers],
        config=decoder.config,
    )
    own = decoder(
        input_ids=input_ids[:, shared:], attention_mask=attention_mask, position_ids=positions[:, shared:],
        use_cache=True, **{_cache_keyword(decoder): cache},
    )
    prefix_hidden = prefix.last_hidden_state.expand(rows, -1, -1)  # (B, P, H)
    return torch.cat([prefix_hidden, own.last_hidden_state], dim=1)  # (B, T, H)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is its real tokens followed by padding (no padding before or between them)."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def _cache_keyword(decoder: nn.Module) -> str:
    """The name the decoder takes its key/value cache by: `cache` since transformers 5.2x, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading columns hold the same real token in every row, leaving each row at least its last column
    to run on its own (0 if the rows differ at once)."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)  # (T,)
    differs = (~same).nonzero()
    length = int(differs[0]) if len(differs) else input_ids.shape[1]
    return min(length, input_ids.shape[1] - 1)


class Critic(nn.Module):
    """V(prefix up to and including token t) for every position t: a linear head on a backbone's hidden states.

    kind `value_head`: the head sits on the policy's own backbone, which is deliberately not registered here, so
    this module's parameters, `state_dict` and checkpoints hold the head alone (with LoRA the shared trainable part
    of the backbone is the policy's adapter, trained by the policy and value losses together).
    kind `separate`: the critic owns its backbone (its own LoRA adapter or a full copy) and the head.
    The head computes in float32 whatever the backbone's dtype.
    """

    def __init__(self, kind: CriticKind, backbone: nn.Module, *, seed: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "separate":
            self.backbone = backbone
        else:
            self._shared = (backbone,)  # a tuple keeps the policy's parameters out of this module
        hidden_size = causal_lm(backbone).config.hidden_size
        self.head = nn.Linear(hidden_size, 1)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # small init, as OpenRLHF: initial values near 0
            self.head.weight.normal_(0.0, 1.0 / (hidden_size + 1), generator=generator)
            self.head.bias.zero_()

    @property
    def shares_policy_backbone(self) -> bool:
        """True for a value head on the policy: pass the policy's `backbone_hidden` output to `forward`."""
        return self.kind == "value_head"

    def backbone_model(self) -> nn.Module:
        """The model whose hidden states the head reads (the policy itself for a value head)."""
        return self._shared[0] if self.kind == "value_head" else self.backbone

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        hidden: torch.Tensor | None = None,
        share_prefix: bool = False,
    ) -> torch.Tensor:
        """Values (B, T) for (B, T) token ids; `hidden` (B, T, H) reuses the policy's forward pass (value head only);
        `share_prefix` as in `backbone_hidden`."""
        if hidden is None:
            hidden = backbone_hidden(
                self.backbone_model(), input_ids, attention_mask, share_prefix=share_prefix
            )  # (B, T, H)
        elif not self.shares_policy_backbone:
            raise ValueError("a separate critic computes its own hidden states; pass hidden=None")
        return self.head(hidden.float()).squeeze(-1)  # (B, T)
