"""Hostile model files: no handed model folder, checkpoint, Hugging Face cache entry, chat template or GGUF runs
code, asks a question, hangs or ends in a traceback; each ends in one line that names the file.

The planted folders (`planted_models.plant`) carry an `auto_map` naming a module of their own that creates a marker
file when imported: the marker must never appear, even with every question transformers could ask answered yes.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from planted_models import (
    assert_refused_in_one_line,
    edit_json,
    gguf_file,
    gguf_string,
    plant,
    r1trade_answering_yes,
    save_tiny_model,
    tensor_entry,
)

from r1trade.cli import main
from r1trade.errors import UsageError
from r1trade.models.chat_template import MAX_TEMPLATE_CHARS, RENDER_SECONDS
from r1trade.models.gguf_header import MAX_KEYS, check_gguf
from r1trade.models.trust import require_no_model_code

ROLLOUT = ["show-rollout", "--config", "smoke", "--set", "env.episode_decisions=1", "--set",
           "rollout.max_new_tokens=4"]
BACKTEST = ["--set", "backtest.max_decisions=2", "--set", "backtest.agent_windows=1", "--strategy", "buy_and_hold"]
NESTED_LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
"""A template that renders nothing for ~10^10 loop steps: it hangs without a time limit."""


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def model_copy(tiny_folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_folder, tmp_path / "model"))


# --------------------------------------------------------------------------- folders that would run their code


def test_a_planted_folder_of_an_unknown_model_type_runs_nothing_and_asks_nothing(
    model_copy: Path, tmp_path: Path
) -> None:
    """For a model_type it does not know, transformers would ask whether to run the folder's code, and `yes y`
    would answer it: the folder is refused before transformers reads it."""
    marker = tmp_path / "ran"
    planted = plant(model_copy, marker, where="config.json", model_type="planted")
    result = r1trade_answering_yes(*ROLLOUT, "--set", f"model.name_or_path={model_copy}")
    assert_refused_in_one_line(result.returncode, result.stderr, str(planted), "auto_map")
    assert "[y/N]" not in result.stdout
    assert not marker.exists()


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_an_auto_map_beside_a_known_model_type_is_refused(capsys, model_copy: Path, tmp_path: Path, where: str):
    marker = tmp_path / "ran"
    planted = plant(model_copy, marker, where=where)
    code = main([*ROLLOUT, "--set", f"model.name_or_path={model_copy}"])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(planted), "auto_map")
    assert not marker.exists()


def test_a_planted_checkpoint_policy_is_refused_without_a_prompt(trained_run: Path, tmp_path: Path) -> None:
    """`yes y | r1trade backtest --checkpoint CK`: a full policy whose config.json maps code of its own."""
    marker = tmp_path / "ran"
    run = Path(shutil.copytree(trained_run, tmp_path / "run"))
    policy = run / "checkpoints" / "step-1" / "policy"
    planted = plant(policy, marker, where="config.json", model_type="planted")
    result = r1trade_answering_yes("backtest", "--checkpoint", str(policy.parent), "--out", str(tmp_path / "report"),
                                   *BACKTEST)
    assert_refused_in_one_line(result.returncode, result.stderr, str(planted), "auto_map")
    assert not marker.exists() and not (tmp_path / "report").exists()


def test_resume_refuses_a_run_whose_config_names_a_planted_folder(
    capsys, model_copy: Path, trained_run: Path, tmp_path: Path
) -> None:
    """A real run whose config.yaml was changed to name a planted model folder: refused as the model loads."""
    planted = plant(model_copy, tmp_path / "ran", where="config.json", model_type="planted")
    run_dir = Path(shutil.copytree(trained_run, tmp_path / "run"))
    text = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(text.replace("name_or_path: tiny-random", f"name_or_path: {model_copy}"))
    code = main(["train", "--resume", str(run_dir), "--set", "train.updates=2"])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(planted), "auto_map")
    assert not (tmp_path / "ran").exists()


def test_backtest_model_with_a_planted_folder_is_refused(capsys, model_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    planted = plant(model_copy, marker, where="config.json", model_type="planted")
    code = main(["backtest", "--config", "smoke", "--model", str(model_copy), "--out", str(tmp_path / "report"),
                 *BACKTEST])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(planted))
    assert not marker.exists()


def test_an_unknown_model_type_without_auto_map_is_refused(capsys, model_copy: Path) -> None:
    edit_json(model_copy / "config.json", model_type="planted")
    code = main([*ROLLOUT, "--set", f"model.name_or_path={model_copy}"])
    err = capsys.readouterr().err
    assert_refused_in_one_line(code, err, f"{model_copy / 'config.json'}", "model_type 'planted'")


def test_a_hugging_face_id_whose_cached_files_map_code_is_refused(
    capsys, monkeypatch, model_copy: Path, tmp_path: Path
) -> None:
    """An id is checked in the local cache (hub layout: refs/main names the snapshot) before transformers reads it."""
    import huggingface_hub.constants

    marker = tmp_path / "ran"
    plant(model_copy, marker, where="tokenizer_config.json")
    repo = tmp_path / "hub" / "models--planted-org--planted-model"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = Path(shutil.copytree(model_copy, repo / "snapshots" / commit))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code = main([*ROLLOUT, "--set", "model.name_or_path=planted-org/planted-model"])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(snapshot / "tokenizer_config.json"))
    assert not marker.exists()


def test_the_check_reads_only_the_files_it_is_given(model_copy: Path, tmp_path: Path) -> None:
    """A checkpoint's policy/ is checked for config.json alone: its tokenizer files are never read."""
    plant(model_copy, tmp_path / "ran", where="tokenizer_config.json")
    require_no_model_code(model_copy, files=["config.json"])
    with pytest.raises(UsageError, match="tokenizer_config.json: refused: its auto_map"):
        require_no_model_code(model_copy)


# --------------------------------------------------------------------------- chat templates


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (NESTED_LOOPS, f"the chat template ran over {RENDER_SECONDS:g} s"),
        ("{{ messages.__class__.__base__ }}", "stopped by the sandbox"),
        ("{{ 'x' }}", "leaves out the text of an assistant turn"),
        ("{% for message in messages %}", "the chat template fails"),
        ("{{ raise_exception('no system role') }}", "no system role"),
        ("x" * (MAX_TEMPLATE_CHARS + 1), f"{MAX_TEMPLATE_CHARS + 1:,} characters"),
    ],
    ids=["nested-loops", "dunder", "no-messages", "syntax", "raises", "too-long"],
)
def test_a_hostile_chat_template_ends_in_one_line_naming_its_file(
    capsys, model_copy: Path, template: str, message: str
) -> None:
    (model_copy / "chat_template.jinja").write_text(template)
    code = main([*ROLLOUT, "--set", f"model.name_or_path={model_copy}"])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(model_copy / "chat_template.jinja"), message)


def test_the_saved_tiny_model_loads_and_plays(capsys, model_copy: Path) -> None:
    """The folder the planted tests start from is sound: refusals come from what was planted."""
    assert main([*ROLLOUT, "--set", f"model.name_or_path={model_copy}"]) == 0
    assert "total reward" in capsys.readouterr().out


# --------------------------------------------------------------------------- GGUF headers


def test_a_sound_gguf_header_passes_and_every_truncation_of_it_is_refused(tmp_path: Path) -> None:
    whole = gguf_file()
    assert len(whole) == 176  # worked out in planted_models.gguf_file
    path = tmp_path / "model.gguf"
    path.write_bytes(whole)
    check_gguf(path)
    for length in range(len(whole)):
        path.write_bytes(whole[:length])
        with pytest.raises(UsageError, match=f"cannot read GGUF model {path}: "):
            check_gguf(path)


def _key(name: str, value_type: int, value: bytes) -> bytes:
    return gguf_string(name) + struct.pack("<I", value_type) + value


ARCHITECTURE = _key("general.architecture", 8, gguf_string("llama"))


@pytest.mark.parametrize(
    ("planted", "message"),
    [
        (gguf_file(key_count=2**62), f"4611686018427387904 metadata keys, more than the limit of {MAX_KEYS}"),
        (gguf_file(key_count=1000), "1000 metadata keys, more than the"),
        (gguf_file(tensor_count=2**40), "1099511627776 tensors, more than the limit"),
        (gguf_file(tensor_count=100), "100 tensors, more than the"),
        (gguf_file(version=7), "GGUF version 7"),
        (b"GGML" + gguf_file()[4:], "not a GGUF file"),
        (gguf_file(keys=[ARCHITECTURE, struct.pack("<Q", 2**63)]), "9223372036854775808 bytes long (at most 65535)"),
        (gguf_file(keys=[struct.pack("<Q", 70_000) + b"k" * 70_000]), "70000 bytes long (at most 65535)"),
        (gguf_file(keys=[_key("general.name", 8, struct.pack("<Q", 2**60))]), "the value of key 'general.name'"),
        (gguf_file(keys=[_key("tokens", 9, struct.pack("<IQ", 8, 2**40))]), "strings in the array of key 'tokens'"),
        (gguf_file(keys=[_key("types", 9, struct.pack("<IQ", 5, 10**6))]), "elements in the array of key 'types'"),
        (gguf_file(keys=[_key("nested", 9, struct.pack("<IQ", 9, 1))]), "an array of type 9"),
        (gguf_file(keys=[_key("odd", 13, b"")]), "value type 13"),
        (gguf_file(keys=[ARCHITECTURE, _key("general.alignment", 4, struct.pack("<I", 0))]), "alignment 0 is not"),
        (gguf_file(tensors=[tensor_entry("t", (2, 2, 1, 1, 1), ggml_type=0, offset=0)]), "5 dimensions (at most 4)"),
        (gguf_file(tensors=[tensor_entry("t", (2, 2), ggml_type=99, offset=0)]), "ggml type 99"),
        (gguf_file(tensors=[tensor_entry("t", (2, 2), ggml_type=0, offset=2**50)]), "runs past the end of the file"),
        (gguf_file(tensors=[tensor_entry("t", (3, 2), ggml_type=0, offset=0)]), "(24 bytes at 0) runs past the end"),
    ],
)
def test_a_planted_gguf_header_is_one_line(tmp_path: Path, planted: bytes, message: str) -> None:
    """A 3×2 float32 tensor needs 24 bytes; the file holds 16 after its data start."""
    path = tmp_path / "planted.gguf"
    path.write_bytes(planted)
    with pytest.raises(UsageError) as refused:
        check_gguf(path)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_truncated_gguf_through_the_cli_is_one_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_file()[:100])  # inside the tensor table
    code = main([*ROLLOUT, "--set", f"model.name_or_path={path}"])
    assert_refused_in_one_line(code, capsys.readouterr().err, f"cannot read GGUF model {path}", "cut short")


def test_a_gguf_beside_a_planted_tokenizer_config_is_refused(capsys, model_copy: Path, tmp_path: Path) -> None:
    """transformers reads the files in the GGUF's folder beside it."""
    marker = tmp_path / "ran"
    plant(model_copy, marker, where="tokenizer_config.json")
    (model_copy / "model.gguf").write_bytes(gguf_file())
    code = main([*ROLLOUT, "--set", f"model.name_or_path={model_copy / 'model.gguf'}"])
    assert_refused_in_one_line(code, capsys.readouterr().err, str(model_copy / "tokenizer_config.json"))
    assert not marker.exists()
