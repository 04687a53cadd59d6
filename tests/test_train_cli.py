"""End to end through the CLI: train the tiny model on the shipped sample, resume it, view a rollout."""

from __future__ import annotations

import json
from pathlib import Path

from r1trade.cli import main

FAST = ["--set", "env.episode_decisions=2", "--set", "rollout.max_new_tokens=12", "--set", "train.epochs=1"]


def test_train_resume_and_show_rollout(capsys, tmp_path: Path):
    runs = tmp_path / "a[/b]"  # a folder whose name reads as Rich markup is printed as it is
    out_dir = ["--set", f"output_dir={runs}"]
    assert main(["train", "--config", "smoke", *FAST, *out_dir]) == 0
    run_dir = runs / "smoke"
    final = f"final checkpoint: {run_dir / 'checkpoints' / 'step-2'}"
    assert "".join(final.split()) in "".join(capsys.readouterr().out.split())  # Rich wraps long lines
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "metrics.jsonl", "splits.json", "checkpoints"}
    assert (run_dir / "checkpoints" / "step-2" / "policy").is_dir()
    splits = json.loads((run_dir / "splits.json").read_text())
    assert splits["train"]["rows"] > splits["test"]["rows"] > 0

    # training again into the same run without --resume is refused
    capsys.readouterr()
    assert main(["train", "--config", "smoke", *FAST, *out_dir]) == 2
    assert "--resume" in capsys.readouterr().err

    assert main(["train", "--resume", str(run_dir), "--set", "train.updates=3"]) == 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step-3").is_dir()

    capsys.readouterr()
    assert main(["show-rollout", "--checkpoint", str(run_dir / "checkpoints" / "step-3"), "--greedy"]) == 0
    shown = capsys.readouterr().out
    assert "segment 0" in shown and "total reward" in shown
    # --set applies to the run's own config: the episode's observation says so
    step = str(run_dir / "checkpoints" / "step-3")
    assert main(["show-rollout", "--checkpoint", step, "--greedy", "--set", "env.max_tool_calls=9"]) == 0
    assert "Tool calls left: 9." in capsys.readouterr().out

    # the held-out probe: the start and every checkpoint, then nothing new to do
    assert main(["probe-run", str(run_dir), "--points", "5"]) == 0
    records = json.loads((run_dir / "probe-test.json").read_text())
    steps = sorted(int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").iterdir())
    assert [r["step"] for r in records] == [0, *steps]
    # two-decision windows follow the policy: 3 windows for 5 points, a point at each of their 6 decisions
    assert all(r["points"] == 6 and set(r["expected_accuracy_by_decision"]) == {"0", "1"} for r in records)
    assert all(0 <= r["expected_direction_accuracy"] <= 1 for r in records)
    assert all(r["discrimination"] is None or -1 <= r["discrimination"] <= 1 for r in records)
    assert all(0 <= r["call_follows_word"] <= 1 for r in records)
    assert (run_dir / "probe-test.png").is_file()
    capsys.readouterr()
    assert main(["probe-run", str(run_dir), "--points", "5"]) == 0
    assert "expected direction accuracy" not in capsys.readouterr().out  # every step already probed


def test_resume_of_a_non_run_directory_is_a_usage_error(capsys, tmp_path: Path):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_plot_run_draws_png_files(capsys, tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"update": u, "episode_return": 0.1 * u, "reward/pnl": 0.2, "reward/format": -0.1, "entropy": 2.0,
             "kl_ref": 0.01 * u, "grad_norm": 1.0, "valid_call_rate": 0.5} for u in (1, 2, 3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot-run", str(run_dir)]) == 0
    for name in ("learning_curves.png", "reward_components.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot-run", str(tmp_path / "nothing")]) == 2


def test_compare_runs_overlays_several_runs(capsys, tmp_path: Path):
    for name, slope in (("full-masks", 0.2), ("no-masks", -0.1)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        rows = [{"update": u, "episode_return": slope * u, "valid_call_rate": 0.5} for u in (1, 2, 3)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cmp" / "masks.png"
    args = ["compare-runs", str(tmp_path / "full-masks"), str(tmp_path / "no-masks"), "--out", str(out)]
    assert main([*args, "--metric", "episode_return", "--metric", "valid_call_rate"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["compare-runs", str(tmp_path / "full-masks"), "--out", str(out)]) == 2
    assert "at least two" in capsys.readouterr().err
