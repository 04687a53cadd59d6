"""A model's chat template rendered within limits: a template from elsewhere that hangs or breaks the rules is one line.

Chat templates are Jinja, run by transformers in Jinja's sandbox: they cannot run code, but nothing bounds their
time, so nested loops over `range(100000)` hang whatever renders them. r1trade renders every chat through
`render_chat`, which stops a render after `RENDER_SECONDS` (a timer signal, in the main thread, where r1trade's
commands render) and turns the sandbox's `SecurityError`, a syntax error or a template's own `raise_exception` into
one `UsageError` line that names the template's file. `check_chat_template` runs when a model is loaded from a
folder or a GGUF: it refuses a template over `MAX_TEMPLATE_CHARS` and renders a first conversation, so a bad
template stops the command before the weights load. TRL's trainers render the template with transformers alone,
once it has passed that first render.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jinja2.exceptions import SecurityError, TemplateError
from transformers import PreTrainedTokenizerBase

from r1trade.errors import UsageError
from r1trade.safe_load import first_line

RENDER_SECONDS = 5.0
"""The longest one render may take; a chat template renders r1trade's conversations in milliseconds."""
MAX_TEMPLATE_CHARS = 100_000
"""The longest chat template accepted (those of Qwen, Llama and gpt-oss are a few thousand to 20,000 characters)."""
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
"""Where a model folder keeps its chat template, in the order transformers prefers them."""

_FIRST_CHAT = [{"role": "system", "content": "You trade."}, {"role": "user", "content": "Price 100.0."}]


class _TooLong(BaseException):
    """Raised by the timer inside a render (a BaseException, so that nothing on the way catches it)."""


def check_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse, in one `UsageError` line naming its file, a chat template over `MAX_TEMPLATE_CHARS` or one that
    fails its first render (`render_chat`)."""
    templates = tokenizer.chat_template
    for text in templates.values() if isinstance(templates, dict) else [templates]:
        if isinstance(text, str) and len(text) > MAX_TEMPLATE_CHARS:
            raise UsageError(
                f"{template_file(tokenizer)}: the chat template has {len(text):,} characters, over the "
                f"{MAX_TEMPLATE_CHARS:,} r1trade accepts"
            )
    render_chat(tokenizer, _FIRST_CHAT, add_generation_prompt=True)


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict], **options: Any) -> str:
    """`messages` as text, by the tokenizer's chat template (`options`: `apply_chat_template`'s, e.g.
    `add_generation_prompt`), stopped after `RENDER_SECONDS`; a template that breaks the sandbox's rules, fails or
    runs too long is a one-line `UsageError` naming its file."""
    try:
        with _time_limit(RENDER_SECONDS):
            return tokenizer.apply_chat_template(messages, tokenize=False, **options)
    except _TooLong:
        raise UsageError(
            f"{template_file(tokenizer)}: the chat template ran over {RENDER_SECONDS:g} s rendering one conversation "
            "and was stopped (a loop without bound?)"
        ) from None
    except SecurityError as exc:
        raise UsageError(f"{template_file(tokenizer)}: the chat template was stopped by the sandbox transformers "
                         f"renders it in ({first_line(exc)})") from None
    except TemplateError as exc:
        raise UsageError(f"{template_file(tokenizer)}: the chat template fails ({first_line(exc)})") from None
    except RecursionError:
        raise UsageError(f"{template_file(tokenizer)}: the chat template recurses without end") from None


def template_file(tokenizer: PreTrainedTokenizerBase) -> str:
    """Where the tokenizer's chat template came from: the file in its model folder, else its name."""
    origin = tokenizer.name_or_path
    if origin and Path(origin).is_dir():
        found = [Path(origin) / name for name in TEMPLATE_FILES if (Path(origin) / name).is_file()]
        return str(found[0] if found else origin)
    return f"model '{origin}'" if origin else "the tokenizer"


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise `_TooLong` in the block after `seconds`, by SIGALRM: in the main thread only (the one signals reach),
    and only where no other timer is running (that timer's owner keeps the signal)."""
    if (
        not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _TooLong

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
