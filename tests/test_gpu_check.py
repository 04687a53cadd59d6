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
import torch

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


def test_the_decoding_table_gives_each_decoders_step_its_rate_and_the_speed_up() -> None:
    """20 ms a step for 16 rows is 800 tokens/s; 50 ms is 320; 50 / 20 = 2.5x."""
    measurements = [
        gpu_check.DecodeMeasurement("random:smollm2-135m", 16, {"r1trade": 20.0, "generate": 50.0}),
        gpu_check.DecodeMeasurement("random:smollm2-135m", 256, {}, failure="CUDA out of memory"),
    ]
    assert gpu_check.decode_table(measurements, ["r1trade", "generate"]).splitlines()[2:] == [
        "| model | rows | r1trade: ms a step | tokens/s | generate: ms a step | tokens/s | r1trade / generate |",
        "|---|---:|---:|---:|---:|---:|---:|",
        "| `random:smollm2-135m` | 16 | 20.00 | 800 | 50.00 | 320 | 2.50x |",
        "| `random:smollm2-135m` | 256 | failed: CUDA out of memory | | | | |",
    ]


def test_decoding_is_measured_on_any_device_each_decoder_counting_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU with the built-in model: `generate` decodes every token it is asked for (new - 1 steps after the
    prefill); the engine's steps are its one-column model calls, at most new - 1 (a row may end its turn)."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import decode_step

    from r1trade.config import load_config
    from r1trade.models.loading import load_agent_models

    models = load_agent_models(load_config("demo").model, seed=0)
    ids = torch.randint(3, len(models.tokenizer), (3, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        generated = decode_step.hf_decoder(models.policy, compiled=False)(ids, 5)
        engine = decode_step.engine_decoder(models.policy, models.tokenizer)(ids, 5)
    assert (generated.tokens, generated.steps) == (15, 4) and generated.seconds > 0
    assert 1 <= engine.steps <= 4 and engine.tokens <= 15 and engine.seconds > 0

    [measured] = gpu_check.measure_decoding(gpu_check.QUICK_MODEL, [2], compiled=False, device="cpu", prompt=8, new=4,
                                            repeats=1)
    assert measured.failure is None and set(measured.ms_per_step) == {"r1trade", "r1trade, eager step", "generate"}
    assert all(ms > 0 for ms in measured.ms_per_step.values())


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
