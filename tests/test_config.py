from pathlib import Path

import pytest

from r1trade.config import Config, load_config, parse_overrides, resolve_config_path
from r1trade.errors import ConfigError, UsageError


def test_shipped_configs_load_and_resolve_by_name_or_path():
    main = load_config("btc_momentum")
    assert main.name == "btc_momentum"
    assert load_config("btc_momentum.yaml") == main
    assert load_config(resolve_config_path("btc_momentum")) == main
    assert load_config("smoke").model.name_or_path == "tiny-random"


def test_defaults_without_a_file():
    assert load_config(None) == Config()


def test_overrides_are_typed_and_nested():
    cfg = load_config("smoke", ["env.fee_bps=5", "env.allow_short=false", "train.algorithm=grpo", "train.group_size=4", "seed=7"])
    assert cfg.env.fee_bps == 5.0 and isinstance(cfg.env.fee_bps, float)
    assert cfg.env.allow_short is False
    assert cfg.train.algorithm == "grpo"
    assert cfg.seed == 7
    assert parse_overrides(["a.b.c=[1, 2]", "a.d=x"]) == {"a": {"b": {"c": [1, 2]}, "d": "x"}}


def test_unknown_key_names_the_path_and_closest_key(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  fee_bsp: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'env\.fee_bsp' \(did you mean 'env\.fee_bps'\?\)"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"unknown key 'trian'.*'train'"):
        load_config(None, ["trian.updates=3"])


def test_a_run_saved_before_a_key_was_retired_still_loads(tmp_path: Path):
    """Saved configs spell out every key: `warmstart.both_sides: false` (its old default) is dropped and the run
    loads as it was; `true` (something r1trade no longer does) is a one-line error, as is the key on the command
    line."""
    saved = tmp_path / "config.yaml"
    saved.write_text(load_config("demo_tools").to_yaml().replace("warmstart:\n", "warmstart:\n  both_sides: false\n"))
    assert "both_sides: false" in saved.read_text()
    assert load_config(saved) == load_config("demo_tools")
    saved.write_text(saved.read_text().replace("both_sides: false", "both_sides: true"))
    with pytest.raises(ConfigError, match=r"'warmstart\.both_sides' was retired; only its old default False loads"):
        load_config(saved)
    with pytest.raises(ConfigError, match="was retired"):
        load_config(None, ["warmstart.both_sides=true"])


@pytest.mark.parametrize(
    ("section", "line", "used"),
    [
        ("env", "changes_in_view_updates: 0", "changes_in_view_updates: 60"),
        ("warmstart", "changes_in_view: 0.0", "changes_in_view: 0.5"),
        ("rollout", "temperature_from: {}", "temperature_from: {34: 0.5}"),
        ("train", "look_kl_updates: null", "look_kl_updates: 47"),
        ("train", "look_kl_coef: null", "look_kl_coef: 0.3"),
        ("warmstart", "balanced: false", "balanced: true"),
        ("train", "entropy_control: none", "entropy_control: kl_cov"),
        ("train", "kl_cov_coef: 1.0", "kl_cov_coef: 2.0"),
        ("train", "clip_cov_bounds:\n  - 1.0\n  - 5.0", "clip_cov_bounds:\n  - 0.5\n  - 5.0"),
        ("train", "side_entropy_coef: 0.0", "side_entropy_coef: 0.25"),
    ],
)
def test_runs_saved_with_retired_keys_load_where_they_did_not_use_them(
    tmp_path: Path, section: str, line: str, used: str
):
    saved = tmp_path / "config.yaml"
    saved.write_text(load_config("demo_tools").to_yaml().replace(f"{section}:\n", f"{section}:\n  {line}\n", 1))
    assert load_config(saved) == load_config("demo_tools")
    saved.write_text(saved.read_text().replace(line, used))
    key = used.partition(":")[0]
    with pytest.raises(ConfigError, match=rf"'{section}\.{key}' was retired"):
        load_config(saved)


def test_wrong_type_names_field_and_expected_type():
    with pytest.raises(ConfigError, match=r"env\.fee_bps: Input should be a valid number.*'abc'"):
        load_config(None, ["env.fee_bps=abc"])
    with pytest.raises(ConfigError, match=r"train\.algorithm: Input should be 'ppo', 'grpo', 'dr_grpo', 'rloo' or 'reinforce_pp'"):
        load_config(None, ["train.algorithm=sgd"])


def test_bad_yaml_reports_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  fee_bps: [1, 2\n")
    with pytest.raises(ConfigError, match=r"line \d+, column \d+"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)


def test_missing_config_lists_shipped_ones():
    with pytest.raises(UsageError, match=r"config not found: 'nope'.*btc_momentum.*smoke"):
        load_config("nope")


def test_split_fractions_must_add_up():
    with pytest.raises(ConfigError, match="add up to 1"):
        load_config(None, ["data.split.train=0.9"])
    with pytest.raises(ConfigError, match="needs both train_end and validation_end"):
        load_config(None, ["data.split.method=dates"])


def test_resolved_config_round_trips_through_yaml(tmp_path: Path):
    cfg = load_config("btc_momentum", ["env.fee_bps=7"])
    path = cfg.save(tmp_path / "run")
    assert load_config(path) == cfg


def test_the_demo_is_the_information_rungs_recipe_as_written() -> None:
    """`make demo` (demo_tools.yaml) is tool_gated_tiny.yaml, the information rung's recipe for the small model,
    under another name: one recipe, whose trade turns restate nothing."""
    demo, rung = load_config("demo_tools"), load_config("tool_gated_tiny")
    assert demo.model_copy(update={"name": rung.name}) == rung
    assert demo.env.observation == "price_only" and demo.warmstart.restate == "none"
    assert demo.train.updates == 120 and demo.train.updates % demo.train.checkpoint_every == 0
    assert demo.seeds.restarts == [["warmstart.episodes=480"], ["warmstart.draw=1"]] and demo.seeds.restart_until == 70
    assert load_config("demo_tools", ["seeds.restarts=[]"]).seeds.restarts == []  # the config's run alone


def test_smollm2s_information_rung_is_the_same_recipe_with_what_a_pretrained_model_needs() -> None:
    """tool_gated.yaml is tool_gated_tiny.yaml on SmolLM2 with LoRA: only the model, the learning rate, the budget,
    the micro-batches, the checkpoints, the side balance (SmolLM2's seeds collapse to one side; the small model's
    do not), the warm start's size, its check before RL (a one-sided draw is replaced) and the restarts (one, the
    warm start drawn again, only for a seed that does not read: a SmolLM2 run costs hours) differ, and nothing
    changes mid-run."""
    small, large = load_config("tool_gated_tiny"), load_config("tool_gated")
    assert large.model.name_or_path == "smollm2-135m-instruct" and large.model.lora.enabled
    train = {"learning_rate": 3e-4, "updates": 30, "micro_batch_size": 6, "checkpoint_every": 10,
             "side_balance_coef": 0.25}
    warm = {k: getattr(large.warmstart, k) for k in ("episodes", "episode_decisions", "max_steps", "batch_size",
                                                      "gradient_accumulation", "learning_rate",
                                                      "min_action_share", "draws")}
    assert (large.warmstart.min_action_share, large.warmstart.draws) == (0.1, 3)
    assert (large.seeds.restarts, large.seeds.restart_until) == ([["warmstart.draw=1"]], 70)
    assert {k: getattr(large.train, k) for k in train} == train
    assert large.model_copy(update={
        "name": small.name, "model": small.model, "seeds": small.seeds,
        "train": large.train.model_copy(update={k: getattr(small.train, k) for k in train}),
        "warmstart": large.warmstart.model_copy(update={k: getattr(small.warmstart, k) for k in warm}),
    }) == small


def test_the_multi_decision_rung_is_the_demos_market_in_four_decision_windows():
    """multi_decision_tiny.yaml: demo.yaml's market and model, four decisions an episode, each from a fresh
    context, the warm start and the backtest in the same shape."""
    rung, demo = load_config("multi_decision_tiny"), load_config("demo")
    assert rung.data == demo.data and rung.model == demo.model
    assert rung.env.episode_decisions == rung.warmstart.episode_decisions == 4
    assert (rung.env.max_context_turns, rung.env.history_turns, rung.train.kl_placement) == (1, 1, "loss")
    assert rung.rollout.num_envs * rung.env.episode_decisions == demo.rollout.num_envs  # 48 decisions an update
    assert rung.backtest.agent_windows * 4 == rung.backtest.max_decisions
    smollm2, planted = load_config("multi_decision"), load_config("planted_edge")
    assert smollm2.data == planted.data and smollm2.model == planted.model and smollm2.rewards == planted.rewards
    assert (smollm2.env.episode_decisions, smollm2.env.max_context_turns, smollm2.train.kl_placement) == (4, 1, "loss")
    assert smollm2.rollout.num_envs * 4 == planted.rollout.num_envs


def test_demo_config_is_the_planted_edge_market_with_the_small_model():
    """`make demo` learns the same market as planted_edge.yaml, with the tiny model and the same credit recipe."""
    demo, planted = load_config("demo"), load_config("planted_edge")
    assert demo.data == planted.data and demo.env == planted.env and demo.rewards == planted.rewards
    assert demo.model.name_or_path == "tiny-random" and not demo.model.lora.enabled
    assert (demo.train.algorithm, demo.train.credit, demo.train.gamma) == ("reinforce_pp", "turn", 0.0)
    assert demo.warmstart.policy == "random" and demo.warmstart.actions == ["long", "short"]
    assert demo.train.updates % demo.train.checkpoint_every == 0  # the backtest reads the last checkpoint
