"""Data parallel training on two CPU processes (torchrun + accelerate, gloo), with r1trade's own gradient
averaging and with DeepSpeed ZeRO stage 2. Both processes end with identical weights although they played
different episodes of different lengths; ZeRO gives the same weights as the plain run and resumes exactly."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TORCHRUN = Path(sys.executable).parent / "torchrun"
WORKER = Path(__file__).parent / "distributed_worker.py"
PLAIN = {"ACCELERATE_USE_CPU": "1"}
ZERO2 = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}


def launch(run_dir: Path, updates: int, launcher_env: dict[str, str], port: int) -> dict[str, str]:
    """Train on two processes; returns the weight hash per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **launcher_env}
    result = subprocess.run(
        [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", str(port), str(WORKER), str(run_dir), str(updates)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    hashes = dict(re.findall(r"rank (\d)/2 ([0-9a-f]{64})", result.stdout))
    assert set(hashes) == {"0", "1"}, result.stdout[-2000:]
    return hashes


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    hashes = launch(run_dir, 2, PLAIN, 29517)
    assert hashes["0"] == hashes["1"]
    return run_dir


@pytest.mark.slow
def test_two_processes_end_with_identical_weights(plain_run: Path):
    assert len((plain_run / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_deepspeed_zero2_matches_plain_data_parallel_and_resumes_exactly(plain_run: Path, tmp_path: Path):
    pytest.importorskip("deepspeed")
    straight = launch(tmp_path / "zero2", 2, ZERO2, 29518)
    assert straight["0"] == straight["1"]
    weights = torch.load(tmp_path / "zero2" / "final-weights.pt")
    # same averaged gradients and AdamW, summed in another order: equal up to float rounding
    torch.testing.assert_close(weights, torch.load(plain_run / "final-weights.pt"), rtol=1e-5, atol=1e-6)
    assert (tmp_path / "zero2" / "checkpoints" / "step-2" / "deepspeed").is_dir()

    # 1 update, then resume to 2: the copy of the run without its step-2 checkpoint continues from step 1
    shutil.copytree(tmp_path / "zero2", tmp_path / "split")
    shutil.rmtree(tmp_path / "split" / "checkpoints" / "step-2")
    resumed = launch(tmp_path / "split", 2, ZERO2, 29519)
    assert resumed == straight
    assert metrics_without_timing(tmp_path / "split") == metrics_without_timing(tmp_path / "zero2")


def metrics_without_timing(run_dir: Path) -> list[dict]:
    timing = {"rollout_tokens_per_s", "update_tokens_per_s", "rollout_seconds", "score_seconds", "update_seconds",
              "peak_memory_mb"}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["update"] for row in rows] == [1, 2]
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]
