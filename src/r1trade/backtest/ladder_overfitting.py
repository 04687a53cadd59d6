"""`r1trade overfitting`: the probability of backtest overfitting (`r1trade.backtest.overfitting`) over the
runs the ladder (docs/results/ladder.json) records on one level, i.e. one market.

Ladder records keep only summary figures (returns, accuracies, rates), not the per-decision returns CSCV needs.
Those are read back from the report folder each record's backtest command wrote (its `--out`, relative to the
directory the command runs in): the agent row's equity curve in `equity.csv`, cut at the decisions that
`metrics.json` describes (for a walk-forward report, each fold's, the pooled curve being the folds chained),
less the risk-free rate, exactly as the report's intervals cut them. Every run must have been evaluated on the
same decisions, so that the returns line up as a (decisions, runs) matrix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from r1trade.backtest.bootstrap import decision_sample
from r1trade.backtest.metrics import per_bar_rate
from r1trade.backtest.overfitting import DEFAULT_BLOCKS, Overfitting, backtest_overfitting
from r1trade.errors import UsageError
from r1trade.eval.ladder import AGENT_PREFIX, read_ladder

_OUT = re.compile(r"(?<!\S)(?:--out|-o)(?:=|\s+)(\S+)")
"""The report folder option of a backtest command."""
SHOWN_MISSING = 3
"""Records named in the error when report folders are missing."""


@dataclass(frozen=True)
class ReportReturns:
    """The per-decision excess returns of a report's row, and the decisions they were measured on."""

    row: str
    returns: np.ndarray
    """(D,) per-decision excess returns."""
    decisions: tuple
    """What identifies the decisions: the period, the decision cadence and each fold's first decision and
    count; runs compare only when these are equal."""


@dataclass(frozen=True)
class LadderRun:
    """One ladder record's run: its variant, seed, report folder and per-decision returns."""

    variant: str
    seed: int | None
    report: Path
    returns: ReportReturns


@dataclass(frozen=True)
class LadderOverfitting:
    """The PBO of a level's runs (the trials, in ladder order) and the runs themselves."""

    level: str
    runs: list[LadderRun]
    overfitting: Overfitting


def report_folder(command: str) -> Path | None:
    """The `--out` folder of the last `r1trade backtest` in a record's command (commands are `;`-separated)."""
    backtests = [part for part in command.split(";") if "r1trade backtest" in part]
    found = _OUT.findall(backtests[-1]) if backtests else []
    return Path(found[-1]) if found else None


def report_returns(folder: Path, row: str | None = None) -> ReportReturns:
    """The per-decision excess returns of the report's `row` (default: its only agent row), from its
    metrics.json and equity.csv."""
    try:
        document = json.loads((folder / "metrics.json").read_text())
        if row is None:
            agents = [name for name in document["strategies"] if name.startswith(AGENT_PREFIX)]
            if len(agents) != 1:
                raise UsageError(f"{folder}/metrics.json has {len(agents)} agent rows: PBO needs one per report")
            row = agents[0]
        equity = pd.read_csv(folder / "equity.csv", index_col=0)[row].to_numpy(dtype=float)
        return _cut(row, equity, document)
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise UsageError(f"{folder}: not a backtest report whose returns can be read ({exc!r})") from None


def _cut(row: str, equity: np.ndarray, document: dict[str, Any]) -> ReportReturns:
    """Cut the (pooled) equity curve at each piece's decisions: the report's one evaluation, or its folds,
    fold k + 1 starting on fold k's last bar (the pooled curve drops each later fold's flat first bar)."""
    rate, every = float(document["risk_free_rate"]), int(document["decisions"]["every"])
    rf_per_bar = per_bar_rate(rate, float(document["bars_per_year"])) if rate else 0.0
    pieces = document.get("folds") or [{
        "first_bar": document["evaluated_bars"]["first"], "bars": document["period"]["bars"],
        "decisions": document["decisions"],
    }]
    returns, start = [], 0
    for piece in pieces:
        bars, count = int(piece["bars"]), int(piece["decisions"]["count"])
        first = int(piece["decisions"]["first_bar"]) - int(piece["first_bar"])
        curve = equity[start:start + bars]  # (bars,)
        if len(curve) != bars or count < 1:
            raise ValueError("equity.csv does not hold the bars and decisions metrics.json describes")
        sample = decision_sample(curve, first + every * np.arange(count), np.zeros(count), rf_per_bar=rf_per_bar)
        returns.append(sample.excess_returns(rf_per_bar))
        start += bars - 1
    if start + 1 != len(equity):
        raise ValueError("equity.csv does not hold the bars metrics.json describes")
    grid = tuple((piece["decisions"]["first_bar"], piece["decisions"]["count"]) for piece in pieces)
    period = document["period"]
    return ReportReturns(row, np.concatenate(returns), (period["start"], period["end"], every, grid))


def ladder_overfitting(
    ladder: Path, level: str, *, prefix: str = "", blocks: int = DEFAULT_BLOCKS
) -> LadderOverfitting:
    """PBO over the `level` records of `ladder` whose variant starts with `prefix`, from their reports."""
    records = [r for r in read_ladder(ladder) if r.get("level") == level and r["variant"].startswith(prefix)]
    if len(records) < 2:
        raise UsageError(
            f"{ladder} has {len(records)} {level} record{'s' if len(records) != 1 else ''} whose variant starts "
            f"with '{prefix}': PBO compares 2 or more runs"
        )
    found, missing = [], []
    for record in records:
        folder = report_folder(str(record.get("command", "")))
        if folder is None or not (folder / "equity.csv").is_file() or not (folder / "metrics.json").is_file():
            missing.append(_missing(record, folder))
            continue
        found.append(LadderRun(record["variant"], record.get("seed"), folder, report_returns(folder)))
    if missing:
        shown = "; ".join(missing[:SHOWN_MISSING]) + (" …" if len(missing) > SHOWN_MISSING else "")
        raise UsageError(
            f"{len(missing)} of the {len(records)} {level} records lack per-decision returns: ladder records hold "
            f"only summary figures, so each run's returns are read from the report folder its backtest command "
            f"names (--out, with metrics.json and equity.csv): {shown}"
        )
    _check_same_decisions(found)
    matrix = np.column_stack([run.returns.returns for run in found])  # (D, N)
    try:
        return LadderOverfitting(level, found, backtest_overfitting(matrix, blocks=blocks))
    except ValueError as exc:
        raise UsageError(f"--blocks {blocks}: {exc}") from None


def _missing(record: dict[str, Any], folder: Path | None) -> str:
    """A missing report, for the error: the record's variant (and seed) and what is missing."""
    variant = str(record["variant"])
    name = (variant[:40] + "…" if len(variant) > 40 else variant) + (
        f" (seed {record['seed']})" if record.get("seed") is not None else ""
    )
    if folder is None:
        return f"'{name}': its command names no --out folder"
    lacking = [f for f in ("metrics.json", "equity.csv") if not (folder / f).is_file()]
    return f"'{name}': {folder} has no {' or '.join(lacking)}"


def _check_same_decisions(runs: Sequence[LadderRun]) -> None:
    """Refuse runs measured on different decisions: their returns would not line up."""
    first = runs[0]
    for run in runs[1:]:
        if run.returns.decisions != first.returns.decisions:
            raise UsageError(
                f"{first.report} and {run.report} were evaluated on different decisions "
                f"({len(first.returns.returns)} and {len(run.returns.returns)}, or other bars): PBO compares runs "
                "on the same decisions; pick them with --prefix"
            )
