"""Where r1trade keeps what it builds once per machine: converted models and compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "R1TRADE_CACHE"


def cache_home() -> Path:
    """`$R1TRADE_CACHE`, else `$XDG_CACHE_HOME/r1trade`, else `~/.cache/r1trade`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "r1trade"
