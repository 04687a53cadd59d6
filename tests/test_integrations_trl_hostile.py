"""`train.engine: trl` with hostile inputs: no `train.trl_args` key can make TRL load code, a planted model folder is
refused before TRL or transformers reads it, and `train --resume` looks for its checkpoint before loading anything."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from planted_models import assert_refused_in_one_line, plant, r1trade_answering_yes, save_tiny_model
from trl import GRPOConfig
from trl_fixtures import SHORT_EPISODES, TRL, trl_config

from r1trade.cli import main
from r1trade.config import TRL_ARGS_REFUSED, load_config
from r1trade.errors import ConfigError
from r1trade.integrations.trl.settings import check_trl_settings, grpo_arguments


def _sets(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("qwen") / "model", tool_template=True)


@pytest.fixture
def planted_folder(qwen_folder: Path, tmp_path: Path) -> Path:
    """The tiny model with Qwen's template (as TRL trains it) as a folder whose config.json maps code of its own,
    of a model_type transformers does not know; importing that code would create `tmp_path/ran`."""
    folder = Path(shutil.copytree(qwen_folder, tmp_path / "model"))
    plant(folder, tmp_path / "ran", where="config.json", model_type="planted")
    return folder


def test_every_grpo_config_field_that_could_load_code_is_refused():
    """GRPOConfig 1.16's fields that load a model or code by name: the refused ones, and no other."""
    names = set(GRPOConfig.__dataclass_fields__)
    assert set(TRL_ARGS_REFUSED) <= names and "chat_template_kwargs" in names
    loading = {name for name in names if "remote_code" in name or "init_kwargs" in name}
    assert loading == set(TRL_ARGS_REFUSED)


@pytest.mark.parametrize(
    ("trl_args", "named"),
    [
        ("{trust_remote_code: true}", "trust_remote_code is refused"),
        ("{trust_remote_code: false}", "trust_remote_code is refused"),  # r1trade sets it itself
        ("{model_init_kwargs: {trust_remote_code: true}}", "model_init_kwargs is refused"),
        ("{model_init_kwargs: {attn_implementation: kernels-community/flash-attn}}", "model_init_kwargs is refused"),
        ("{chat_template_kwargs: {chat_template: '{{ 1 }}'}}", "chat_template_kwargs.chat_template is refused"),
    ],
)
def test_trl_args_that_could_load_code_are_refused_when_the_config_is_read(trl_args: str, named: str):
    with pytest.raises(ConfigError) as refused:
        load_config("smoke", [*TRL, f"train.trl_args={trl_args}"])
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_trl_gets_trust_remote_code_false_everywhere():
    arguments = grpo_arguments(trl_config("train.trl_args={chat_template_kwargs: {enable_thinking: false}}"),
                               Path("run"))
    assert arguments["trust_remote_code"] is False
    assert arguments["model_init_kwargs"] == {"trust_remote_code": False}  # the reference model TRL loads itself
    assert arguments["chat_template_kwargs"] == {"enable_thinking": False}  # a template's options pass through
    assert GRPOConfig(**arguments).trust_remote_code is False


def test_trust_remote_code_in_trl_args_is_refused_before_anything_loads(planted_folder: Path, tmp_path: Path):
    """`yes y | r1trade train ... trust_remote_code: true` with a planted model: the config is refused."""
    settings = [*TRL, *SHORT_EPISODES, "train.updates=1", f"output_dir={tmp_path}",
                f"model.name_or_path={planted_folder}", "train.trl_args={trust_remote_code: true}"]
    result = r1trade_answering_yes("train", "--config", "smoke", *_sets(settings))
    assert_refused_in_one_line(result.returncode, result.stderr, "train.trl_args", "trust_remote_code is refused")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "smoke").exists()


def test_a_planted_model_folder_is_refused_by_the_trl_engine(capsys, planted_folder: Path, tmp_path: Path):
    settings = [*TRL, *SHORT_EPISODES, "train.updates=1", f"output_dir={tmp_path}",
                f"model.name_or_path={planted_folder}"]
    code = main(["train", "--config", "smoke", *_sets(settings)])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(planted_folder / "config.json"), "auto_map")
    assert not (tmp_path / "ran").exists()


def test_resume_of_a_folder_without_a_checkpoint_loads_nothing(capsys, planted_folder: Path, tmp_path: Path):
    """A run folder holding nothing but a config.yaml that names a planted model: the resume stops at the missing
    checkpoint before the model is read; with trust_remote_code in its trl_args, at the config."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config("smoke", [*TRL, *SHORT_EPISODES, f"model.name_or_path={planted_folder}"])
    (run_dir / "config.yaml").write_text(config.to_yaml())
    code = main(["train", "--resume", str(run_dir)])
    assert_refused_in_one_line(code, capsys.readouterr().err, f"cannot resume: '{run_dir}' has no complete checkpoint")

    text = (run_dir / "config.yaml").read_text().replace("trl_args: {}", "trl_args: {trust_remote_code: true}")
    assert "trust_remote_code: true" in text
    (run_dir / "config.yaml").write_text(text)
    code = main(["train", "--resume", str(run_dir)])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(run_dir / "config.yaml"), "trust_remote_code")
    assert not (tmp_path / "ran").exists()
    assert {path.name for path in run_dir.iterdir()} == {"config.yaml", ".lock"}  # (the run folder's lock)
    assert (run_dir / "config.yaml").read_text() == text


def test_full_fine_tuning_of_a_built_in_model_with_a_kl_is_one_config_line(capsys, tmp_path: Path):
    """tiny-random-qwen is built in code: TRL has no folder to load the reference model from."""
    config = trl_config("model.lora.enabled=false", "train.kl_coef=0.02")
    with pytest.raises(ConfigError, match="needs a model directory TRL can load its reference from"):
        check_trl_settings(config)
    check_trl_settings(trl_config("model.lora.enabled=false", "train.kl_coef=0"))  # no reference model: fine
    settings = [*TRL, *SHORT_EPISODES, "model.lora.enabled=false", "train.kl_coef=0.02", f"output_dir={tmp_path}"]
    code = main(["train", "--config", "smoke", *_sets(settings)])
    assert_refused_in_one_line(code, capsys.readouterr().err, "'tiny-random-qwen' has none")
    assert code == 2 and not (tmp_path / "smoke").exists()
