"""Reports and runs are never overwritten or mixed: refused targets, whole-folder replacement, a full disk,
locked run folders, and resumes that touch nothing until their checkpoint has loaded."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import FAST_TRAIN

from r1trade import outputs
from r1trade.cli import main
from r1trade.outputs import locked_run_folder, write_folder

BASELINE = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold"]


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def disk_full_on(name: str):
    """A writer that fails like a full disk on the file called `name`."""
    write = outputs._write

    def failing(path: Path, content: str | bytes) -> None:
        if path.name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(path, content)

    return failing


# --------------------------------------------------------------------------- reports


def test_a_report_never_goes_into_a_checkpoint_or_run_folder(capsys, trained_run: Path) -> None:
    step = trained_run / "checkpoints" / "step-1"
    before = snapshot(trained_run)
    for target, holds in ((step, "trainer_state.json"), (trained_run, "checkpoints")):
        for force in ([], ["--force"]):
            code, err = run(capsys, *BASELINE, "--checkpoint", str(step), "--out", str(target), *force)
            assert code == 2 and f"--out '{target}' is a run, checkpoint or model folder (it holds {holds})" in err
            assert len(err.strip().splitlines()) == 1
    assert snapshot(trained_run) == before


def test_a_previous_report_is_replaced_only_with_force_and_as_a_whole(capsys, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert run(capsys, *BASELINE, "--out", str(out))[0] == 0
    first = snapshot(out)
    code, err = run(capsys, *BASELINE, "--out", str(out), "--set", "env.fee_bps=50")
    assert code == 2 and f"--out '{out}' holds a previous report: pass --force to replace it" in err
    assert snapshot(out) == first
    assert run(capsys, *BASELINE, "--out", str(out), "--set", "env.fee_bps=50", "--force")[0] == 0
    second = snapshot(out)
    assert set(second) == set(first) and second["metrics.json"] != first["metrics.json"]
    assert "fee_bps: 50.0" in second["config.yaml"].decode()
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no temporary folder left beside it


def test_a_folder_with_other_files_is_never_a_report_target(capsys, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "metrics.json").write_text("{}")
    for force in ([], ["--force"]):
        code, err = run(capsys, *BASELINE, "--out", str(tmp_path), *force)
        assert code == 2 and "holds files that are not a report (notes.txt)" in err
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "metrics.json").read_text() == "{}"


def test_a_full_disk_names_the_file_and_keeps_the_previous_report(capsys, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "report"
    assert run(capsys, *BASELINE, "--out", str(out))[0] == 0
    before = snapshot(out)
    monkeypatch.setattr(outputs, "_write", disk_full_on("trades.csv"))
    code, err = run(capsys, *BASELINE, "--out", str(out), "--set", "env.fee_bps=50", "--force")
    assert code == 1
    assert f"could not write {out}/trades.csv: No space left on device; '{out}' is unchanged" in err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_write_folder_replaces_every_file_at_once(tmp_path: Path) -> None:
    final = tmp_path / "report"
    write_folder(final, {"a.txt": "1", "b.bin": b"\x00"})
    write_folder(final, {"a.txt": "2"})
    assert snapshot(final) == {"a.txt": b"2"}  # b.bin belonged to the old report and went with it


# --------------------------------------------------------------------------- runs


def test_a_fresh_run_into_an_earlier_one_is_refused_without_force(capsys, trained_run: Path, tmp_path: Path) -> None:
    shutil.copytree(trained_run, tmp_path / "smoke")
    args = ["train", "--config", "smoke", *FAST_TRAIN, "--set", f"output_dir={tmp_path}"]
    code, err = run(capsys, *args)
    assert code == 2 and "holds an earlier run: pass --resume" in err
    (tmp_path / "smoke" / "notes.txt").write_text("mine")
    for measured in ("selected_step.json", "selecting_step.json"):  # figures of the checkpoints being replaced
        (tmp_path / "smoke" / measured).write_text("{}")
    assert run(capsys, *args, "--force")[0] == 0
    assert not any((tmp_path / "smoke" / name).exists() for name in ("selected_step.json", "selecting_step.json"))
    lines = (tmp_path / "smoke" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [1]  # started over, not appended
    assert (tmp_path / "smoke" / "notes.txt").read_text() == "mine"  # only the run's own files were cleared


def test_a_locked_run_folder_is_refused_in_one_line(trained_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    shutil.copytree(trained_run, run_dir)
    before = snapshot(run_dir)
    with (run_dir / ".lock").open("a") as handle:  # another process holds the run
        fcntl.flock(handle, fcntl.LOCK_EX)
        result = subprocess.run(
            [sys.executable, "-m", "r1trade.cli", "train", "--resume", str(run_dir), "--set", "train.updates=2"],
            check=False, capture_output=True, text=True, timeout=240,
        )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: run folder '{run_dir}' is in use by another r1trade process: wait for it"
    assert snapshot(run_dir) == before


def test_the_lock_is_released_when_the_run_ends(tmp_path: Path) -> None:
    with locked_run_folder(tmp_path):
        pass
    with locked_run_folder(tmp_path):  # a second run after the first may take it
        pass


def test_a_refused_resume_leaves_the_run_as_it_was(capsys, trained_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    shutil.copytree(trained_run, run_dir)
    before = snapshot(run_dir)
    code, err = run(capsys, "train", "--resume", str(run_dir), "--set", "model.lora.enabled=true",
                    "--set", "train.updates=2")
    assert code == 2 and "holds a policy for another model config" in err
    assert snapshot(run_dir) == before
    assert run(capsys, "train", "--resume", str(run_dir), "--set", "train.updates=2")[0] == 0


def test_resuming_a_finished_run_is_one_line(capsys, trained_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    shutil.copytree(trained_run, run_dir)
    code, err = run(capsys, "train", "--resume", str(run_dir))
    assert code == 2
    assert f"cannot resume: '{run_dir}' has finished 1 updates and train.updates is 1" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_cut_metrics_line_is_dropped_on_resume(capsys, trained_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    shutil.copytree(trained_run, run_dir)
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write('{"update": 2, "episode_ret')  # killed mid-write
    assert run(capsys, "train", "--resume", str(run_dir), "--set", "train.updates=2")[0] == 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [1, 2]


def test_a_full_disk_while_checkpointing_names_the_file_and_keeps_the_last_checkpoint(
    capsys, trained_run: Path, tmp_path: Path, monkeypatch
) -> None:
    from r1trade.rl import checkpoint

    run_dir = tmp_path / "smoke"
    shutil.copytree(trained_run, run_dir)
    save_state = checkpoint.save_state

    def full_disk(state, directory: Path, stem: str) -> None:
        if stem == "optimizer":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "optimizer.safetensors"))
        save_state(state, directory, stem)

    monkeypatch.setattr(checkpoint, "save_state", full_disk)
    code, err = run(capsys, "train", "--resume", str(run_dir), "--set", "train.updates=2")
    step_2, step_1 = run_dir / "checkpoints" / "step-2", run_dir / "checkpoints" / "step-1"
    assert code == 1
    assert err.strip() == (
        f"error: could not write checkpoint {step_2}/optimizer.safetensors: No space left on device; "
        f"the last complete checkpoint is {step_1}"
    )
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1"]


def test_mistyped_commands_and_options_print_usage_not_a_traceback() -> None:
    for args, hint in ((["trian"], "No such command 'trian'. Did you mean 'train'?"),
                       (["backtest", "--bogus"], "No such option: --bogus")):
        result = subprocess.run([sys.executable, "-m", "r1trade.cli", *args], check=False, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2
        assert hint in result.stderr and "Usage: r1trade" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) <= 5


# --------------------------------------------------------------------------- resolved paths, links


def entries(folder: Path) -> dict[str, str | bytes]:
    """Every entry under `folder` without following links: a file's bytes, a link's target, a folder's name."""
    found: dict[str, str | bytes] = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[name] = path.read_bytes()
        else:
            found[name] = "folder"
    return found


def test_an_out_path_is_checked_where_it_resolves(capsys, tmp_path: Path, trained_run: Path) -> None:
    """`PARENT/missing/..` is PARENT: a folder of other files, never moved aside or deleted. A link to a run
    folder is the run folder."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "notes.txt").write_text("mine")
    climbing = parent / "missing" / ".."
    link = tmp_path / "report-link"
    link.symlink_to(trained_run)
    before, run_before = entries(tmp_path), snapshot(trained_run)
    for force in ([], ["--force"]):
        code, err = run(capsys, *BASELINE, "--out", str(climbing), *force)
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert f"--out '{climbing}' (that is '{parent}') holds files that are not a report (notes.txt)" in err
        code, err = run(capsys, *BASELINE, "--out", str(link), *force)
        assert code == 2 and f"(that is '{trained_run}') is a run, checkpoint or model folder" in err
    assert entries(tmp_path) == before and snapshot(trained_run) == run_before


def test_a_report_through_a_link_replaces_the_folder_it_points_to(capsys, tmp_path: Path) -> None:
    target = tmp_path / "reports" / "kept"
    assert run(capsys, *BASELINE, "--out", str(target))[0] == 0
    link = tmp_path / "latest"
    link.symlink_to(target)
    assert run(capsys, *BASELINE, "--out", str(link), "--set", "env.fee_bps=50", "--force")[0] == 0
    assert link.is_symlink() and "fee_bps: 50.0" in (target / "config.yaml").read_text()
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["kept"]  # nothing aside, nothing new


def linked_run(trained_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the trained run whose `checkpoints` is a link to a folder outside it (another disk, say)."""
    run_dir, elsewhere = tmp_path / "smoke", tmp_path / "elsewhere"
    shutil.copytree(trained_run, run_dir)
    shutil.move(run_dir / "checkpoints", elsewhere)
    (run_dir / "checkpoints").symlink_to(elsewhere)
    return run_dir, elsewhere


def test_force_removes_a_linked_folder_as_a_link(capsys, trained_run: Path, tmp_path: Path) -> None:
    run_dir, elsewhere = linked_run(trained_run, tmp_path)
    outside = snapshot(elsewhere)
    code, err = run(capsys, "train", "--config", "smoke", *FAST_TRAIN, "--set", f"output_dir={tmp_path}", "--force")
    assert code == 0, err
    assert snapshot(elsewhere) == outside  # what the link pointed to is untouched
    assert not (run_dir / "checkpoints").is_symlink() and (run_dir / "checkpoints" / "step-1").is_dir()
    assert not [p for p in run_dir.iterdir() if p.name.startswith(outputs.CLEARING)]


def test_a_clear_that_cannot_finish_puts_everything_back(
    capsys, trained_run: Path, tmp_path: Path, monkeypatch
) -> None:
    """Every entry is moved aside before anything is deleted; one that will not move puts the others back."""
    run_dir, elsewhere = linked_run(trained_run, tmp_path)
    before, outside = entries(run_dir), snapshot(elsewhere)
    rename = Path.rename

    def refuse_metrics(self: Path, target: Path) -> Path:
        if self.name == "metrics.jsonl":
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse_metrics)
    code, err = run(capsys, "train", "--config", "smoke", *FAST_TRAIN, "--set", f"output_dir={tmp_path}", "--force")
    assert code == 1 and err.strip() == (
        f"error: could not clear {run_dir / 'metrics.jsonl'}: Permission denied; '{run_dir}' is unchanged"
    )
    assert entries(run_dir) == before and snapshot(elsewhere) == outside
