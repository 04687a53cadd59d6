"""The policy and critic parts of a checkpoint: saved and loaded back exactly, refused for another model config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from agent_fixtures import TEXTS, batch, perturb_trainable, tiny_config

from r1trade.config import LoraConfig
from r1trade.errors import UsageError
from r1trade.models.loading import load_agent_models
from r1trade.models.scoring import token_logprobs
from r1trade.rl.checkpoint import load_critic, load_policy, save_critic, save_policy


@pytest.mark.parametrize(
    "changes",
    [{}, {"lora": LoraConfig(enabled=False), "critic": "separate"}, {"critic": "separate"}],
    ids=["lora-value_head", "full-separate", "lora-separate"],
)
def test_save_and_load_round_trip(tmp_path: Path, changes: dict) -> None:
    config = tiny_config(**changes)
    trained = load_agent_models(config, seed=0)
    perturb_trainable(trained.policy, seed=1)
    perturb_trainable(trained.critic, seed=2)
    save_policy(trained, tmp_path / "policy")
    save_critic(trained, tmp_path / "critic")

    fresh = load_agent_models(config, seed=5)
    load_policy(fresh, tmp_path / "policy")
    load_critic(fresh, tmp_path / "critic")
    ids, mask = batch(trained, TEXTS)
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(fresh.policy, ids, mask), token_logprobs(trained.policy, ids, mask), rtol=0, atol=0
        )
        torch.testing.assert_close(fresh.critic(ids, mask), trained.critic(ids, mask), rtol=0, atol=0)
    names = {path.name for path in (tmp_path / "policy").iterdir()}
    assert ("adapter_model.safetensors" in names) == fresh.lora
    assert "tokenizer.json" in names and "chat_template.jinja" in names


def test_loading_a_checkpoint_of_another_model_config_is_a_one_line_error(tmp_path: Path) -> None:
    save_policy(load_agent_models(tiny_config(), seed=0), tmp_path)
    other = load_agent_models(tiny_config(lora=LoraConfig(r=4)), seed=0)
    with pytest.raises(UsageError, match="another model config") as caught:
        load_policy(other, tmp_path)
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="not a critic checkpoint"):
        load_critic(other, tmp_path)
