"""A variant's seeds against its recipe's, paired by seed and by decision: the difference and its two-stage
bootstrap interval against numbers worked by hand, and `r1trade compare-seeds` through the CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from r1trade.backtest.paired_seeds import paired_difference
from r1trade.errors import UsageError

TIMES = pd.date_range("2024-10-13 23:00", periods=4, freq="4h", tz="UTC")


def test_a_constant_gain_on_every_decision_and_seed_has_no_spread() -> None:
    reference = {0: np.zeros(4), 1: np.array([1.0, 0.0, 0.0, 0.0])}
    variant = {0: np.ones(4), 1: np.ones(4)}  # seed 0: +100 points; seed 1: +75
    found = paired_difference(reference, variant, resamples=500)
    assert found.seeds == (0, 1)
    assert found.reference == {0: 0.0, 1: 25.0} and found.variant == {0: 100.0, 1: 100.0}
    assert found.per_seed == {0: 100.0, 1: 75.0}
    assert found.difference == pytest.approx(87.5)
    low, high = found.interval
    assert 50.0 <= low <= high <= 100.0  # no resample of these decisions and seeds leaves that range


def test_the_seed_level_spans_the_seeds_when_each_scored_one_decision() -> None:
    # One decision: every decision resample is that decision, so only the seeds vary. Two seeds, +100 and 0:
    # a resample's mean is 0, 50 or 100 with probabilities 1/4, 1/2, 1/4, so the 2.5th and 97.5th percentiles
    # are 0 and 100; the point difference is 50.
    found = paired_difference({0: np.array([0.0]), 1: np.array([1.0])}, {0: np.array([1.0]), 1: np.array([1.0])},
                              resamples=2000)
    assert found.difference == pytest.approx(50.0)
    assert found.interval == (0.0, 100.0)


def test_only_the_shared_seeds_are_paired_and_unequal_decisions_are_refused() -> None:
    found = paired_difference({0: np.ones(2), 3: np.zeros(2)}, {3: np.ones(2), 5: np.zeros(2)}, resamples=100)
    assert found.seeds == (3,) and found.difference == pytest.approx(100.0) and found.interval == (100.0, 100.0)
    with pytest.raises(UsageError, match="share no seed"):
        paired_difference({0: np.ones(2)}, {1: np.ones(2)})
    with pytest.raises(UsageError, match="different numbers of decisions"):
        paired_difference({0: np.ones(2)}, {0: np.ones(3)})


def _seeds_folder(root: Path, name: str, hits: dict[int, list[float]], times=TIMES) -> Path:
    """A seeds folder as `r1trade seeds` leaves it: seeds.json naming each seed's test report, whose hits.csv
    holds the agent's column beside a baseline's."""
    folder = root / name
    entries = []
    for seed, agent in hits.items():
        report = folder / f"seed-{seed}" / "test"
        report.mkdir(parents=True)
        frame = pd.DataFrame({"agent (step-20)": agent, "buy_and_hold": [1.0] * len(agent)},
                             index=pd.Index(times[: len(agent)], name="timestamp"))
        frame.to_csv(report / "hits.csv")
        entries.append({"seed": seed, "step": 20, "report": str(report), "figures": {}})
    (folder / "seeds.json").write_text(json.dumps({"config": "demo_tools", "seeds": entries}))
    return folder


def _compare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "r1trade.cli", "compare-seeds", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_compare_seeds_prints_each_variants_paired_difference(tmp_path: Path) -> None:
    recipe = _seeds_folder(tmp_path, "full", {0: [1, 1, 0, 0], 1: [1, 1, 1, 0]})
    worse = _seeds_folder(tmp_path, "no_loss_mask", {0: [1, 0, 0, 0], 1: [0, 0, 1, 0]})
    same = _seeds_folder(tmp_path, "no_adv_mask", {0: [1, 1, 0, 0], 1: [1, 1, 1, 0]})
    result = _compare(tmp_path, str(recipe), str(worse), str(same), "--resamples", "500")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| no_")]
    # recipe 50 and 75 %, mean 62.5; no_loss_mask 25 and 25 %: -25 and -50 points, mean -37.5
    assert rows[0].startswith("| no_loss_mask | 0 1 | 62.5 | 25.0 | 0: -25.0, 1: -50.0 | -37.5 [")
    assert rows[1] == "| no_adv_mask | 0 1 | 62.5 | 62.5 | 0: +0.0, 1: +0.0 | +0.0 [+0.0, +0.0] |"


def test_compare_seeds_refuses_folders_it_cannot_pair_in_one_line(tmp_path: Path) -> None:
    recipe = _seeds_folder(tmp_path, "full", {0: [1, 1, 0, 0]})
    shifted = _seeds_folder(tmp_path, "later", {0: [1, 1, 0, 0]}, times=TIMES + pd.Timedelta(hours=4))
    old = _seeds_folder(tmp_path, "old", {0: [1, 1, 0, 0]})
    (old / "seed-0" / "test" / "hits.csv").unlink()
    (tmp_path / "empty").mkdir()
    for variant, message in ((shifted, "tested their agents on different decisions"),
                             (old, "no hits.csv (a report written before it existed"),
                             (tmp_path / "empty", "not a seeds folder")):
        result = _compare(tmp_path, str(recipe), str(variant))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr


def test_a_damaged_or_hostile_hits_file_is_one_line(tmp_path: Path) -> None:
    from r1trade.backtest.paired_seeds import agent_hits

    report = tmp_path / "report"
    report.mkdir()
    for text, message in (("\x00\x01 not a csv\n\"unclosed", "hits.csv"),
                          ("timestamp,agent (step-1)\n2024-01-01,2.0\n", "one agent column of 0s and 1s"),
                          ("timestamp,buy_and_hold\n2024-01-01,1.0\n", "one agent column of 0s and 1s")):
        (report / "hits.csv").write_text(text)
        with pytest.raises(UsageError, match=message) as refused:
            agent_hits(report)
        assert "\n" not in str(refused.value)
