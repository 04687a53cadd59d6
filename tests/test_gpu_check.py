"""benchmarks/gpu_check.py on a CPU: what it measures, the configs it runs (both engines accept them), the figures it
reads from a run's records, its table, and its one-line refusal without a CUDA GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from r1trade.integrations.trl.settings import check_trl_settings
from r1trade.models.random_models import RANDOM_MODELS

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()


def test_it_measures_every_model_shape_with_both_engines() -> None:
    assert gpu_check.SIZES == RANDOM_MODELS
    assert gpu_check.ENGINES == ("r1trade", "trl")


@pytest.mark.parametrize("engine", ["r1trade", "trl"])
def test_each_run_is_a_config_its_engine_accepts(tmp_path: Path, engine: str) -> None:
    config = gpu_check.run_config("random:qwen2.5-0.5b", engine, 3, tmp_path)
    assert (config.model.name_or_path, config.model.dtype, config.model.lora.enabled) == (
        "random:qwen2.5-0.5b", "bfloat16", True)
    assert (config.train.engine, config.train.algorithm, config.train.updates) == (engine, "grpo", 3)
    assert config.train.checkpoint_every == 3 and config.data.source == "synthetic"  # one checkpoint; no download
    assert config.name == f"random-qwen2.5-0.5b-{engine}" and config.output_dir == str(tmp_path)
    check_trl_settings(config)  # what TRL would refuse, in one line, is refused here for both engines


def test_r1trade_figures_are_its_sampled_tokens_over_its_rollout_seconds_and_the_median_update() -> None:
    records = [
        {"rollout_tokens_per_s": 100.0, "rollout_seconds": 2.0, "score_seconds": 1.0, "update_seconds": 3.0},
        {"rollout_tokens_per_s": 50.0, "rollout_seconds": 4.0, "score_seconds": 0.5, "update_seconds": 0.5},
        {"rollout_tokens_per_s": 200.0, "rollout_seconds": 1.0, "score_seconds": 0.5, "update_seconds": 0.5},
    ]
    rate, per_update, sampling = gpu_check.native_figures(records)
    assert rate == pytest.approx((200 + 200 + 200) / 7)
    assert per_update == pytest.approx(5.0)  # whole updates of 6, 5 and 2 s
    assert sampling == pytest.approx(2.0)  # rollouts of 2, 4 and 1 s


def test_trl_figures_are_the_timed_generation_and_the_median_update() -> None:
    tally = gpu_check.GenerationTally(tokens=3000, seconds=1.5)
    rate, per_update, sampling = gpu_check.trl_figures([{"update_seconds": s} for s in (9.0, 2.0, 3.0)], tally)
    assert (rate, per_update, sampling) == (2000.0, 3.0, 0.5)


def test_a_run_that_logged_too_few_updates_has_failed(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"update": 1}) + "\n")
    with pytest.raises(RuntimeError, match="logged 1 of 3 updates"):
        gpu_check.read_records(tmp_path, 3)
    assert gpu_check.read_records(tmp_path, 1) == [{"update": 1}]


def test_the_table_is_markdown_with_a_failed_run_in_its_row() -> None:
    measurements = [
        gpu_check.Measurement("random:qwen2.5-0.5b", "r1trade", 1234.56, 2.345, 1.004, 3.21),
        gpu_check.Measurement("random:qwen2.5-0.5b", "trl", failure="CUDA out of memory"),
    ]
    table = gpu_check.markdown_table(measurements, header="NVIDIA H100: torch 2.11", settings="3 updates.")
    assert table.splitlines() == [
        "**NVIDIA H100: torch 2.11**",
        "",
        "3 updates.",
        "",
        "| model | engine | rollout tokens/s | s / update | of which sampling | peak GPU memory |",
        "|---|---|---:|---:|---:|---:|",
        "| `random:qwen2.5-0.5b` | r1trade | 1,235 | 2.35 | 1.00 | 3.21 GiB |",
        "| `random:qwen2.5-0.5b` | trl | failed: CUDA out of memory | | | |",
    ]
    assert "3 update(s) per run" in gpu_check.settings_line(3) and "rollout.num_envs=16" in gpu_check.settings_line(3)


def _write_wheel(path: Path) -> None:
    """A one-module pure-Python wheel, as pip reads one."""
    name, version = path.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "ANSWER = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{file},,\n" for file in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in files.items():
            wheel.writestr(file, text)


def test_the_wheels_install_offline_and_go_first_on_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    _write_wheel(wheels / "gpu_check_probe-1.0-py3-none-any.whl")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "src")
    gpu_check.install_wheels(wheels, site)
    assert (site / "gpu_check_probe" / "__init__.py").read_text() == "ANSWER = 42\n"
    assert sys.path[0] == str(site)
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(site), "src"])  # for the tests it starts


def test_no_wheels_install_nothing_and_a_broken_one_is_one_line(tmp_path: Path) -> None:
    gpu_check.install_wheels(tmp_path, tmp_path / "site")
    assert not (tmp_path / "site").exists()
    (tmp_path / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(gpu_check.CheckError, match="pip could not install the wheels of") as caught:
        gpu_check.install_wheels(tmp_path, tmp_path / "site")
    assert "\n" not in str(caught.value)


def test_without_a_cuda_gpu_it_stops_at_once_with_one_line() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: gpu-check needs a CUDA GPU: torch ")
    assert result.stderr.count("\n") == 1
