"""Where a run's checkpoints are: `runs/<name>/checkpoints/step-N/`, complete once its training state is written.

Kept apart from `r1trade.rl.checkpoint`, which reads and writes them with torch, so that commands which only list
or choose checkpoints (select-step, seeds, reports) find them without importing torch.
"""

from __future__ import annotations

from pathlib import Path

STATE_FILE = "trainer_state.json"
"""Written last into a checkpoint: a folder without it is not a complete checkpoint."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step}"


def checkpoint_step(path: Path) -> int | None:
    """N for a directory named `step-N`, else None."""
    number = path.name.removeprefix("step-")
    return int(number) if path.name.startswith("step-") and number.isdigit() else None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of `run_dir` as (step, directory), by step."""
    return sorted(
        (step, path) for path in (run_dir / "checkpoints").glob("step-*")
        if (step := checkpoint_step(path)) is not None and (path / STATE_FILE).is_file()
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in `run_dir`, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None
