"""Writing reports and runs safely: whole folders renamed into place, nothing written over what is not ours.

Every output path is resolved first (`resolve_output`: `..` and symbolic links followed), so the checks look at
the folder or file that will really be written. A report folder is written under a temporary name and replaces the
old one as a whole, so it never mixes two runs' files and a full disk leaves the previous report as it was. A file
is written to a temporary file in its folder, flushed to disk and renamed over the old one. A run folder is locked
while a run writes to it, so two runs never interleave their logs or checkpoints.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from r1trade.errors import OutputError, UsageError

REPORT_FILES = frozenset(
    {"metrics.json", "metrics.md", "trades.csv", "equity.csv", "hits.csv", "equity.png", "report.html", "config.yaml"}
)
"""Everything a backtest report folder holds: a folder of only these may be replaced with --force."""
TRAINING_MARKERS = ("checkpoints", "metrics.jsonl", "trainer_state.json", "policy", "critic", "model")
"""Entries that make a folder a run, a checkpoint or a warm start: reports never go there."""
RUN_ARTEFACTS = ("checkpoints", "metrics.jsonl", "splits.json", "config.yaml", "tensorboard",
                 "selected_step.json", "selecting_step.json")
"""What `r1trade train` writes into a run folder (and `--force` clears), beside plots, probes and fold runs; and
what `r1trade select-step` measured of its checkpoints, which a new run's checkpoints would not match."""
FOLD_RUN = re.compile(r"fold-[1-9][0-9]*")
"""The folder name of a walk-forward run's fold agent (`fold_run_dir`)."""
LOCK_FILE = ".lock"
CLEARING = ".clearing-"
"""Prefix of the hidden folder `clear_run_folder` moves an earlier run into before deleting it."""


def resolve_output(path: Path) -> Path:
    """`path` as the operating system will write it: absolute, `~` expanded, every `..` and symbolic link
    followed (`PARENT/missing/..` is PARENT; a link is the file or folder it points to)."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of symbolic links
        raise UsageError(f"cannot resolve the output path '{path}': {exc}".splitlines()[0]) from None


def _named(given: Path, resolved: Path) -> str:
    """`'given'`, and what it resolves to when that is another path, for messages."""
    return f"'{given}'" if Path(given).absolute() == resolved else f"'{given}' (that is '{resolved}')"


def check_report_folder(out_dir: Path, *, force: bool) -> Path:
    """Refuse to write a report over a run, a checkpoint, a file, foreign files, or (without --force) a report;
    returns the folder resolved (`resolve_output`), which is what was checked."""
    resolved = resolve_output(out_dir)
    named = _named(out_dir, resolved)
    if resolved.parent == resolved:
        raise UsageError(f"--out {named} is the root of the file system: give a folder for the report")
    if not resolved.exists():
        return resolved
    if not resolved.is_dir():
        raise UsageError(f"--out {named} is a file: give a folder for the report")
    entries = sorted(path.name for path in resolved.iterdir())
    trained = [name for name in TRAINING_MARKERS if name in entries]
    if trained:
        raise UsageError(
            f"--out {named} is a run, checkpoint or model folder (it holds {trained[0]}): "
            "write the report to another folder"
        )
    foreign = [name for name in entries if name not in REPORT_FILES]
    if foreign:
        raise UsageError(
            f"--out {named} holds files that are not a report ({', '.join(foreign[:3])}): choose another folder"
        )
    if entries and not force:
        raise UsageError(f"--out {named} holds a previous report: pass --force to replace it")
    return resolved


def check_output_file(out: Path, *, force: bool) -> Path:
    """Refuse to write a file over a folder, or (without --force) over an existing file; returns the path
    resolved (`resolve_output`), which is what was checked and is to be written."""
    resolved = resolve_output(out)
    named = _named(out, resolved)
    if resolved.is_dir():
        raise UsageError(f"--out {named} is a folder: give a file name")
    if resolved.exists() and not force:
        raise UsageError(f"--out {named} exists: pass --force to replace it")
    return resolved


def write_folder(final: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write `files` (name → content) into a new folder that then replaces `final` (resolved first) as a whole.

    On any failure the partial folder is removed and `final` is left as it was; the error names the file."""
    given, final = final, resolve_output(final)
    if final.parent == final:
        raise OutputError(f"will not replace '{given}': it is the root of the file system")
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir()
        for name, content in files.items():
            try:
                _write(temporary / name, content)
                _flush(temporary / name)
            except OSError as exc:
                reason = _reason(exc)
                raise OutputError(f"could not write {given / name}: {reason}; '{given}' is unchanged") from None
        replace_folder(temporary, final)
        _flush_folder(final.parent)
    except OSError as exc:
        raise OutputError(f"could not write {given}: {_reason(exc)}") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return [given / name for name in files]


def write_file(path: Path, content: str | bytes) -> Path:
    """Write one file under a temporary name and rename it into place: readers see the old or the new file."""
    return write_through(path, lambda temporary: _write(temporary, content))


def write_through(
    path: Path, write: Callable[[Path], None], *, check: Callable[[Path], None] | None = None
) -> Path:
    """Call `write(temporary)` for a temporary file beside `path` (resolved first; it keeps the suffix), flush it
    to disk, call `check(temporary)` if given (it raises to refuse the file), then rename it over `path`. On any
    failure `path` is untouched and the error names it. For writers that take a path (Parquet, matplotlib)."""
    given, path = path, resolve_output(path)
    temporary = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(temporary)
        _flush(temporary)
        if check is not None:
            check(temporary)
        os.replace(temporary, path)
        _flush_folder(path.parent)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"could not write {given}: {_reason(exc)}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return given


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
    """Remove what an earlier run wrote into `run_dir` (its artefacts, plots, probes and fold runs), nothing else,
    and all of it or none of it.

    Everything is checked, then moved into one hidden folder inside the run (renames within one folder) before
    anything is deleted: a refusal or a failed move puts back what had moved and leaves the run as it was. A
    symbolic link among them (`checkpoints` pointing at another disk, say) is removed as a link: what it points to,
    in the run or outside it, is never deleted."""
    run_dir = resolve_output(run_dir)
    ours = sorted(path for path in run_dir.iterdir() if _run_artefact(path))
    for path in ours:
        _check_removable(path)
    aside = run_dir / f"{CLEARING}{os.getpid()}"
    moved: list[Path] = []
    try:
        aside.mkdir()
        for path in ours:
            path.rename(aside / path.name)
            moved.append(path)
    except OSError as exc:
        for path in reversed(moved):
            with suppress(OSError):
                (aside / path.name).rename(path)
        with suppress(OSError):
            aside.rmdir()
        failed = exc.filename or aside
        raise OutputError(f"could not clear {failed}: {_reason(exc)}; '{run_dir}' is unchanged") from None
    try:
        shutil.rmtree(aside)
    except OSError as exc:
        raise OutputError(
            f"could not delete {exc.filename or aside}: {_reason(exc)}; the earlier run was moved out of the way "
            f"into '{aside}'"
        ) from None


def _run_artefact(path: Path) -> bool:
    """Whether `path` is something `r1trade train` wrote into a run folder (what `--force` clears)."""
    ours = path.name in RUN_ARTEFACTS or path.suffix == ".png" or path.name.startswith("probe-")
    return ours or _is_fold_run(path)


def _check_removable(path: Path) -> None:
    """Refuse, before anything is deleted, a folder inside `path` whose entries could not be deleted."""
    if path.is_symlink() or not path.is_dir():
        return
    for folder, _, _ in os.walk(path):  # symbolic links to folders are not followed
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputError(
                f"cannot clear '{folder}': no permission to delete what it holds; nothing was deleted"
            )


def has_run(run_dir: Path) -> bool:
    """True when `run_dir` holds an earlier run's metrics or checkpoints (a dangling link to them included), or a
    walk-forward run's fold runs."""
    earlier = os.path.lexists(run_dir / "metrics.jsonl") or os.path.lexists(run_dir / "checkpoints")
    return earlier or (run_dir.is_dir() and any(_is_fold_run(path) for path in run_dir.iterdir()))


def _is_fold_run(path: Path) -> bool:
    return path.is_dir() and FOLD_RUN.fullmatch(path.name) is not None


def _write(path: Path, content: str | bytes) -> None:
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)


def _flush(path: Path) -> None:
    """Push a written file's bytes to the disk, so a crash after the rename never leaves an empty file."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _flush_folder(folder: Path) -> None:
    """Push a rename to the disk; some file systems refuse to sync a folder, and the rename is done either way."""
    with suppress(OSError):
        _flush(folder)


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
