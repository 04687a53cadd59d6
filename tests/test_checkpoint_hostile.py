"""Planted and damaged checkpoints: no file of a checkpoint is ever unpickled, and every bad file is one line.

The planted payload is a pickle whose `__reduce__` creates a marker file. `train --resume` and
`backtest --checkpoint` must never create it, whichever file of the checkpoint holds it, and must fail in one line
that names the file (or succeed, where the file is one they do not read).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from trl_fixtures import SHORT_EPISODES, TRL, run_r1trade

from r1trade.cli import main

UNREAD = {"policy/tokenizer.json", "policy/tokenizer_config.json", "policy/chat_template.jinja",
          "policy/generation_config.json", "policy/special_tokens_map.json"}
"""Files a checkpoint carries for other tools (the tokenizer comes from the base model, generation settings
from the config): r1trade never reads them, which the test that plants every file at once shows."""
BACKTEST = ["--set", "backtest.max_decisions=2", "--set", "backtest.agent_windows=1", "--strategy", "buy_and_hold"]


class Payload:
    """Unpickling this creates `marker`: what a planted checkpoint file would do with a real command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def run_copy(trained_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "smoke"
    shutil.copytree(trained_run, copy)
    return copy


def checkpoint_files(run_dir: Path) -> list[str]:
    step = run_dir / "checkpoints" / "step-1"
    return sorted(str(path.relative_to(step)) for path in step.rglob("*") if path.is_file())


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "r1trade.cli", *args], check=False, capture_output=True, text=True, timeout=240,
        env={**os.environ, "COLUMNS": "200"},
    )


def assert_one_line_failure(code: int, err: str) -> None:
    assert code in (1, 2), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_every_file_a_checkpoint_holds_is_covered(trained_run: Path) -> None:
    assert set(checkpoint_files(trained_run)) >= {
        "config.yaml", "trainer_state.json", "optimizer.json", "optimizer.safetensors", "rng.json",
        "rng.safetensors", "policy/model.safetensors", "policy/config.json", "policy/r1trade_model.json",
        "critic/critic.safetensors", "critic/r1trade_model.json",
    }
    assert not [name for name in checkpoint_files(trained_run) if name.endswith((".pt", ".bin", ".pkl"))]


@pytest.mark.parametrize("damage", ["payload", "truncated"])
def test_a_planted_or_damaged_file_runs_nothing_and_fails_in_one_line(
    capsys, trained_run: Path, tmp_path: Path, damage: str
) -> None:
    marker = tmp_path / "pwned"
    for name in sorted(set(checkpoint_files(trained_run)) - UNREAD):
        run_dir = tmp_path / name.replace("/", "_")
        shutil.copytree(trained_run, run_dir)
        step = run_dir / "checkpoints" / "step-1"
        target = step / name
        whole = target.read_bytes()
        cut = whole[: len(whole) // 2] + b"\xff"  # cut short mid-write, ending in a byte that is not UTF-8
        target.write_bytes(pickle.dumps(Payload(marker)) if damage == "payload" else cut)
        codes = []
        for args in (
            ["train", "--resume", str(run_dir), "--set", "train.updates=2"],
            ["backtest", "--checkpoint", str(step), "--out", str(tmp_path / "report" / name), *BACKTEST],
        ):
            if damage == "truncated" and codes and codes[0] != 0:
                break  # refused already; a payload is tried on both commands, a cut file until one refuses it
            codes.append(main(args))
            err = capsys.readouterr().err
            assert not marker.exists(), (name, args[0])
            if codes[-1] != 0:  # a file the command reads: refused in one line
                assert_one_line_failure(codes[-1], err)
                assert str(step) in err
        assert max(codes) > 0, name  # every file r1trade reads is checked


@pytest.mark.slow
def test_the_planted_pickles_of_an_old_checkpoint_are_refused_through_the_cli(
    trained_run: Path, tmp_path: Path
) -> None:
    """The attack on pickled checkpoints: optimizer.pt and rng.pt, and a pytorch_model.bin for the weights."""
    marker = tmp_path / "pwned"
    old_format, planted_weights = tmp_path / "old", tmp_path / "weights"
    for copy in (old_format, planted_weights):
        shutil.copytree(trained_run, copy)
    step = old_format / "checkpoints" / "step-1"
    for name in ("optimizer", "rng"):
        for current in step.glob(f"{name}.*"):
            current.unlink()
        torch.save({"state": Payload(marker)}, step / f"{name}.pt")
    resumed = cli("train", "--resume", str(old_format), "--set", "train.updates=2")
    assert_one_line_failure(resumed.returncode, resumed.stderr)
    assert "pickles (optimizer.pt)" in resumed.stderr and "unpickling can run code" in resumed.stderr

    step = planted_weights / "checkpoints" / "step-1"
    (step / "policy" / "model.safetensors").unlink()
    torch.save({"weights": Payload(marker)}, step / "policy" / "pytorch_model.bin")
    result = cli("backtest", "--checkpoint", str(step), "--out", str(tmp_path / "report"), *BACKTEST)
    assert_one_line_failure(result.returncode, result.stderr)
    assert f"{step}/policy: cannot load the policy's weights" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "report").exists()


@pytest.mark.slow
def test_every_file_planted_at_once_through_the_cli(run_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    step = run_copy / "checkpoints" / "step-1"
    for name in checkpoint_files(run_copy):
        if name != "config.yaml":  # the config must load for the weights to be reached
            (step / name).write_bytes(pickle.dumps(Payload(marker)))
    for args in (
        ["train", "--resume", str(run_copy), "--set", "train.updates=2"],
        ["backtest", "--checkpoint", str(step), "--out", str(tmp_path / "report"), *BACKTEST],
    ):
        result = cli(*args)
        assert_one_line_failure(result.returncode, result.stderr)
        assert str(step) in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ('{"step": 1, "extra": 2}', "expected {'step': N} with a whole number N"),
        ('{"step": -1}', "expected {'step': N} with a whole number N"),
        ('[1]', "expected a JSON object, found list"),
        ('{"step": 1', "not a readable JSON file"),
    ],
)
def test_a_bad_state_file_is_one_line_naming_it(capsys, run_copy: Path, saved: str, message: str) -> None:
    state = run_copy / "checkpoints" / "step-1" / "trainer_state.json"
    state.write_text(saved)
    config_before = (run_copy / "config.yaml").read_bytes()
    assert main(["train", "--resume", str(run_copy), "--set", "train.updates=2"]) == 1
    err = capsys.readouterr().err
    assert f"{state}: {message}" in err and len(err.strip().splitlines()) == 1
    assert (run_copy / "config.yaml").read_bytes() == config_before


def test_optimizer_state_of_another_shape_is_one_line(capsys, run_copy: Path) -> None:
    step = run_copy / "checkpoints" / "step-1"
    document = json.loads((step / "optimizer.json").read_text())
    document["optimizer"]["param_groups"] = []
    (step / "optimizer.json").write_text(json.dumps(document))
    assert main(["train", "--resume", str(run_copy), "--set", "train.updates=2"]) == 1
    err = capsys.readouterr().err
    assert f"{step}/optimizer.json: the saved state does not fit this run" in err
    assert len(err.strip().splitlines()) == 1


def tree(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run folder by its path: what a refused resume must leave as it was."""
    return {str(path.relative_to(run_dir)): path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}


def damage_rng(step: Path, where: str, value: object) -> None:
    """Set the numpy state's key position (`numpy`) or the Python state's (`python`) in `rng.json`."""
    document = json.loads((step / "rng.json").read_text())
    if where == "numpy":  # ('MT19937', keys, position, has_gauss, cached_gaussian)
        document["numpy"]["tuple"][2] = value
    else:  # (3, (624 keys..., position), gauss_next)
        document["python"]["tuple"][1]["tuple"][-1] = value
    (step / "rng.json").write_text(json.dumps(document))


RNG_DAMAGE = [
    ("numpy", 2**70, "numpy's key position is 1180591620717411303424, not 0 to 624"),  # an OverflowError in NumPy
    ("numpy", 700_000, "numpy's key position is 700000, not 0 to 624"),  # NumPy takes it, then reads past its key
    ("numpy", -1, "numpy's key position is -1, not 0 to 624"),
    ("numpy", 3.5, "numpy's key position is 3.5, not 0 to 624"),
    ("python", 10**30, "python's key position is 1000000000000000000000000000000, not 0 to 624"),
]


@pytest.mark.parametrize(("where", "value", "message"), RNG_DAMAGE)
def test_random_states_out_of_range_are_one_line_and_change_nothing(
    capsys, run_copy: Path, where: str, value: object, message: str
) -> None:
    step = run_copy / "checkpoints" / "step-1"
    damage_rng(step, where, value)
    before = tree(run_copy)
    assert main(["train", "--resume", str(run_copy), "--set", "train.updates=2"]) == 1
    err = capsys.readouterr().err
    assert f"{step}/rng.json: the saved state does not fit this run ({message})" in err
    assert_one_line_failure(1, err)
    assert tree(run_copy) == before


def test_numpy_key_words_past_32_bits_are_one_line_and_change_nothing(capsys, run_copy: Path) -> None:
    """NumPy's key is kept as int64 words: a word past 32 bits would wrap silently into the uint32 key."""
    step = run_copy / "checkpoints" / "step-1"
    keys = json.loads((step / "rng.json").read_text())["numpy"]["tuple"][1]["array"]["tensor"]
    tensors = load_file(step / "rng.safetensors")
    tensors[keys] = tensors[keys].clone()
    tensors[keys][0] = 2**32 + 5
    save_file(tensors, step / "rng.safetensors")
    before = tree(run_copy)
    assert main(["train", "--resume", str(run_copy), "--set", "train.updates=2"]) == 1
    err = capsys.readouterr().err
    assert f"{step}/rng.json: damaged state file (array values out of range of its dtype uint32)" in err
    assert_one_line_failure(1, err)
    assert tree(run_copy) == before


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-update run of the `train.engine: trl` path (its checkpoint writes its random-number states itself)."""
    root = tmp_path_factory.mktemp("trl")
    overrides = [*TRL, *SHORT_EPISODES, "train.updates=1", f"output_dir={root}"]
    trained = run_r1trade("train", "--config", "smoke", *(part for o in overrides for part in ("--set", o)), cwd=root)
    assert trained.returncode == 0, trained.stderr[-2000:]
    return root / "smoke"


@pytest.mark.slow
@pytest.mark.parametrize(("where", "value", "message"), RNG_DAMAGE[:2])
def test_random_states_out_of_range_in_a_trl_checkpoint_are_one_line_and_change_nothing(
    trl_run: Path, tmp_path: Path, where: str, value: object, message: str
) -> None:
    run_dir = tmp_path / "smoke"
    shutil.copytree(trl_run, run_dir)
    step = run_dir / "checkpoints" / "step-1"
    damage_rng(step, where, value)
    before = tree(run_dir)
    resumed = run_r1trade("train", "--resume", str(run_dir), "--set", "train.updates=2", cwd=tmp_path)
    assert_one_line_failure(resumed.returncode, resumed.stderr)
    assert f"{step}/rng.json: the saved state does not fit this run ({message})" in resumed.stderr
    assert tree(run_dir) == before
