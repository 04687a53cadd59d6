"""docs/results/ladder.json: one machine-readable record per reported learning run.

A record joins what a held-out backtest measured (its `metrics.json`) with what the training run cost (its
`metrics.jsonl` up to the checkpoint that was evaluated):

    {"level": "planted_edge" | "btc" | "tool_gated" | "multi_decision" | "vol_target", "variant": str, "model": str,
     "heldout_decisions": int, "direction_accuracy": float (0-1), "return_pct": float,
     "warmstart_direction_accuracy": float, "warmstart_return_pct": float, "oracle_return_pct": float | null,
     "buy_and_hold_return_pct": float, "info_call_rate": float | null, "warmstart_info_call_rate": float | null,
     "signal_call_rate": float | null, "warmstart_signal_call_rate": float | null,
     "forced_hold_rate": float | null, "warmstart_forced_hold_rate": float | null,
     "direction_accuracy_by_decision": [float, ...] | null, "mandate_penalty": float | null,
     "warmstart_mandate_penalty": float | null, "vol_target_rule_penalty": float | null,
     "best_constant_penalty": float | null, "vol_forecast_penalty": float | null,
     "realised_volatility_pct": float | null, "size_volatility_correlation": float | null,
     "target_volatility_pct": float | null, "seed": int | null, "updates": int, "train_minutes": float,
     "command": str}

`info_call_rate` is the share of held-out decisions whose trade followed an information call (the report's
`Info Calls [%]` as a fraction; null where the report has none); `signal_call_rate` the share that called the
informative tool (`get_changes`; reports list every tool offered, 0 % included; null where it is not offered).
`forced_hold_rate` is the share of decisions that ended without a valid order (counted wrong in the accuracy:
where RL mostly repairs the format, this is where the accuracy moves). `direction_accuracy_by_decision` holds the
accuracy at decision 1, 2, ... of the report's windows where they have several decisions. `seed` tells apart the
seeds of one variant (null: one run). The mandate's fields (the volatility-target rung, level `vol_target`) hold
the report's `Mandate Penalty` of the agent, of its warm start and of the `vol_target`, `best_constant` and
`vol_forecast` baselines, the agent's realised and target volatility, and the rank correlation of its sizes
with the volatility they were held through (null for a constant size); null where the report has no mandate
(and `vol_forecast_penalty`, `size_volatility_correlation` absent from records older than those rows).

`train_minutes` adds up the rollout, scoring and optimisation seconds of every update the checkpoint has seen
(checkpoint writes and start-up excluded). A record with the same level, variant and seed as an older one
replaces it. `summarise` gives each variant's mean and spread over its seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from r1trade.env.information import SIGNAL_TOOL
from r1trade.errors import UsageError
from r1trade.outputs import write_file
from r1trade.rl.checkpoint_paths import checkpoint_step
from r1trade.rl.metrics_log import METRICS_FILE, read_records

Level = Literal["planted_edge", "btc", "tool_gated", "multi_decision", "vol_target"]
LEVELS: tuple[str, ...] = Level.__args__
PHASES = ("rollout_seconds", "score_seconds", "update_seconds")
AGENT_PREFIX = "agent ("
SIGNAL_ROW = f"Tool Calls: {SIGNAL_TOOL} [%]"
FORCED_HOLD_ROW = "Action Mix: Forced Hold [%]"
BY_DECISION_ROW = "Direction Accuracy, decision {} [%]"
SUMMARY_FIELDS = ("direction_accuracy", "signal_call_rate", "info_call_rate", "forced_hold_rate", "return_pct")
MANDATE_SUMMARY_FIELDS = ("mandate_penalty", "warmstart_mandate_penalty", "vol_target_rule_penalty",
                          "best_constant_penalty", "vol_forecast_penalty", "realised_volatility_pct",
                          "size_volatility_correlation", "return_pct")
MANDATE_BASELINES = {"vol_target_rule_penalty": "vol_target", "best_constant_penalty": "best_constant",
                     "vol_forecast_penalty": "vol_forecast"}


def summary_fields(level: str) -> tuple[str, ...]:
    """The fields `summarise` spreads for `level`: the mandate's on the volatility-target rung."""
    return MANDATE_SUMMARY_FIELDS if level == "vol_target" else SUMMARY_FIELDS


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
    seed: int | None = None,
) -> dict[str, Any]:
    """The record for the agent `agent` (default: the report's only `agent (...)` row) beside `warmstart`."""
    metrics = report_dir / "metrics.json"
    strategies, count = _report(metrics)
    if agent is None:
        agents = [name for name in strategies if name.startswith(AGENT_PREFIX)]
        if len(agents) != 1:
            raise UsageError(f"{report_dir}/metrics.json has {len(agents)} agent rows: name one with --agent")
        agent = agents[0]
    rows = {role: _row(strategies, name, report_dir) for role, name in
            (("agent", agent), ("warm start", warmstart), ("buy and hold", "buy_and_hold"))}
    for name in (agent, warmstart, "buy_and_hold", "oracle"):
        _check_numbers(strategies.get(name, {}), name, metrics)
    oracle = strategies.get("oracle")
    updates, seconds = training_cost(checkpoint)
    return {
        "level": level,
        "variant": variant,
        "model": model,
        "heldout_decisions": count,
        "direction_accuracy": _fraction(_needed(rows["agent"], "Direction Accuracy [%]", agent, metrics)),
        "return_pct": _needed(rows["agent"], "Return [%]", agent, metrics),
        "warmstart_direction_accuracy": _fraction(
            _needed(rows["warm start"], "Direction Accuracy [%]", warmstart, metrics)
        ),
        "warmstart_return_pct": _needed(rows["warm start"], "Return [%]", warmstart, metrics),
        "oracle_return_pct": None if oracle is None else _needed(oracle, "Return [%]", "oracle", metrics),
        "buy_and_hold_return_pct": _needed(rows["buy and hold"], "Return [%]", "buy_and_hold", metrics),
        "info_call_rate": _fraction(rows["agent"].get("Info Calls [%]")),
        "warmstart_info_call_rate": _fraction(rows["warm start"].get("Info Calls [%]")),
        "signal_call_rate": _fraction(rows["agent"].get(SIGNAL_ROW)),
        "warmstart_signal_call_rate": _fraction(rows["warm start"].get(SIGNAL_ROW)),
        "forced_hold_rate": _fraction(rows["agent"].get(FORCED_HOLD_ROW)),
        "warmstart_forced_hold_rate": _fraction(rows["warm start"].get(FORCED_HOLD_ROW)),
        "direction_accuracy_by_decision": _by_decision(rows["agent"]),
        "mandate_penalty": rows["agent"].get("Mandate Penalty"),
        "warmstart_mandate_penalty": rows["warm start"].get("Mandate Penalty"),
        **{field: strategies.get(name, {}).get("Mandate Penalty") for field, name in MANDATE_BASELINES.items()},
        "realised_volatility_pct": rows["agent"].get("Realised Volatility [%]"),
        "size_volatility_correlation": rows["agent"].get("Size-Volatility Rank Correlation"),
        "target_volatility_pct": rows["agent"].get("Target Volatility [%]"),
        "seed": seed,
        "updates": updates,
        "train_minutes": round(seconds / 60, 1),
        "command": command,
    }


def training_cost(checkpoint: Path) -> tuple[int, float]:
    """(updates, seconds of rollout + scoring + optimisation) of the run up to `checkpoint` (`.../step-N`)."""
    updates = checkpoint_step(checkpoint)
    if updates is None:
        raise UsageError(f"'{checkpoint}' is not a checkpoint directory (runs/<name>/checkpoints/step-N)")
    log = checkpoint.parent.parent / METRICS_FILE
    if not log.is_file():
        raise UsageError(f"no training log at {log}")
    seen: dict[int, float] = {}  # a resumed run may log an update twice: its last line counts
    for record in read_records(log):
        update, spent = record["update"], [record.get(phase, 0.0) for phase in PHASES]
        if not (_is_number(update) and float(update).is_integer() and all(map(_is_finite, spent))):
            raise UsageError(f"{log}: the record of update {str(update)[:20]} holds an update or a time in seconds "
                             "that is not a number")
        seen[int(update)] = sum(float(s) for s in spent)
    missing = [u for u in range(1, updates + 1) if u not in seen]
    if missing:
        raise UsageError(f"{log} lacks updates {missing[:5]} of the {updates} that {checkpoint} has seen")
    return updates, sum(seen[u] for u in range(1, updates + 1))


def add_record(path: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Append `record` to the list in `path` (created if missing), replacing one with its level, variant and seed."""
    records = read_ladder(path) if path.exists() else []
    records = [r for r in records if _key(r) != _key(record)]
    records.append(record)
    write_file(path, json.dumps(records, indent=1) + "\n")
    return records


def read_ladder(path: Path) -> list[dict[str, Any]]:
    """The records in `path`; a file that is not a list of objects, each with a text `variant`, is a one-line error."""
    records = _read_json(path)
    if not isinstance(records, list):
        raise UsageError(f"{path} is not a JSON list of ladder records")
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("variant"), str):
            raise UsageError(f"{path}: record {index + 1} is not a ladder record (an object with a text 'variant')")
    return records


def summarise(records: list[dict[str, Any]], *, level: str, prefix: str = "") -> list[dict[str, Any]]:
    """One row per variant of `level` whose name starts with `prefix`, in first-seen order: its seeds and, for each
    of `summary_fields(level)`, the mean, the sample standard deviation (0 for one seed) and the range over the
    seeds."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record.get("level") == level and record.get("variant", "").startswith(prefix):
            groups.setdefault(record["variant"], []).append(record)
    rows = []
    for variant, runs in groups.items():
        seeds = sorted(r["seed"] for r in runs if r.get("seed") is not None)
        row: dict[str, Any] = {"variant": variant, "seeds": seeds}
        for field in summary_fields(level):
            values = [r[field] for r in runs if r.get(field) is not None]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise UsageError(f"the '{variant}' records hold a '{field}' that is not a number")
            row[field] = _spread([float(v) for v in values])
        rows.append(row)
    return rows


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


def _key(record: dict[str, Any]) -> tuple:
    return record.get("level"), record.get("variant"), record.get("seed")


def _by_decision(row: dict) -> list[float] | None:
    shares = []
    while (share := row.get(BY_DECISION_ROW.format(len(shares) + 1))) is not None:
        shares.append(share / 100)
    return shares if len(shares) > 1 else None


def _row(strategies: dict[str, dict], name: str, report_dir: Path) -> dict:
    if name not in strategies:
        raise UsageError(f"{report_dir}/metrics.json has no row '{name}' (rows: {', '.join(strategies)})")
    return strategies[name]


def _report(metrics: Path) -> tuple[dict[str, dict], int]:
    """A backtest report's rows by strategy and its held-out decision count; anything else is a one-line error."""
    document = _read_json(metrics)
    if not isinstance(document, dict):
        raise UsageError(f"{metrics} is not a backtest report's metrics: a JSON {type(document).__name__}, not an "
                         "object")
    strategies = document.get("strategies")
    if not isinstance(strategies, dict) or not all(isinstance(row, dict) for row in strategies.values()):
        raise UsageError(f"{metrics} has no 'strategies' object of rows: is it a backtest report's metrics?")
    decisions = document.get("decisions")
    count = decisions.get("count") if isinstance(decisions, dict) else None
    if type(count) is not int or count < 0:
        raise UsageError(f"{metrics} has no 'decisions' count: is it a backtest report's metrics?")
    return strategies, count


def _check_numbers(row: dict, name: str, metrics: Path) -> None:
    """The row's figures a record reads are numbers (or null where a figure may be missing)."""
    for key, value in row.items():
        if key.endswith("[%]") and value is not None and not _is_number(value):
            raise UsageError(f"{metrics}: row '{name}' holds a '{key}' that is not a number: {str(value)[:40]!r}")


def _needed(row: dict, key: str, name: str, metrics: Path) -> float | None:
    """A figure every backtest row has (null where it does not apply, as buy-and-hold's accuracy)."""
    if key not in row:
        raise UsageError(f"{metrics}: row '{name}' has no '{key}'")
    return row[key]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _fraction(percent: float | None) -> float | None:
    return None if percent is None else percent / 100


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not valid JSON: it is not UTF-8 text (a binary file?)") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON: {error}") from None
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
