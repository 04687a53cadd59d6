"""docs/results/ladder.json: one machine-readable record per reported learning run.

A record joins what a held-out backtest measured (its `metrics.json`) with what the training run cost (its
`metrics.jsonl` up to the checkpoint that was evaluated):

    {"level": "planted_edge" | "btc" | "tool_gated" | "multi_decision", "variant": str, "model": str,
     "heldout_decisions": int, "direction_accuracy": float (0-1), "return_pct": float,
     "warmstart_direction_accuracy": float, "warmstart_return_pct": float, "oracle_return_pct": float | null,
     "buy_and_hold_return_pct": float, "info_call_rate": float | null, "warmstart_info_call_rate": float | null,
     "updates": int, "train_minutes": float, "command": str}

`info_call_rate` is the share of held-out decisions whose trade followed an information call (the report's
`Info Calls [%]` as a fraction; null where the report has none).

`train_minutes` adds up the rollout, scoring and optimisation seconds of every update the checkpoint has seen
(checkpoint writes and start-up excluded). A record with the same level and variant as an older one replaces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from r1trade.errors import UsageError
from r1trade.outputs import write_file
from r1trade.rl.metrics_log import METRICS_FILE, read_records

Level = Literal["planted_edge", "btc", "tool_gated", "multi_decision"]
LEVELS: tuple[str, ...] = Level.__args__
PHASES = ("rollout_seconds", "score_seconds", "update_seconds")
AGENT_PREFIX = "agent ("


def ladder_record(
    report_dir: Path,
    checkpoint: Path,
    *,
    level: Level,
    variant: str,
    model: str,
    command: str,
    agent: str | None = None,
    warmstart: str = "base model",
) -> dict[str, Any]:
    """The record for the agent `agent` (default: the report's only `agent (...)` row) beside `warmstart`."""
    document = _read_json(report_dir / "metrics.json")
    strategies: dict[str, dict] = document.get("strategies", {})
    if agent is None:
        agents = [name for name in strategies if name.startswith(AGENT_PREFIX)]
        if len(agents) != 1:
            raise UsageError(f"{report_dir}/metrics.json has {len(agents)} agent rows: name one with --agent")
        agent = agents[0]
    rows = {role: _row(strategies, name, report_dir) for role, name in
            (("agent", agent), ("warm start", warmstart), ("buy and hold", "buy_and_hold"))}
    oracle = strategies.get("oracle")
    updates, seconds = training_cost(checkpoint)
    return {
        "level": level,
        "variant": variant,
        "model": model,
        "heldout_decisions": int(document["decisions"]["count"]),
        "direction_accuracy": _fraction(rows["agent"]["Direction Accuracy [%]"]),
        "return_pct": rows["agent"]["Return [%]"],
        "warmstart_direction_accuracy": _fraction(rows["warm start"]["Direction Accuracy [%]"]),
        "warmstart_return_pct": rows["warm start"]["Return [%]"],
        "oracle_return_pct": None if oracle is None else oracle["Return [%]"],
        "buy_and_hold_return_pct": rows["buy and hold"]["Return [%]"],
        "info_call_rate": _fraction(rows["agent"].get("Info Calls [%]")),
        "warmstart_info_call_rate": _fraction(rows["warm start"].get("Info Calls [%]")),
        "updates": updates,
        "train_minutes": round(seconds / 60, 1),
        "command": command,
    }


def training_cost(checkpoint: Path) -> tuple[int, float]:
    """(updates, seconds of rollout + scoring + optimisation) of the run up to `checkpoint` (`.../step-N`)."""
    from r1trade.rl.checkpoint import checkpoint_step

    updates = checkpoint_step(checkpoint)
    if updates is None:
        raise UsageError(f"'{checkpoint}' is not a checkpoint directory (runs/<name>/checkpoints/step-N)")
    log = checkpoint.parent.parent / METRICS_FILE
    if not log.is_file():
        raise UsageError(f"no training log at {log}")
    seen: dict[int, float] = {}  # a resumed run may log an update twice: its last line counts
    for record in read_records(log):
        seen[int(record["update"])] = sum(float(record.get(phase, 0.0)) for phase in PHASES)
    missing = [u for u in range(1, updates + 1) if u not in seen]
    if missing:
        raise UsageError(f"{log} lacks updates {missing[:5]} of the {updates} that {checkpoint} has seen")
    return updates, sum(seen[u] for u in range(1, updates + 1))


def add_record(path: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Append `record` to the list in `path` (created if missing), replacing one with its level and variant."""
    records = _read_json(path) if path.exists() else []
    if not isinstance(records, list):
        raise UsageError(f"{path} is not a JSON list of ladder records")
    records = [r for r in records if (r.get("level"), r.get("variant")) != (record["level"], record["variant"])]
    records.append(record)
    write_file(path, json.dumps(records, indent=1) + "\n")
    return records


def _row(strategies: dict[str, dict], name: str, report_dir: Path) -> dict:
    if name not in strategies:
        raise UsageError(f"{report_dir}/metrics.json has no row '{name}' (rows: {', '.join(strategies)})")
    return strategies[name]


def _fraction(percent: float | None) -> float | None:
    return None if percent is None else percent / 100


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON: {error}") from None
