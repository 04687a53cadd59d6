"""Data parallel training on two CPU processes (torchrun + accelerate, gloo): gradients are averaged, so both
processes end with identical weights although they played different episodes of different lengths."""

import os
import re
import subprocess
import sys
from pathlib import Path

TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_two_processes_end_with_identical_weights(tmp_path: Path):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    worker = Path(__file__).parent / "distributed_worker.py"
    result = subprocess.run(
        [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", "29517", str(worker), str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    hashes = dict(re.findall(r"rank (\d)/2 ([0-9a-f]{64})", result.stdout))
    assert set(hashes) == {"0", "1"} and hashes["0"] == hashes["1"]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
