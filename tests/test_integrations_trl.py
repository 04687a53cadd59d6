"""TradingEnv as a TRL environment: the tool schemas TRL builds, one window per group, the native env's rewards
for the same turns, TRL's own tool loop on scripted model turns, and the settings TRL cannot honour refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from transformers.utils import get_json_schema
from trl_fixtures import TRL, trl_config

from r1trade.cli import main
from r1trade.config import load_config
from r1trade.env.trading_env import TradingEnv
from r1trade.errors import ConfigError
from r1trade.integrations.trl import (
    PriceOnlyTradingToolEnv,
    TradingToolEnv,
    environment_factory,
    window_rows,
)
from r1trade.integrations.trl.environment import tool_names
from r1trade.integrations.trl.settings import grpo_arguments


def test_tool_schemas_as_trl_builds_them_match_the_envs_tools():
    config = trl_config()
    env = TradingToolEnv(config)
    schemas = {name: get_json_schema(getattr(env, name))["function"] for name in tool_names(TradingToolEnv)}
    assert set(schemas) == set(env.env.registry.names)
    for tool in env.env.registry:
        parameters = schemas[tool.name]["parameters"]
        assert schemas[tool.name]["description"].startswith(tool.description.rstrip("."))
        assert set(parameters["properties"]) == set(tool.parameters["properties"])
        assert set(parameters.get("required", [])) == set(tool.parameters["required"])
        for name, expected in tool.parameters["properties"].items():
            assert parameters["properties"][name]["type"] == expected["type"]
            assert parameters["properties"][name].get("enum") == expected.get("enum")
            assert parameters["properties"][name]["description"]
    # price_only puts the recent changes behind a tool: the factory picks the class that declares it
    price_only = load_config("smoke", [*TRL, "env.observation=price_only"])
    assert isinstance(environment_factory(price_only)(), PriceOnlyTradingToolEnv)
    assert "get_changes" in tool_names(PriceOnlyTradingToolEnv)
    with pytest.raises(ConfigError, match="get_changes"):
        TradingToolEnv(price_only)


def test_reset_gives_every_member_of_a_group_the_same_window():
    config = trl_config()
    rows = window_rows(config, 4)
    assert len({row["seed"] for row in rows}) == 4 and len({row["start"] for row in rows}) > 1
    assert rows[0]["prompt"][0] == {"role": "system", "content": TradingEnv.from_config(config).system_prompt}
    first, second = TradingToolEnv(config), TradingToolEnv(config)
    assert first.reset(**rows[2]) == second.reset(**rows[2])  # TRL passes the row's prompt too: ignored
    assert first.env.bar == second.env.bar == rows[2]["start"]
    for env in (first, second):  # the same slippage draws: the same order fills at the same price
        env.place_order(side="long", size=1.0, view="bullish")
    assert first.env.fills == second.env.fills and first.env.fills[0].price > 0
    assert first.get_reward() == second.get_reward()


TURNS = [  # (tool, the arguments TRL parsed from the model's turn, that turn as the native env reads it)
    ("get_candles", {"n": 3}, 'Look first.\n<tool_call>{"name": "get_candles", "arguments": {"n": 3}}</tool_call>'),
    ("place_order", {"side": "long", "size": 0.5, "stop_loss": 2, "view": "bullish"},
     ('<tool_call>\n{"name": "place_order", "arguments": {"side": "long", "size": 0.5, "stop_loss": 2, '
      '"view": "bullish"}}\n</tool_call>')),
    ("hold", {}, 'Wait.\n<tool_call>{"name": "hold", "arguments": {}}</tool_call>'),  # no view: a format error
    ("close_position", {"view": "neutral", "size": 1},
     '<tool_call>{"name": "close_position", "arguments": {"view": "neutral", "size": 1}}</tool_call>'),
]


def test_get_reward_is_the_native_envs_reward_for_the_same_turns():
    config = trl_config("env.episode_decisions=3", "env.max_tool_calls=2")
    row = window_rows(config, 1)[0]
    tool_env = TradingToolEnv(config)
    tool_env.reset(**row)
    replies = [getattr(tool_env, name)(**arguments) for name, arguments, _ in TURNS]
    assert "Filled buy" in replies[1] and "Decision 2/3" in replies[1]  # the fill, then the next observation
    assert replies[2].startswith("Error: invalid arguments for hold: view is required")
    assert "forced hold" in replies[3]  # the unknown argument is the env's error too, and the calls ran out

    native = TradingEnv.from_config(config)
    native.reset(seed=row["seed"], options={"start": row["start"]})
    texts = [text for _, _, text in TURNS]
    steps = [native.step(text) for text in texts]
    while not (steps[-1][2] or steps[-1][3]):  # the rollout ended here: the env plays the rest as no-call turns
        steps.append(native.step(""))

    assert tool_env.get_reward() == pytest.approx(sum(step[1] for step in steps), abs=1e-12)
    assert tool_env.get_reward() == tool_env.episode.reward  # asked twice, played out once
    assert tool_env.episode.played_out == len(steps) - len(TURNS) == 2
    components = [Counter(), Counter()]
    for counter, infos in zip(components, ([info for _, _, info in tool_env.episode.turns], [s[4] for s in steps]),
                              strict=True):
        for info in infos:
            counter.update(info["reward_components"])
    assert components[0] == pytest.approx(components[1], abs=1e-12)
    assert components[0]["format"] < 0 and components[0]["forced_hold"] < 0 and components[0]["pnl"] != 0


def test_trls_tool_loop_drives_the_env_and_masks_its_answers(tmp_path: Path):
    """TRL 1.16's own loop (`_generate_and_score_completions`) on scripted model turns: the env sees the same calls
    and pays the native reward; `tool_mask` selects exactly the model's tokens."""
    from r1trade.integrations.trl.engine import TRLTrainer

    config = trl_config("env.episode_decisions=1", "env.max_tool_calls=2", "rollout.max_new_tokens=256",
                        "train.updates=1")
    trainer = TRLTrainer(config, tmp_path / "run").trainer
    tokenizer = trainer.processing_class
    script = [
        'Look.\n<tool_call>\n{"name": "get_candles", "arguments": {"n": 2}}\n</tool_call><|im_end|>',
        ('Up.\n<tool_call>{"name": "place_order", "arguments": {"side": "long", "size": 0.5, "view": "bullish"}}'
         '</tool_call><|im_end|>'),
        "Done.<|im_end|>",  # TRL samples one more turn after the episode's last tool result
    ]
    turns = iter(script)

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids = tokenizer(next(turns), add_special_tokens=False)["input_ids"]
        return [list(ids) for _ in prompt_ids], None

    trainer._generate_single_turn = scripted
    row = window_rows(config, 1)[0]
    trainer.model.train()
    out = trainer._generate_and_score_completions([dict(row), dict(row)])

    ids, tool_mask, completion_mask = (out[key][0].tolist() for key in ("completion_ids", "tool_mask", "completion_mask"))
    model_ids = [i for i, tool, real in zip(ids, tool_mask, completion_mask, strict=True) if tool and real]
    env_ids = [i for i, tool, real in zip(ids, tool_mask, completion_mask, strict=True) if not tool and real]
    assert tokenizer.decode(model_ids) == "".join(script)
    answer = tokenizer.decode(env_ids)
    assert answer.count("<tool_response>") == 2 and "Last 2 bars" in answer and "Filled buy" in answer

    native = TradingEnv.from_config(config)
    native.reset(seed=row["seed"], options={"start": row["start"]})
    reward = sum(native.step(turn.removesuffix("<|im_end|>"))[1] for turn in script[:2])
    for env in trainer.environments:  # both members of the group: same window, same calls, the native reward
        assert env.episode.start == row["start"] and env.episode.played_out == 0
        assert env.get_reward() == pytest.approx(reward, abs=1e-12)
    assert out["advantages"].abs().max() < 1e-6  # equal rewards in a group: no advantage


@pytest.mark.parametrize(
    "override, named",
    [
        ("train.algorithm=ppo", "train.algorithm"),
        ("train.algorithm=rloo", "RLOOTrainer"),
        ("train.credit=token", "train.credit"),
        ("train.gamma=0.9", "train.gamma"),
        ("train.decision_advantage_coef=0.5", "train.decision_advantage_coef"),
        ("train.value_coef=1.0", "critic"),
        ("model.critic=separate", "model.critic"),
        ("train.loss_mask=false", "train.loss_mask"),
        ("train.top_group_frac=0.5", "train.top_group_frac"),
        ("train.dynamic_sampling=true", "train.dynamic_sampling"),
        ("train.step_groups=true", "train.step_groups"),
        ("train.loss_aggregation=sequence", "train.loss_aggregation"),
        ("train.side_balance_coef=0.1", "train.side_balance_coef"),
        ("train.kl_placement=reward", "train.kl_placement"),
        ("rollout.temperature=0", "rollout.temperature"),
        ("rollout.num_envs=3", "group_size"),
        ("train.trl_args={learning_rate: 0.1}", "train.trl_args.learning_rate"),
    ],
)
def test_settings_trl_cannot_honour_are_refused_in_one_line(override: str, named: str):
    with pytest.raises(ConfigError) as refused:
        grpo_arguments(trl_config(override), Path("unused"))
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_train_refuses_them_with_exit_2_before_touching_the_run_folder(capsys, tmp_path: Path):
    code = main(["train", "--config", "smoke", "--set", "train.engine=trl", "--set", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "grpo or dr_grpo" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "smoke").exists()


def test_train_refuses_a_template_without_r1trades_tool_calls(capsys, tmp_path: Path):
    settings = [*TRL, "model.name_or_path=tiny-random", f"output_dir={tmp_path}"]  # SmolLM2's ChatML template
    code = main(["train", "--config", "smoke", *(arg for s in settings for arg in ("--set", s))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "tiny-random-qwen" in err and len(err.splitlines()) == 1


def test_vllm_settings_pass_through_unchanged():
    """vLLM is the user's choice on their own GPUs: its GRPOConfig keys reach TRL as written (vLLM itself is not
    needed to build the arguments)."""
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
            "vllm_server_base_url": "http://localhost:8000"}
    written = ", ".join(f"{key}: {value}" if not isinstance(value, str) else f'{key}: "{value}"'
                        for key, value in vllm.items())
    arguments = grpo_arguments(trl_config(f"train.trl_args={{{written}}}"), Path("run"))
    assert {key: arguments[key] for key in vllm} == vllm
    assert arguments["trust_remote_code"] is False  # what r1trade adds stays


def test_mapped_settings():
    arguments = grpo_arguments(trl_config("train.epochs=2", "train.updates=3", "train.kl_coef=0.05",
                                          "train.trl_args={max_completion_length: 400}"), Path("run"))
    assert arguments["num_generations"] == 2 and arguments["num_iterations"] == 2
    assert arguments["max_steps"] == 6  # 3 updates × 2 epochs × (2 episodes / minibatches of 2)
    assert (arguments["beta"], arguments["epsilon"], arguments["epsilon_high"]) == (0.05, 0.2, 0.28)
    assert arguments["max_completion_length"] == 400 and arguments["use_vllm"] is False
