"""Models with the shapes of real checkpoints and random weights, built from their configs: nothing is downloaded.

`model.name_or_path: random:<shape>` names one: `random:smollm2-135m` (SmolLM2-135M, a Llama), `random:qwen2.5-0.5b`
and `random:qwen2.5-1.5b` (Qwen2.5-0.5B and -1.5B, Qwen2). Each has its real model's hidden size, layers, attention
heads, key/value heads, MLP width, vocabulary size and tied embeddings, so a forward pass, a rollout or an update
costs what it costs with the real weights: they measure speed and memory (`benchmarks/gpu_check.py`); they learn
nothing a benchmark would read.

Their tokenizer is the built-in tiny one (`r1trade.models.tokenizer`) with Qwen2.5's tool-calling chat template,
whatever the shape, so that both training engines run on each (TRL parses no tool calls from SmolLM2's ChatML).
The model keeps the real vocabulary size, so most ids a random model samples lie past the tiny tokenizer's 586 and
decode to nothing: its turns carry no valid call, and every episode runs to its last allowed turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from r1trade.errors import ConfigError

RANDOM_PREFIX = "random:"


@dataclass(frozen=True)
class Shape:
    """What a model's compute depends on, as its config.json gives it."""

    architecture: type[PretrainedConfig]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float


SHAPES = {
    "smollm2-135m": Shape(LlamaConfig, 576, 1536, 30, 9, 3, 49152, 8192, 100000.0, 1e-5),
    "qwen2.5-0.5b": Shape(Qwen2Config, 896, 4864, 24, 14, 2, 151936, 32768, 1000000.0, 1e-6),
    "qwen2.5-1.5b": Shape(Qwen2Config, 1536, 8960, 28, 12, 2, 151936, 32768, 1000000.0, 1e-6),
}
"""The real models' shapes (all three tie the input and output embeddings)."""

RANDOM_MODELS = tuple(RANDOM_PREFIX + shape for shape in SHAPES)
"""Every `model.name_or_path` this module builds."""


def is_random_model(name: str) -> bool:
    """True when `name` asks for a shape built here (a known one or not: `random_model_config` says which)."""
    return name.startswith(RANDOM_PREFIX)


def random_model_config(name: str, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The transformers config of the shape `name` names (`random:<shape>`), with `tokenizer`'s special ids."""
    shape = SHAPES.get(name.removeprefix(RANDOM_PREFIX))
    if shape is None:
        raise ConfigError(f"model.name_or_path '{name}': no such shape; use one of {', '.join(RANDOM_MODELS)}")
    return shape.architecture(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        vocab_size=shape.vocab_size,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.rms_norm_eps,
        tie_word_embeddings=True,
        **special_ids(tokenizer),
    )


def build_random_model(
    name: str, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """The shape `name` names with random weights, initialised as transformers initialises them (same seed, same
    weights), in `dtype`, on the CPU."""
    config = random_model_config(name, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(**special_ids(tokenizer))
    return model.eval()


def special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The begin, end and padding ids a model built for `tokenizer` is configured with."""
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
