"""Real models' shapes with random weights (`random:<shape>`): the real parameter counts, built by name with the
tool-calling template, seeded like the tiny model, an unknown shape refused in one line."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from r1trade.config import ModelConfig
from r1trade.errors import ConfigError
from r1trade.integrations.trl.engine import require_r1trade_calls
from r1trade.models.loading import built_in_code, load_named_model
from r1trade.models.random_models import RANDOM_MODELS, random_model_config
from r1trade.models.tokenizer import build_tiny_tokenizer

REAL = {  # parameter count (tied embeddings counted once), architecture, layers, heads, key/value heads
    "random:smollm2-135m": (135e6, "llama", 30, 9, 3),
    "random:qwen2.5-0.5b": (494e6, "qwen2", 24, 14, 2),
    "random:qwen2.5-1.5b": (1.54e9, "qwen2", 28, 12, 2),
}


def test_every_shape_is_measured() -> None:
    assert set(RANDOM_MODELS) == set(REAL)


@pytest.mark.parametrize("name", sorted(REAL))
def test_a_shape_has_its_real_models_size(name: str) -> None:
    parameters, model_type, layers, heads, kv_heads = REAL[name]
    config = random_model_config(name, build_tiny_tokenizer(tool_template=True))
    with torch.device("meta"):  # no memory, no initialisation: only the shapes
        model = AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / parameters - 1) < 0.03, count
    assert (config.model_type, config.num_hidden_layers, config.num_attention_heads) == (model_type, layers, heads)
    assert config.num_key_value_heads == kv_heads
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in the real model
    assert model.config._attn_implementation == "sdpa"


def test_a_shape_loads_by_name_with_a_template_both_engines_read() -> None:
    config = ModelConfig(name_or_path="random:smollm2-135m", dtype="bfloat16", cpu_kernels="off")
    model, tokenizer = load_named_model(config)
    assert model.config.vocab_size == 49152 and model.config.hidden_size == 576  # the real vocabulary, not 586
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id == 0
    require_r1trade_calls(tokenizer, config.name_or_path)  # TRL parses its tool calls (raises otherwise)
    ids = tokenizer("Price 100", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], 49152) and torch.isfinite(logits).all()


def test_the_seed_fixes_the_weights() -> None:
    def embedding(seed: int) -> torch.Tensor:
        config = ModelConfig(name_or_path="random:smollm2-135m", dtype="bfloat16", cpu_kernels="off", tiny_seed=seed)
        return load_named_model(config)[0].model.embed_tokens.weight

    first = embedding(0)
    assert torch.equal(first, embedding(0))
    assert not torch.equal(first, embedding(1))
    assert built_in_code("random:smollm2-135m")  # so checkpoints record the seed, as for tiny-random


def test_an_unknown_shape_is_a_one_line_config_error() -> None:
    expected = "'random:llama-70b': no such shape; use one of random:smollm2-135m, random:qwen2.5-0.5b"
    with pytest.raises(ConfigError, match=expected) as caught:
        load_named_model(ModelConfig(name_or_path="random:llama-70b"))
    assert "\n" not in str(caught.value)
    assert not built_in_code("smollm2-135m-instruct")
