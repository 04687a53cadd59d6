"""The warm start's check that it samples every demonstrated action: the shares counted by hand, the check's
episodes equal to RL's first update's, and a failing draw replaced by the next one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from planted_models import save_tiny_model

from r1trade import warmstart as warmstart_module
from r1trade.cli import main
from r1trade.config import load_config
from r1trade.env.trading_env import make_envs
from r1trade.errors import ConfigError
from r1trade.eval.action_balance import action_shares, first_update_rollout
from r1trade.models.loading import load_agent_models
from r1trade.rl.trainer import Trainer
from r1trade.seeds import WARM_START_UNREAD, warm_start_unread
from r1trade.warmstart import warm_start_seed


def trade(target: float) -> dict:
    return {"forced_hold": False, "order": {"action": "place_order", "target": target}}


HOLD = {"forced_hold": False, "order": {"action": "hold"}}
FORCED = {"forced_hold": True}


def test_each_action_share_counts_the_decisions_that_took_a_demonstrated_action():
    decisions = [trade(1.0), trade(-1.0), trade(-0.5), trade(-1.0), FORCED, HOLD]
    assert action_shares(decisions, ["long", "short"]) == {"long": 0.25, "short": 0.75}  # 1 and 3 of 4 trades
    assert action_shares(decisions, ["long", "short", "hold"]) == {"long": 0.2, "short": 0.6, "hold": 0.2}
    assert action_shares([FORCED, FORCED], ["long", "short"]) == {"long": 0.0, "short": 0.0}  # nothing sampled


def test_the_check_plays_the_episodes_of_rl_first_update_token_for_token(tmp_path: Path):
    folder = save_tiny_model(tmp_path / "warm")
    config = load_config("smoke", [f"model.name_or_path={folder}", "rollout.num_envs=4", "seed=3"])
    checked = first_update_rollout(config, folder)
    models = load_agent_models(config.model, seed=config.seed)
    first = Trainer(config, models, lambda n: make_envs(config, n, "train"), tmp_path / "run").rollout()
    assert [t.seed for t in checked] == [t.seed for t in first] and len({t.seed for t in first}) == 4
    assert [[s.token_ids for s in t.segments] for t in checked] == [[s.token_ids for s in t.segments] for t in first]


@pytest.mark.parametrize(("shares", "kept", "trained"), [
    ([{"long": 0.0, "short": 1.0}, {"long": 0.4, "short": 0.6}], 1, 2),  # draw 0 fails, draw 1 passes
    ([{"long": 0.3, "short": 0.7}], 0, 1),  # draw 0 passes: no other draw is trained
    ([{"long": 0.0, "short": 1.0}, {"long": 0.05, "short": 0.95}], 1, 2),  # none passes: the last is kept
])
def test_a_warm_start_that_fails_its_check_is_replaced_by_the_next_draw(
    tmp_path: Path, monkeypatch, shares: list[dict], kept: int, trained: int
):
    sampled = iter(shares)
    monkeypatch.setattr(warmstart_module, "first_update_shares", lambda config, model_dir: next(sampled))
    code = main(["warmstart", "--config", "smoke", "--set", f"output_dir={tmp_path}", "--set", "rollout.max_new_tokens=128",
                 "--set", "warmstart.max_steps=1", "--set", "warmstart.episodes=1", "--set", "warmstart.actions=[long,short]",
                 "--set", "warmstart.min_action_share=0.1", "--set", "warmstart.draws=2"])
    assert code == 0
    log = json.loads((tmp_path / "smoke-warmstart" / "warmstart.json").read_text())
    assert [check["draw"] for check in log["checks"]] == list(range(trained))
    assert [check["passed"] for check in log["checks"]] == [min(s.values()) >= 0.1 for s in shares[:trained]]
    assert log["draw"] == kept and log["seed"] == warm_start_seed(0, kept)  # the kept model is the last trained


def test_the_check_settings_are_refused_where_they_cannot_work(capsys, tmp_path: Path):
    with pytest.raises(ConfigError, match="more than 3 actions can each take"):
        load_config("smoke", ["warmstart.actions=[long,short,hold]", "warmstart.min_action_share=0.4"])
    with pytest.raises(ConfigError, match="draws needs min_action_share"):
        load_config("smoke", ["warmstart.draws=2"])
    code = main(["warmstart", "--config", "smoke", "--set", f"output_dir={tmp_path}", "--set", "train.engine=trl",
                 "--set", "warmstart.min_action_share=0.1"])
    err = capsys.readouterr().err
    assert code == 2 and "min_action_share checks a warm start in r1trade's own rollout" in err, err
    assert "Traceback" not in err and not (tmp_path / "smoke-warmstart" / "model").exists()


def test_a_checked_warm_start_reads_the_rollout_and_the_first_update_groups():
    assert warm_start_unread(load_config("smoke")) == WARM_START_UNREAD
    checked = warm_start_unread(load_config("smoke", ["warmstart.min_action_share=0.1"]))
    assert "rollout" not in checked and "group_size" not in checked["train"] and "learning_rate" in checked["train"]
    assert checked["rewards"] is True and checked["backtest"] is True
