"""`r1trade paper-report`: a paper run's journal as a backtest report, beside buy-and-hold on its candles.

The journal is the record: each episode's turns (with the env's step records: orders, fills) and the equity of
every bar are read back as the backtest's windows are, and `model_run` turns them into the same metrics,
trades and turn statistics a backtest reports. Buy-and-hold trades the same bars with the same costs.
A skipped decision (a gap, with `--on-gap skip`) is a flat stretch of the account; a decision taken but not
settled yet (its bars have not all closed) is left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from r1trade.backtest.metrics import SECONDS_PER_YEAR
from r1trade.backtest.model_runs import WindowPlan, WindowPlay, model_run
from r1trade.backtest.report import write_report
from r1trade.backtest.report_runs import ReportContext, StrategyRun
from r1trade.backtest.runner import run_baseline
from r1trade.config import Config
from r1trade.data.splits import Splits
from r1trade.data.store import timeframe_to_timedelta
from r1trade.errors import UsageError
from r1trade.outputs import check_report_folder
from r1trade.paper.journal import SKIPPED, Journal

PAPER = "paper"


@dataclass(frozen=True)
class JournalCandles(Splits):
    """The journal's candles as the one split a paper report evaluates, named `paper`."""

    paper: pd.DataFrame = field(default_factory=pd.DataFrame)

    def get(self, name: str) -> pd.DataFrame:
        if name != PAPER:
            raise UsageError(f"a paper report has one split, '{PAPER}', not '{name}'")
        return self.paper

    def describe(self) -> dict[str, dict[str, str | int | None]]:
        index = self.paper.index
        return {PAPER: {"rows": len(index), "start": index[0].isoformat(), "end": index[-1].isoformat()}}


@dataclass(frozen=True)
class PaperReport:
    """What `paper_report` wrote: the agent's run and buy-and-hold, what they were measured on, the files."""

    runs: list[StrategyRun]
    context: ReportContext
    files: list[Path]


def paper_report(journal_path: Path, out_dir: Path, *, force: bool = False) -> PaperReport:
    """Write the report of the journal at `journal_path` into `out_dir` (over a previous report: `force`)."""
    check_report_folder(out_dir, force=force)
    with Journal.read(journal_path) as journal:
        config = _journal_config(journal)
        candles = _candles(journal)
        plays, plan = _plays(journal, candles, config)
        note = _note(journal, plan)
    context = ReportContext(
        config=config,
        splits=JournalCandles(*(candles.iloc[:0] for _ in range(3)), paper=candles),
        split=PAPER,
        bars_per_year=SECONDS_PER_YEAR / timeframe_to_timedelta(candles.attrs["timeframe"]).total_seconds(),
    )
    agent = model_run("paper agent", plays, context, plan, note=note)
    context = replace(context, first_bar=plan.first_bar, last_bar=plan.last_bar)
    runs = [agent, run_baseline("buy_and_hold", context)]
    return PaperReport(runs=runs, context=context, files=write_report(runs, context, out_dir))


def _journal_config(journal: Journal) -> Config:
    """The checkpoint's config kept in the journal, its data pointing at the journal itself."""
    try:
        config = Config.model_validate(journal.meta["config"])
    except ValidationError:
        raise UsageError(f"journal '{journal.path}' holds a config this r1trade cannot read") from None
    every = journal.meta["identity"]["decision_every"]
    if config.env.decision_every != every:
        raise UsageError(
            f"journal '{journal.path}' is damaged: meta row config: env.decision_every is "
            f"{config.env.decision_every}, but the run's identity decides every {every} bars"
        )
    data = config.data.model_copy(update={"source": "file", "path": str(journal.path)})
    return config.model_copy(update={"data": data})


def _candles(journal: Journal) -> pd.DataFrame:
    """The journal's candles as canonical candles (the symbol, timeframe and source of the run)."""
    identity = journal.meta["identity"]
    rows = journal.rows("SELECT ts, open, high, low, close, volume FROM candles ORDER BY position")
    frame = pd.DataFrame(rows, columns=["ts", "open", "high", "low", "close", "volume"])
    frame.index = pd.DatetimeIndex(pd.to_datetime(frame.pop("ts"), unit="ms", utc=True), name="timestamp")
    frame.attrs.update(symbol=identity["symbol"], timeframe=identity["timeframe"],
                       source=f"paper journal ({identity['source']})")
    return frame


def _plays(journal: Journal, candles: pd.DataFrame, config: Config) -> tuple[list[WindowPlay], WindowPlan]:
    """The settled decisions as the backtest's windows: one per episode, a flat one per skipped decision."""
    every, initial = config.env.decision_every, config.env.initial_cash
    turns: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    query = "SELECT decision_ts, text, info FROM turns ORDER BY decision_ts, turn"
    for ts, text, info in journal.rows(query):
        turns.setdefault(ts, []).append((text, json.loads(info)))
    marks: dict[int, dict[int, float]] = {}
    for position, episode, window_equity in journal.rows(
        "SELECT position, episode, window_equity FROM equity WHERE episode IS NOT NULL ORDER BY position"
    ):
        marks.setdefault(episode, {})[position] = window_equity
    plays: list[tuple[int, list[float], list]] = []  # (start, equity per bar from start, turns)
    counts: list[int] = []
    for ts, position, episode, step, status in journal.rows(
        "SELECT ts, position, episode, step, status FROM decisions ORDER BY ts"
    ):
        if status == SKIPPED:
            plays.append((position, [initial] * (every + 1), []))
            counts.append(0)
        elif step == 0:
            bars = marks.get(episode, {})
            plays.append((position, [initial, *(bars[bar] for bar in sorted(bars))], list(turns.get(ts, []))))
            counts.append(1)
        else:
            plays[-1][2].extend(turns.get(ts, []))
            counts[-1] += 1
    while counts and counts[-1] == 0:  # nothing was decided after the last skipped decisions
        plays.pop()
        counts.pop()
    if not counts:
        raise UsageError(f"journal '{journal.path}' holds no settled decision yet: nothing to report")
    index = candles.index
    windows = [
        WindowPlay(start, pd.Series(values, index=index[start : start + len(values)], name="equity"), taken)
        for start, values, taken in plays
    ]
    plan = WindowPlan(starts=tuple(start for start, *_ in plays), decisions=tuple(counts), every=every,
                      available=sum(counts))
    return windows, plan


def _note(journal: Journal, plan: WindowPlan) -> str:
    """How the paper run was played, for the report."""
    identity, options, counts = journal.meta["identity"], journal.meta["options"], journal.event_counts()
    skipped = journal.decision_count(SKIPPED)
    faults = ", ".join(f"{counts.get(kind, 0)} {kind}" for kind in ("gap", "late", "revised", "retry"))
    return (
        f"paper trading from journal {journal.path} (checkpoint {identity['checkpoint']}, candles from "
        f"{identity['source']}): {plan.total} settled decisions, one every {plan.every} bars, greedy "
        "decoding, played as the backtest plays its windows: each episode of env.episode_decisions decisions "
        "starts flat with the initial cash and is seeded seed + its number; a position open at an episode's "
        "end is marked at that close without exit costs and dropped; the equity compounds the episodes. "
        f"{skipped} decisions skipped over gaps (--on-gap {options['on_gap']}); events: {faults}."
    )
