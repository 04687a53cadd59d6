"""The key/value cache is passed by the name the installed transformers takes it (`cache` since 5.2x, where
`past_key_values` is deprecated, to go in 5.40), by the rollout engine and by scoring with a shared prefix, for a
plain model and a LoRA one."""

from __future__ import annotations

import warnings

import pytest
import torch
from agent_fixtures import TEXTS

from r1trade.config import LoraConfig, ModelConfig
from r1trade.models.chat import ChatTokens
from r1trade.models.loading import load_agent_models
from r1trade.models.scoring import token_logprobs
from r1trade.rollout.backend import Prompt, SamplingConfig
from r1trade.rollout.loop import STOP_TEXT
from r1trade.rollout.transformers_backend import TransformersBackend


@pytest.mark.parametrize("lora", [False, True])
def test_no_deprecated_cache_keyword_in_a_rollout_or_in_scoring(lora: bool) -> None:
    models = load_agent_models(ModelConfig(name_or_path="tiny-random", lora=LoraConfig(enabled=lora)), seed=0)
    chat = ChatTokens(models.tokenizer)
    backend = TransformersBackend(models.policy, models.tokenizer, SamplingConfig(max_new_tokens=4, greedy=True),
                                  stop_ids=chat.stop_ids, stop_text=STOP_TEXT)
    context = chat.context([{"role": "user", "content": "Price 100"}])
    prefix = models.tokenizer(TEXTS[0])["input_ids"]
    input_ids = torch.tensor([prefix + [5, 6], prefix + [7, 8]])  # rows sharing all but their last two tokens
    attention_mask = torch.ones_like(input_ids)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        with backend.session(), torch.no_grad():
            [turn] = backend.generate([Prompt(0, tuple(context), fresh=True)], None)
            shared = token_logprobs(models.policy, input_ids, attention_mask, share_prefix=True)
    assert 1 <= len(turn.token_ids) <= 4
    torch.testing.assert_close(shared, token_logprobs(models.policy, input_ids, attention_mask), atol=1e-5, rtol=0)
