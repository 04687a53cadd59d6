"""Scoring rows that start with the same tokens: the shared prefix is run once and its keys and values read by
every row (the trainer's micro-batches of one rollout share the system prompt)."""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import Cache, DynamicCache
from transformers.utils import ModelOutput


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading columns hold the same real token in every row, leaving each row at least its last column
    to run on its own (0 if the rows differ at once)."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)  # (T,)
    differs = (~same).nonzero()
    length = int(differs[0]) if len(differs) else input_ids.shape[1]
    return min(length, input_ids.shape[1] - 1)


def hidden_after_shared_prefix(
    decoder: nn.Module,
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T)
    positions: torch.Tensor,  # (B, T)
    shared: int,
) -> torch.Tensor:
    """The decoder's final hidden states (B, T, H), its first `shared` columns (the same in every row) run once.

    Each row then runs only its own tokens, attending to the prefix's keys and values. The result, and its
    gradients (the prefix's sum over the rows that read it), are those of the plain pass up to float rounding.
    """
    rows = input_ids.shape[0]
    prefix = decoder(
        input_ids=input_ids[:1, :shared], attention_mask=attention_mask[:1, :shared],
        position_ids=positions[:1, :shared], use_cache=True,
    )
    # every row reads the prefix's keys and values (B, H_kv, P, D): a view, so their gradients add up in it
    cache = DynamicCache(
        [(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1))
         for layer in output_cache(prefix).layers],
        config=decoder.config,
    )
    own = decoder(
        input_ids=input_ids[:, shared:], attention_mask=attention_mask, position_ids=positions[:, shared:],
        use_cache=True, **{cache_keyword(decoder): cache},
    )
    prefix_hidden = prefix.last_hidden_state.expand(rows, -1, -1)  # (B, P, H)
    return torch.cat([prefix_hidden, own.last_hidden_state], dim=1)  # (B, T, H)


def cache_keyword(model: nn.Module) -> str:
    """The name a transformers model, or a peft model around one, takes its key/value cache by: `cache` since
    transformers 5.2x (where `past_key_values` is deprecated, to go in 5.40), `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def output_cache(output: ModelOutput) -> Cache:
    """The key/value cache a forward pass returned: its `cache` since transformers 5.2x, `past_key_values` before."""
    return output["cache"] if "cache" in output else output.past_key_values
