"""A run's per-update log, `metrics.jsonl`: one JSON record per update, appended as training goes.

A process killed while it appends leaves a last line cut short; readers skip any line that is not a record, with
a warning, so the updates before it still count.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from r1trade.outputs import write_file

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def read_records(path: Path) -> list[dict]:
    """The records of a metrics log, in order; lines that are not a record with an `update` number are skipped."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("update"), int | float):
            records.append(record)
        else:
            log.warning("%s line %d is not a metrics record: skipped", path, number)
    return records


def truncate_records(path: Path, step: int) -> None:
    """Drop log records of updates after `step` (they were not checkpointed and will be redone), and any line a
    crash cut short."""
    if path.exists():
        kept = [record for record in read_records(path) if record["update"] <= step]
        write_file(path, "".join(json.dumps(record) + "\n" for record in kept))
