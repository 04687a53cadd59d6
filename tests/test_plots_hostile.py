"""`plot-run` and `compare-runs` on damaged logs and wrong arguments: a warning or one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "r1trade.cli", *map(str, args)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


def make_run(folder: Path, *, cut_short: bool = False) -> Path:
    """A run folder with three updates logged; `cut_short` leaves the last line half-written (a crash)."""
    folder.mkdir(parents=True)
    row = {"valid_call_rate": 0.5, "reward/pnl": 0.2}
    rows = [{"update": u, "episode_return": u / 10, **row} for u in (1, 2, 3)]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (folder / "metrics.jsonl").write_text(text[:-12] if cut_short else text)
    return folder


def assert_usage_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().split("\n")
    assert line.startswith("error:") and all(fragment in line for fragment in fragments), line


def test_plot_run_skips_a_half_written_last_line(tmp_path: Path):
    run_dir = make_run(tmp_path / "run", cut_short=True)
    result = cli("plot-run", run_dir)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (warning,) = result.stderr.strip().split("\n")
    assert warning.startswith("warning:") and f"{run_dir / 'metrics.jsonl'} line 3" in warning
    for name in ("learning_curves.png", "reward_components.png"):
        assert (run_dir / name).read_bytes()[:8] == PNG


def test_compare_runs_skips_half_written_lines(tmp_path: Path):
    runs = [make_run(tmp_path / name, cut_short=True) for name in ("a", "b")]
    out = tmp_path / "cmp.png"
    result = cli("compare-runs", *runs, "--out", out)
    assert result.returncode == 0 and out.read_bytes()[:8] == PNG
    assert len(result.stderr.strip().split("\n")) == 2 and "Traceback" not in result.stderr


def test_compare_runs_draws_only_png(tmp_path: Path):
    runs = [make_run(tmp_path / name) for name in ("a", "b")]
    assert_usage_error(cli("compare-runs", *runs, "--out", tmp_path / "cmp.txt"), "not a .png file")
    assert not (tmp_path / "cmp.txt").exists()

    result = cli("compare-runs", *runs, "--out", tmp_path / "plots")
    assert result.returncode == 0 and f"wrote {tmp_path / 'plots.png'}" in result.stdout
    assert (tmp_path / "plots.png").read_bytes()[:8] == PNG and not (tmp_path / "plots").exists()


def test_compare_runs_refuses_an_unknown_metric(tmp_path: Path):
    runs = [make_run(tmp_path / name) for name in ("a", "b")]
    out = tmp_path / "cmp.png"
    result = cli("compare-runs", *runs, "--out", out, "--metric", "episode_return", "--metric", "sharpe")
    assert_usage_error(result, "'sharpe'", "episode_return, reward/pnl, valid_call_rate")
    assert not out.exists()
