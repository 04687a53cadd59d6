"""What the terminal shows: r1trade's own progress, warnings and results, not the libraries' chatter.

The libraries under a run print much that a user cannot act on: transformers' notice that `past_key_values` is now
called `cache` (r1trade passes the old name, which every transformers release it supports takes), DeepSpeed's
"Setting accelerator to CPU" when it is imported on a machine without a GPU, progress bars for converting, loading
and writing weights and for preparing the warm start's dataset. `quiet_third_party()` silences those known to be
harmless; it runs before the libraries are imported (it imports none of them: a command that needs no model stays
fast). `r1trade --debug` or `-v` leaves every library as it is.

r1trade's own messages (`logging` under `r1trade`: a fallback from a fast path, a one-time model conversion) are
shown either way, one line each, by `show_messages()`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

HARMLESS_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"`past_key_values` is deprecated"),  # transformers 5.2x: renamed `cache`
    (FutureWarning, r"`cache_params` is deprecated"),
    (Warning, r"`is_gradient_checkpointing` is deprecated"),  # read by peft, deprecated by transformers 5
    (UserWarning, r"You are using 'environment_factory'"),  # TRL 1.16 calls it experimental (train.engine trl)
)
"""Python warnings (category, start of the message) that say nothing a user of r1trade can act on."""

HARMLESS_LOGS: tuple[tuple[str, str], ...] = (
    ("DeepSpeed", r"Setting accelerator to CPU"),
    ("transformers.utils.generic", r"`past_key_values`/`cache_params` are deprecated"),
    # train.engine trl passes model_init_kwargs for the reference model TRL loads; its policy comes built
    ("trl.trainer.grpo_trainer", r"(\[RANK \d+\] )?You passed `model_init_kwargs` to the `GRPOConfig`"),
)
"""Log records (the logger that emits them, start of the message) that say nothing a user can act on."""

ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' weight loading and shard writing bars follow it too
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # the warm start's dataset preparation
    "TQDM_DISABLE": "1",  # any other tqdm bar (transformers' GGUF conversion uses tqdm directly)
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
"""Read by the libraries when they are imported; a value the user set is kept."""


class _DropMatching(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


def quiet_third_party() -> None:
    """Silence the libraries' known-harmless warnings, progress bars and notices for the rest of the process."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    for category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, message in HARMLESS_LOGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMatching) and f.pattern.pattern == message for f in logger.filters):
            logger.addFilter(_DropMatching(message))
    _already_imported()


def _already_imported() -> None:
    """Libraries imported before the environment was set read it too late: switch their bars off directly."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


class _Stderr(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when a record comes (the CLI may run more than once in a process)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _MessageFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        return f"warning: {message}" if record.levelno >= logging.WARNING else message


def show_messages(*, verbose: bool = False) -> None:
    """Print r1trade's log messages from INFO up (DEBUG too if `verbose`) on stderr, warnings as `warning: ...`."""
    logger = logging.getLogger("r1trade")
    if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(_MessageFormatter())
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
