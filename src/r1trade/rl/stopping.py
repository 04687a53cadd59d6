"""Stopping a training run between updates, so that what it has learned so far is kept whole.

The first SIGINT (Ctrl-C) or SIGTERM (what `kill`, a job scheduler or a preempted cloud machine sends) asks the
run to stop: the update under way finishes, is checkpointed, and the run ends with `TrainingInterrupted`, to be
continued with `--resume`. A second signal stops at once and keeps the last complete checkpoint: an update cut
off halfway has moved the weights and the optimiser in part, so it is never saved.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The name of the first stop signal received while `listening` (None until one comes)."""

    def __init__(self) -> None:
        self.asked: str | None = None

    @contextmanager
    def listening(self) -> Iterator[StopRequest]:
        """Take over `STOP_SIGNALS` while the block runs, then put the previous handlers back. Only the main thread
        can: elsewhere the signals keep their handling and nothing is asked."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
        for number in STOP_SIGNALS:
            signal.signal(number, self._receive)
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _receive(self, number: int, frame: object) -> None:
        if self.asked is not None:
            raise KeyboardInterrupt
        self.asked = signal.Signals(number).name
        print(f"{self.asked}: stopping after this update, at its checkpoint (send it again to stop now)",
              file=sys.stderr, flush=True)
