"""Writing reports and runs safely: whole folders renamed into place, nothing written over what is not ours.

A report folder is written under a temporary name and replaces the old one as a whole, so it never mixes two
runs' files and a full disk leaves the previous report as it was. A run folder is locked while a run writes to it,
so two runs never interleave their logs or checkpoints.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from r1trade.errors import OutputError, UsageError

REPORT_FILES = frozenset(
    {"metrics.json", "metrics.md", "trades.csv", "equity.csv", "equity.png", "report.html", "config.yaml"}
)
"""Everything a backtest report folder holds: a folder of only these may be replaced with --force."""
TRAINING_MARKERS = ("checkpoints", "metrics.jsonl", "trainer_state.json", "policy", "critic", "model")
"""Entries that make a folder a run, a checkpoint or a warm start: reports never go there."""
RUN_ARTEFACTS = ("checkpoints", "metrics.jsonl", "splits.json", "config.yaml", "tensorboard")
"""What `r1trade train` writes into a run folder (and `--force` clears), beside plots, probes and fold runs."""
FOLD_RUN = re.compile(r"fold-[1-9][0-9]*")
"""The folder name of a walk-forward run's fold agent (`fold_run_dir`)."""
LOCK_FILE = ".lock"


def check_report_folder(out_dir: Path, *, force: bool) -> None:
    """Refuse to write a report over a run, a checkpoint, a file, foreign files, or (without --force) a report."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"--out '{out_dir}' is a file: give a folder for the report")
    entries = sorted(path.name for path in out_dir.iterdir())
    trained = [name for name in TRAINING_MARKERS if name in entries]
    if trained:
        raise UsageError(
            f"--out '{out_dir}' is a run, checkpoint or model folder (it holds {trained[0]}): "
            "write the report to another folder"
        )
    foreign = [name for name in entries if name not in REPORT_FILES]
    if foreign:
        raise UsageError(
            f"--out '{out_dir}' holds files that are not a report ({', '.join(foreign[:3])}): choose another folder"
        )
    if entries and not force:
        raise UsageError(f"--out '{out_dir}' holds a previous report: pass --force to replace it")


def write_folder(final: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write `files` (name → content) into a new folder that then replaces `final` as a whole.

    On any failure the partial folder is removed and `final` is left as it was; the error names the file."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir()
        for name, content in files.items():
            try:
                _write(temporary / name, content)
            except OSError as exc:
                raise OutputError(f"could not write {final / name}: {_reason(exc)}; '{final}' is unchanged") from None
        replace_folder(temporary, final)
    except OSError as exc:
        raise OutputError(f"could not write {final}: {_reason(exc)}") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return [final / name for name in files]


def write_file(path: Path, content: str | bytes) -> Path:
    """Write one file under a temporary name and rename it into place: readers see the old or the new file."""
    return write_through(path, lambda temporary: _write(temporary, content))


def write_through(path: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(temporary)`, then rename the temporary file over `path`; on failure `path` is untouched and the
    error names it. For writers that take a path (Parquet, matplotlib)."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(temporary)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"could not write {path}: {_reason(exc)}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def append_line(path: Path, line: str) -> None:
    """Append one line to a log, naming the file if the disk refuses it."""
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError as exc:
        raise OutputError(f"could not append to {path}: {_reason(exc)}") from None


@contextmanager
def locked_run_folder(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on `run_dir` (created if needed) while a run writes to it.

    The lock is the operating system's (flock), so it is released when the process ends, even by kill -9."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = (run_dir / LOCK_FILE).open("a")
    except OSError as exc:
        raise OutputError(f"cannot use run folder '{run_dir}': {_reason(exc)}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"run folder '{run_dir}' is in use by another r1trade process: wait for it") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fold_run_dir(run_dir: Path, number: int) -> Path:
    """Where a walk-forward run (`train.walk_forward`) keeps the agent of fold `number` (from 1), a run itself."""
    return run_dir / f"fold-{number}"


def clear_run_folder(run_dir: Path) -> None:
    """Remove what an earlier run wrote into `run_dir` (its artefacts, plots, probes and fold runs), nothing else."""
    for path in run_dir.iterdir():
        ours = path.name in RUN_ARTEFACTS or path.suffix == ".png" or path.name.startswith("probe-")
        if ours or _is_fold_run(path):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def has_run(run_dir: Path) -> bool:
    """True when `run_dir` holds an earlier run's metrics or checkpoints, or a walk-forward run's fold runs."""
    earlier = (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()
    return earlier or (run_dir.is_dir() and any(_is_fold_run(path) for path in run_dir.iterdir()))


def _is_fold_run(path: Path) -> bool:
    return path.is_dir() and FOLD_RUN.fullmatch(path.name) is not None


def _write(path: Path, content: str | bytes) -> None:
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)


def replace_folder(temporary: Path, final: Path) -> None:
    """Rename `temporary` to `final`; an existing `final` moves aside first and is deleted after."""
    if not final.exists():
        temporary.rename(final)
        return
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    final.rename(old)
    temporary.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
