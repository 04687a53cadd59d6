"""Log-probs, entropy and values of token sequences: what the trainer (and the evaluation) computes from the models.

`backbone_hidden` runs a causal LM (or its LoRA wrapper) up to the final norm, without the 49k-vocab head, so the
policy's log-probs (in chunks, `token_logprobs`) and the critic's values (a value head on the policy's backbone,
or a separate backbone) come from one forward pass (`token_outputs`). With the sampling temperature, the log-probs
are those the rollout recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from peft import PeftModel
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from r1trade.models.prefix import common_prefix_length, hidden_after_shared_prefix

CriticKind = Literal["value_head", "separate"]
DEFAULT_CHUNK_SIZE = 512
"""Rows of the 49k-vocab logits computed at once by `token_logprobs`: 512 rows of float32 logits are ~100 MB."""


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
    batch (`hidden_after_shared_prefix`). The result, and its gradients, are those of the plain pass up to float
    rounding.

    With activation checkpointing on (`model.gradient_checkpointing`) and gradients enabled, each decoder layer
    keeps only its input and recomputes the rest in the backward pass (`checkpointed_layers`); every row then
    runs in full, since the shared prefix's key/value cache would be written twice by the recomputation.
    """
    decoder = causal_lm(model).get_decoder()
    positions = position_ids_from_mask(attention_mask)  # (B, T)
    checkpointed = checkpointed_layers(decoder) if torch.is_grad_enabled() else []
    shared = common_prefix_length(input_ids, attention_mask) if share_prefix and not checkpointed else 0
    if shared:
        return hidden_after_shared_prefix(decoder, input_ids, attention_mask, positions, shared)
    # rows padded on the right only need no mask: causality alone keeps every real token from the padding,
    # and the causal kernel skips the masked half of the scores
    mask = None if right_padded(attention_mask) else attention_mask
    with _training_flag(checkpointed):
        output = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return output.last_hidden_state  # (B, T, H); padding positions hold values nothing reads


def checkpointed_layers(decoder: nn.Module) -> list[GradientCheckpointingLayer]:
    """The decoder layers set to checkpoint their activations (`activation_checkpointing_enable`)."""
    return [m for m in decoder.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@contextmanager
def _training_flag(layers: list[GradientCheckpointingLayer]) -> Iterator[None]:
    """transformers checkpoints a layer only while that layer module is in training mode, and the policy stays in
    eval mode (no dropout). So the flag is set on the layer modules alone, for one pass: their submodules
    (attention, dropout) keep eval mode, and the outputs are those of eval mode."""
    before = [layer.training for layer in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, was in zip(layers, before, strict=True):
            layer.training = was


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is its real tokens followed by padding (no padding before or between them)."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    token_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    hidden: torch.Tensor | None = None,
    share_prefix: bool = False,
) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, :t]) as (B, T) float32; unscored positions get 0.

    A token is scored when it and the token before it are real (`attention_mask` 1), so a row's first token
    never is, and when `token_mask` (e.g. the action mask), if given, is 1 at it. Scoring runs in
    chunks of `chunk_size` rows of logits, so the (B, T, vocab) logits never exist at once. With gradients on,
    each chunk is recomputed in the backward pass instead of being stored. `hidden` (B, T, H) from
    `backbone_hidden` reuses a forward pass shared with a value-head critic. `temperature` divides the logits
    (use the sampling temperature for old log-probs and the PPO ratio). `share_prefix` runs the rows' common
    prefix once (`backbone_hidden`).
    """
    logprobs, _ = _score_tokens(
        model, input_ids, attention_mask, token_mask, temperature, chunk_size, hidden, share_prefix,
        with_entropy=False,
    )
    return logprobs


def token_logprobs_and_entropy(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    token_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    hidden: torch.Tensor | None = None,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` and the entropy (nats) of the distribution each scored token was drawn from, both (B, T)."""
    logprobs, entropy = _score_tokens(
        model, input_ids, attention_mask, token_mask, temperature, chunk_size, hidden, share_prefix,
        with_entropy=True,
    )
    assert entropy is not None
    return logprobs, entropy


def _score_tokens(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_mask: torch.Tensor | None,
    temperature: float,
    chunk_size: int,
    hidden: torch.Tensor | None,
    share_prefix: bool,
    *,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if hidden is None:
        hidden = backbone_hidden(model, input_ids, attention_mask, share_prefix=share_prefix)  # (B, T, H)
    head = causal_lm(model).get_output_embeddings()
    scored = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()  # (B, T-1): token t+1 from state t
    if token_mask is not None:
        scored = scored & token_mask[:, 1:].bool()
    states = hidden[:, :-1][scored]  # (N, H)
    targets = input_ids[:, 1:][scored]  # (N,)

    def score_chunk(rows: torch.Tensor, chunk_targets: torch.Tensor) -> torch.Tensor:
        logits = head(rows).float() / temperature  # (n, V)
        logps = selective_log_softmax(logits[None], chunk_targets[None])  # (1, n)
        return torch.cat([logps, entropy_from_logits(logits)[None]]) if with_entropy else logps  # (k, n)

    recompute = torch.is_grad_enabled() and states.requires_grad
    pieces = [
        checkpoint(score_chunk, rows, part, use_reentrant=False) if recompute else score_chunk(rows, part)
        for rows, part in zip(states.split(chunk_size), targets.split(chunk_size), strict=True)
    ]
    k = 2 if with_entropy else 1
    flat = torch.cat(pieces, dim=1) if pieces else hidden.new_zeros(k, 0, dtype=torch.float32)  # (k, N)
    full = flat.new_zeros(k, *scored.shape).masked_scatter(scored.expand(k, -1, -1), flat)  # (k, B, T-1)
    full = nn.functional.pad(full, (1, 0))  # (k, B, T)
    return full[0], full[1] if with_entropy else None


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


def choice_probability(
    model: nn.Module, hidden: torch.Tensor, choice: torch.Tensor, choice_ids: list[tuple[int, int]],
    temperature: float,
) -> torch.Tensor:
    """At each token where `choice` (B, T) long is k >= 0, the probability of the first of the two tokens
    `choice_ids[k]` under the distribution it was drawn from, restricted to the two and renormalised (the choice
    between them alone), 0 elsewhere: (B, T) float32. Only those rows of the LM head are computed. `hidden`
    (B, T, H) from `backbone_hidden`."""
    head = causal_lm(model).get_output_embeddings()
    at = choice[:, 1:] >= 0  # (B, T-1): token t+1 is drawn from state t
    pairs = torch.tensor(choice_ids, device=hidden.device)[choice[:, 1:][at]]  # (N, 2) token ids
    weight = head.weight[pairs]  # (N, 2, H)
    logits = torch.einsum("nh,nah->na", hidden[:, :-1][at].to(weight.dtype), weight)  # (N, 2)
    if head.bias is not None:
        logits = logits + head.bias[pairs]
    first = torch.softmax(logits.float() / temperature, dim=-1)[:, 0]  # (N,)
    full = torch.zeros(at.shape, dtype=torch.float32, device=hidden.device).masked_scatter(at, first)
    return nn.functional.pad(full, (1, 0))  # (B, T)


@dataclass
class Outputs:
    """What `token_outputs` computes for a batch of token ids."""

    logprobs: torch.Tensor  # (B, T) log π(token t | prefix), 0 at t = 0
    entropy: torch.Tensor  # (B, T)
    values: torch.Tensor | None  # (B, T) V(state before token t)
    choice_probability: torch.Tensor | None = None  # (B, T) `choice_probability` where asked, else None


def token_outputs(
    policy: nn.Module, critic: Critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
    temperature: float, chunk: int, with_values: bool, token_mask: torch.Tensor | None = None,
    share_prefix: bool = False, choice: torch.Tensor | None = None, choice_ids: list[tuple[int, int]] | None = None,
) -> Outputs:
    """One backbone pass: log-probs and entropy from the LM head (in chunks, only where `token_mask` is 1, or
    every real token without one), values from the critic, and with `choice` and `choice_ids` the
    `choice_probability` there; `share_prefix` runs the rows' common prefix once."""
    hidden = backbone_hidden(policy, input_ids, attention_mask, share_prefix=share_prefix)  # (B, T, H)
    logprobs, entropy = token_logprobs_and_entropy(
        policy, input_ids, attention_mask, token_mask=token_mask, temperature=temperature, chunk_size=chunk,
        hidden=hidden,
    )
    values = None
    if with_values:
        shared = hidden if critic.shares_policy_backbone else None
        raw = critic(input_ids, attention_mask, hidden=shared, share_prefix=share_prefix)  # (B, T) V(..t)
        values = torch.cat([raw.new_zeros(raw.shape[0], 1), raw[:, :-1]], dim=1)  # (B, T) V(prefix before t)
    chosen = None
    if choice is not None and choice_ids is not None:
        chosen = choice_probability(policy, hidden, choice, choice_ids, temperature)
    return Outputs(logprobs, entropy, values, chosen)
