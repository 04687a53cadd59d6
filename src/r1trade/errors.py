"""Errors that reach the user as one clear line and an exit code.

Usage and configuration mistakes exit with 2, failures while running exit with 1.
"""

from __future__ import annotations

CLIP_LIMIT = 80
"""Characters of a given value or key an error message quotes."""


def clip(text: str, limit: int = CLIP_LIMIT) -> str:
    """`text` cut to `limit` characters with an ellipsis, so that an error stays one short line."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class R1TradeError(Exception):
    """Base class for errors the CLI reports without a traceback."""

    exit_code: int = 1


class UsageError(R1TradeError):
    """The user asked for something impossible: a bad flag value or a missing input file."""

    exit_code = 2


class ConfigError(UsageError):
    """A configuration file or override is invalid."""


class DataError(R1TradeError):
    """Candle data is missing, unreadable or fails validation."""


class CheckpointError(R1TradeError):
    """A checkpoint file is damaged, truncated or not what r1trade writes."""


class OutputError(R1TradeError):
    """A report or run file could not be written (a full disk, a missing permission); the previous one is kept."""


class ExchangeError(R1TradeError):
    """An exchange could not be reached or refused a request."""


class TrainingInterrupted(Exception):
    """Training stopped by a signal (`r1trade.rl.stopping`); `checkpoint` is the last one kept (None: none yet),
    and `resume` how to go on, as the command that ran the training says it (`continued_by`)."""

    def __init__(self, checkpoint: object, resume: str = "") -> None:
        kept = f"at {checkpoint}" if checkpoint is not None else "before its first checkpoint"
        super().__init__(f"training stopped {kept}" + (f"; continue with: {resume}" if resume else ""))
        self.checkpoint = checkpoint
        self.resume = resume

    def continued_by(self, resume: str) -> TrainingInterrupted:
        """The same stop, saying how to go on."""
        return TrainingInterrupted(self.checkpoint, resume)
