"""Shared fixtures: small synthetic candles and the shipped sample's path; `--cpu-kernels=off` runs the session
without r1trade's CPU fast paths; tests marked `cuda` are skipped where torch sees no CUDA GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "btc_usd_1h.parquet"
CPU_TESTS = Path(__file__).resolve().parent / "cpu"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-kernels", choices=("auto", "off"), default=None,
        help="set model.cpu_kernels for the whole session, commands the tests start included (R1TRADE_CPU_KERNELS)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu_kernels: needs the CPU fast paths on (skipped with --cpu-kernels=off)")
    setting = config.getoption("--cpu-kernels")
    if setting is not None:
        os.environ["R1TRADE_CPU_KERNELS"] = setting
    _share_the_cores_among_workers()


def _share_the_cores_among_workers() -> None:
    """Under pytest-xdist (`make test` runs `-n auto`), each worker and the commands its tests start get their share
    of the cores, set before torch is imported: the tiny models' small products gain nothing from a second thread,
    and threads of two workers spinning on the same cores made the suite 40 % slower."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is not None and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(workers)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """tests/cpu tests the fast paths themselves: with the kernels off they are skipped, as is any test marked so.
    Tests marked `cuda` are skipped where torch sees no CUDA GPU. Files holding a test marked `slow` run first."""
    _slow_files_first(items)
    skip = pytest.mark.skip(reason="the CPU fast paths are off (--cpu-kernels=off)")
    for item in items:
        if CPU_TESTS in item.path.parents:
            item.add_marker("cpu_kernels")
        if os.environ.get("R1TRADE_CPU_KERNELS") == "off" and item.get_closest_marker("cpu_kernels"):
            item.add_marker(skip)
    cuda_tests = [item for item in items if item.get_closest_marker("cuda")]
    if cuda_tests and not _cuda_available():
        no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
        for item in cuda_tests:
            item.add_marker(no_gpu)


def _slow_files_first(items: list[pytest.Item]) -> None:
    """The longest jobs first, so that the workers end together: `make test` hands whole files to its workers in
    collection order (`--dist loadfile --no-loadscope-reorder`), and a long file handed out last kept one worker
    busy for minutes after the other had finished."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's tests stay together, in order


def _cuda_available() -> bool:
    import torch  # (only when a collected test is marked cuda)

    return torch.cuda.is_available()


def run_in_a_fresh_process(commands: list[list[str]]) -> tuple[list[int], list[str], str]:
    """Run CLI commands in one new Python process: their exit codes, which of torch, transformers and peft they
    imported, and stderr (a refusal should need none of the three, which take seconds to import)."""
    script = (f"import json, sys; from r1trade.cli import main; codes = [main(args) for args in {commands!r}]; "
              "print(json.dumps([codes, sorted({'torch', 'transformers', 'peft'} & set(sys.modules))]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    codes, imported = json.loads(done.stdout.strip().splitlines()[-1])
    return codes, imported, done.stderr


def make_synthetic_candles(n: int = 500, *, seed: int = 0, start: str = "2021-01-01", freq: str = "1h") -> pd.DataFrame:
    """A random-walk OHLCV series in the canonical schema (valid: high ≥ max(o, c), low ≤ min(o, c))."""
    rng = np.random.default_rng(seed)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.concatenate([[100.0], close[:-1]]) * np.exp(rng.normal(0, 0.001, n))
    high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.005, n))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.005, n))
    volume = rng.uniform(1, 10, n)
    index = pd.date_range(start, periods=n, freq=freq, tz="UTC", name="timestamp")
    candles = pd.DataFrame({"open": open_, "high": high, "low": low, "close": close, "volume": volume}, index=index)
    candles.attrs.update(symbol="TEST/USD", timeframe=freq.lower(), source="synthetic")
    return candles


@pytest.fixture(scope="session", autouse=True)
def _cache_home(tmp_path_factory) -> None:
    """Kernels compiled by the tests (and anything else cached) go to a fresh directory, not the user's cache."""
    os.environ["R1TRADE_CACHE"] = str(tmp_path_factory.mktemp("r1trade-cache"))


@pytest.fixture
def candles() -> pd.DataFrame:
    return make_synthetic_candles()


@pytest.fixture
def sample_path() -> Path:
    return SAMPLE


FAST_TRAIN = [
    "--set", "env.episode_decisions=2", "--set", "rollout.max_new_tokens=12", "--set", "train.epochs=1",
    "--set", "train.updates=1",
]
"""One short update of the smoke config: enough for a complete run folder and checkpoint."""


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A finished one-update run of the tiny model (full fine-tuning: the policy is a whole model); copy it
    before changing it."""
    from r1trade.cli import main

    root = tmp_path_factory.mktemp("trained")
    assert main(["train", "--config", "smoke", *FAST_TRAIN, "--set", f"output_dir={root}"]) == 0
    return root / "smoke"


@pytest.fixture(scope="session")
def tiny_agent():
    """The tiny random policy and its tokenizer (tests/agent_fixtures.py has the helpers that play it)."""
    from r1trade.config import ModelConfig
    from r1trade.models.loading import load_agent_models

    models = load_agent_models(ModelConfig(name_or_path="tiny-random"), seed=0)
    return models.policy, models.tokenizer


@pytest.fixture(scope="module")
def one_torch_thread():
    """The tiny model decodes faster on one thread than with threads competing for a busy CPU (modules that play
    it a lot use this)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
