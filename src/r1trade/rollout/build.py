"""A rollout engine on a transformers model: the agent loop handed a `TransformersBackend` that stops turns where
the loop's chat format ends them."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r1trade.models.chat import ChatTokens
from r1trade.rollout.backend import SamplingConfig
from r1trade.rollout.loop import STOP_TEXT, RolloutEngine
from r1trade.rollout.transformers_backend import TransformersBackend


def transformers_engine(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sampling: SamplingConfig,
    *,
    reuse_cache: bool = True,
    fixed_step: bool | None = None,
) -> RolloutEngine:
    """A `RolloutEngine` sampling from `model`. `reuse_cache=False` re-encodes each row's whole context every turn
    (the slow baseline, for benchmarks); `fixed_step` as `TransformersBackend` takes it."""
    chat = ChatTokens(tokenizer)
    backend = TransformersBackend(
        model, tokenizer, sampling, stop_ids=chat.stop_ids, stop_text=STOP_TEXT, reuse_cache=reuse_cache,
        fixed_step=fixed_step,
    )
    return RolloutEngine(backend, tokenizer)
