"""End to end in subprocesses: `r1trade warmstart` for TRL, then `r1trade train` with `train.engine=trl` (TRL's
GRPOTrainer on CPU, no vLLM) from it writes a native run folder, and `r1trade backtest --checkpoint` reads its
checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trl_fixtures import SHORT_EPISODES, TRL, run_r1trade

from r1trade.integrations.trl import tool_schemas
from r1trade.models.baked_tools import baked_tools
from r1trade.rl.checkpoint import load_trained_agent
from r1trade.rl.checkpoint_paths import list_checkpoints


def _sets(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.mark.slow
def test_trl_engine_trains_two_updates_from_its_warm_start_and_the_checkpoint_backtests(tmp_path: Path):
    warm = [*TRL, "rollout.max_new_tokens=128", "warmstart.policy=random", "warmstart.episodes=2",
            "warmstart.max_steps=2", f"output_dir={tmp_path}", "name=trl"]
    warmed = run_r1trade("warmstart", "--config", "smoke", *_sets(warm), cwd=tmp_path)
    assert warmed.returncode == 0, warmed.stderr[-2000:]
    warm_model = tmp_path / "trl-warmstart" / "model"
    settings = [*TRL, *SHORT_EPISODES, "train.updates=2", f"output_dir={tmp_path}", "name=trl",
                f"model.name_or_path={warm_model}"]
    trained = run_r1trade("train", "--config", "smoke", *_sets(settings), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run_dir = tmp_path / "trl"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["update"] for record in records] == [1, 2]
    for record in records:
        assert {"episode_return", "valid_call_rate", "reward/format", "entropy", "kl_ref", "loss"} <= set(record)
    assert [step for step, _ in list_checkpoints(run_dir)] == [2]  # checkpoint_every 10: the last update's
    checkpoint = run_dir / "checkpoints" / "step-2"
    config, models = load_trained_agent(checkpoint)  # as backtest and probe-run read it
    assert config.train.engine == "trl" and models.lora
    # the checkpoint keeps the warm start's baked tools: backtests render the system turn TRL trained with
    assert baked_tools(models.tokenizer.chat_template) == tool_schemas(config)

    report = tmp_path / "report"
    tested = run_r1trade("backtest", "--checkpoint", str(checkpoint), "--strategy", "buy_and_hold", "--set",
                         "backtest.max_decisions=2", "--set", "backtest.agent_windows=1", "--out", str(report),
                         cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr[-2000:]
    metrics = json.loads((report / "metrics.json").read_text())
    assert "agent (step-2)" in json.dumps(metrics)
