"""The tiny randomly initialised agent shared by rollout and trainer tests (built in code, no download)."""

from __future__ import annotations

import pytest

from r1trade.agent.model import load_agent_models
from r1trade.config import ModelConfig


@pytest.fixture(scope="session")
def tiny_agent():
    models = load_agent_models(ModelConfig(name_or_path="tiny-random"), seed=0)
    return models.policy, models.tokenizer
