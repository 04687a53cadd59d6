"""The generation backend as it was before the device-side decode step, loaded from git, to measure old against
new in one run on one machine (the benchmarks' `--against-previous`).

`PREVIOUS` names the last commit with the per-token Python decode (`r1trade.agent.engine`); its backend takes the
same arguments as `r1trade.rollout.transformers_backend.TransformersBackend` and speaks the same contract, so the
agent loop is handed either one.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r1trade.models.chat import ChatTokens
from r1trade.rollout.backend import SamplingConfig
from r1trade.rollout.loop import STOP_TEXT, RolloutEngine

PREVIOUS = "e51ef05"
PATH = "src/r1trade/agent/engine.py"


def previous_module() -> types.ModuleType:
    """The old engine module, compiled from `git show PREVIOUS:PATH` (the repository this file lies in)."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{PREVIOUS}:{PATH}"], cwd=root, check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType("r1trade_previous_engine")
    module.__file__ = f"{PREVIOUS}:{PATH}"
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is made
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def previous_engine(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sampling: SamplingConfig, *, reuse_cache: bool = True
) -> RolloutEngine:
    """A rollout engine handed the old backend: what `transformers_engine` built before the device-side step."""
    chat = ChatTokens(tokenizer)
    backend = previous_module().TransformersBackend(
        model, tokenizer, sampling, stop_ids=chat.stop_ids, stop_text=STOP_TEXT, reuse_cache=reuse_cache
    )
    return RolloutEngine(backend, tokenizer)
