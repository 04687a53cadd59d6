"""A report in words and tables: the Rich tables of the terminal, the Markdown of metrics.md, the verdict lines
and the notes that say how the intervals and verdicts were computed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from rich.markup import escape
from rich.table import Table

from r1trade.backtest.report_runs import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    MANDATE_ROWS,
    FoldReport,
    ReportContext,
    StrategyRun,
    format_value,
)
from r1trade.backtest.superiority import RETURN_LOSS


def verdict_lines(runs: Sequence[StrategyRun]) -> list[str]:
    """A line per model compared with buy-and-hold: does it beat it at 95 %, on which metric, by how much."""
    lines = []
    for run in runs:
        if run.vs_buy_and_hold is None:
            continue
        versus = run.vs_buy_and_hold
        metric = versus["verdict_on"]
        low, high = versus[metric]
        verb = {
            "better": "beats buy-and-hold", "worse": "does worse than buy-and-hold",
            "undecided": "neither beats nor trails buy-and-hold",
        }[versus["verdict"]]
        lines.append(
            f"{run.name} {verb} at 95 %: its {metric} minus buy-and-hold's is "
            f"{versus['difference'][metric]:+,.2f} (95 % interval {low:+,.2f} to {high:+,.2f})."
        )
    return lines


def uncertainty_note(runs: Sequence[StrategyRun], context: ReportContext) -> str:
    """How the intervals, the verdicts and the deflated Sharpe ratios were computed."""
    settings = context.config.backtest
    text = (
        "95 % CI: percentile intervals of a stationary block bootstrap (Politis & Romano 1994) over the "
        f"scored decisions: blocks of consecutive decisions of mean length {settings.bootstrap_block}, "
        f"{settings.bootstrap_resamples:,} resamples, seed {context.config.seed}; each decision carries the "
        "bar returns up to the next decision. A model's differences with buy_and_hold resample both on the "
        "same decisions; its verdict is better (worse) when the interval of the Return [%] difference lies "
        "above (below) 0, else undecided."
    )
    deflated = [run.deflated_sharpe for run in runs if run.deflated_sharpe is not None]
    if deflated:
        text += (
            f" Deflated Sharpe Ratio (Bailey & López de Prado 2014; {deflated[0].trials} trials): the "
            "probability that the per-decision Sharpe ratio beats the expected best of that many skill-less "
            "trials, given the returns' skewness and kurtosis; above 0.95 it is significant at 95 %."
        )
    return text


def verdict_runs(runs: Sequence[StrategyRun]) -> list[StrategyRun]:
    """The runs with a track record, their rows replaced by the Verdicts section's (for the tables'
    renderers): decisions, per-decision Sharpe ratio, PSR, minimum track record and, per benchmark, StepM's
    finding."""
    tests = [run.superiority for run in runs if run.superiority is not None]
    shown = []
    for run in runs:
        psr, record = run.psr, run.min_track_record
        if psr is None or record is None:
            continue
        rows: dict[str, Any] = {
            "Decisions": f"{psr.observations:,}",
            "Sharpe per Decision": _three_decimals(psr.sharpe),
            "PSR (Sharpe > 0)": _three_decimals(psr.probability),
            "Min. Track Record [decisions]": _whole_text(record.periods),
            "Min. Track Record [years]": record.years,
        }
        for test in tests:
            rows[f"StepM vs {test.benchmark} ({100 * test.size:g} %)"] = (
                "benchmark" if run.name == test.benchmark else "better" if run.name in test.superior
                else "tied" if run.name in test.tied else "not shown better"
            )
        shown.append(StrategyRun(name=run.name, equity=run.equity, trades=run.trades, metrics=rows))
    return shown


def superiority_lines(runs: Sequence[StrategyRun]) -> list[str]:
    """A line per benchmark: SPA's p-value over every other run, and the runs StepM finds better."""
    lines = []
    for test in (run.superiority for run in runs if run.superiority is not None):
        level = f"{100 * (1 - test.size):g} %"
        found = "the best of them beats it" if test.pvalue < test.size else "none is shown to beat it"
        better = ", ".join(test.superior) or "none"
        tied = f" ({', '.join(test.tied)}: the benchmark's losses, left out)" if test.tied else ""
        count = f"{len(test.candidates)} run{'s' if len(test.candidates) > 1 else ''}"
        on = "" if test.loss == RETURN_LOSS else f", on {test.loss}"
        lines.append(
            f"SPA against {test.benchmark} over {count}{tied}{on}: p = {test.pvalue:.3f}, {found} at {level} "
            f"once all are counted; StepM finds better: {better}."
        )
    return lines


def verdicts_note(runs: Sequence[StrategyRun], context: ReportContext) -> str:
    """How the Verdicts section's figures were computed, and the trials the deflated Sharpe ratios count."""
    settings = context.config.backtest
    records = [run.min_track_record for run in runs if run.min_track_record is not None]
    tests = [run.superiority for run in runs if run.superiority is not None]
    confidence = f"{100 * records[0].confidence:g} %" if records else "95 %"
    size = f"{100 * tests[0].size:g} %" if tests else "5 %"
    text = (
        "Per-decision excess returns (a decision's return over its bars less the risk-free rate). PSR "
        "(Bailey & López de Prado 2012): the probability that the true per-decision Sharpe ratio exceeds 0, "
        "given the returns' skewness and kurtosis. Min. Track Record: the decisions needed for the PSR to "
        f"reach {confidence} (∞ when the Sharpe ratio is not above 0), and the years they span in a market "
        "open 24/7 at the run's mean bars per decision; the record is long enough when Decisions reaches it. "
        "SPA (Hansen 2005) and "
        "StepM (Romano & Wolf 2005), from the arch package: every other run against the benchmark on "
        "per-decision losses (minus the excess return), stationary bootstrap of mean block "
        f"{settings.bootstrap_block} decisions, {settings.bootstrap_resamples:,} resamples, seed "
        f"{context.config.seed}; SPA's p-value accounts for the best run having been picked after the fact, "
        f"StepM names the runs better than the benchmark at {size} family-wise error."
    )
    other = sorted({f"against {test.benchmark}, {test.loss}" for test in tests if test.loss != RETURN_LOSS})
    if other:
        text += f" Losses otherwise: {'; '.join(other)}."
    deflated = [run.deflated_sharpe for run in runs if run.deflated_sharpe is not None]
    if deflated:
        source = f": {deflated[0].trials_source}" if deflated[0].trials_source else ""
        text += f" Deflated Sharpe Ratio: {deflated[0].trials} trials{source}."
    return text


def verdicts_markdown(runs: Sequence[StrategyRun], context: ReportContext) -> str:
    """The Verdicts section of metrics.md ("" when no run has decisions to judge)."""
    shown = verdict_runs(runs)
    if not shown:
        return ""
    note = "\n\n".join([*superiority_lines(runs), verdicts_note(runs, context)])
    return "\n## Verdicts\n\n" + markdown_table(shown, note=note)


def best_strategies(runs: list[StrategyRun]) -> dict[str, set[str]]:
    """For each row where "best" means something, the strategies holding the best value (ties share it).

    Rows with fewer than two comparable (non-NaN) values get no winner.
    """
    best: dict[str, set[str]] = {}
    for row in HIGHER_IS_BETTER | LOWER_IS_BETTER:
        values = {run.name: float(run.rows[row]) for run in runs if _is_number(run.rows.get(row))}
        if len(values) < 2:
            continue
        target = max(values.values()) if row in HIGHER_IS_BETTER else min(values.values())
        best[row] = {name for name, value in values.items() if value == target}
    return best


def row_names(runs: list[StrategyRun]) -> list[str]:
    """Every row tables show (`StrategyRun.table_rows`), in order of first appearance."""
    return list(dict.fromkeys(name for run in runs for name in run.table_rows))


def comparison_tables(runs: list[StrategyRun], *, title: str, width: int | None = None) -> list[Table]:
    """Metrics × strategies as Rich tables, the best value of each comparable row in bold green.

    With a `width`, the strategies are split over several tables of whole columns so that each fits it
    (a terminal of 80 columns would otherwise squeeze every number onto several lines); the first keeps the title.
    """
    best = best_strategies(runs)
    rows = row_names(runs)
    texts = {run.name: [escape(format_value(row, run.table_rows.get(row))) for row in rows] for run in runs}

    def column_width(run: StrategyRun) -> int:
        longest_word = max((len(word) for word in run.name.split()), default=1)
        return max(longest_word, *(len(text) for text in texts[run.name]))

    metric_width = max(len(row) for row in rows)
    groups: list[list[StrategyRun]] = [[]]
    used = 1 + metric_width + 3  # left border, then each column: its text, two padding spaces and a border
    for run in runs:
        need = column_width(run) + 3
        if width is not None and groups[-1] and used + need > width:
            groups.append([])
            used = 1 + metric_width + 3
        groups[-1].append(run)
        used += need

    tables = []
    for number, group in enumerate(groups):
        table = Table(title=title if number == 0 else None, title_justify="left")
        table.add_column("Metric", style="bold", no_wrap=True)
        for run in group:
            table.add_column(escape(run.name), justify="right", min_width=column_width(run))
        for i, row in enumerate(rows):
            cells = []
            for run in group:
                text = texts[run.name][i]
                cells.append(f"[bold green]{text}[/bold green]" if run.name in best.get(row, ()) else text)
            table.add_row(escape(row), *cells)
        tables.append(table)
    return tables


FOLD_ROWS = ("Return [%]", "Sharpe Ratio", "Max. Drawdown [%]", "Direction Accuracy [%]")
"""The metrics `fold_tables` show for each fold, beside the intervals and verdicts (and a mandate's rows)."""


def fold_tables(folds: Sequence[FoldReport], *, width: int | None = None) -> list[Table]:
    """A walk-forward backtest's folds at a glance: per fold, the key metrics with their intervals and
    verdicts (`comparison_tables`, so they fit `width` too)."""
    tables = []
    for fold in folds:
        shown = (*FOLD_ROWS, *MANDATE_ROWS)
        runs = [
            replace(run, metrics={row: run.metrics[row] for row in shown if row in run.metrics}, extra={},
                    deflated_sharpe=None)
            for run in fold.runs
        ]
        title = f"Fold {fold.number} · {period_text(fold.context.candles)} · {len(fold.context.candles):,} bars"
        tables += comparison_tables(runs, title=title, width=width)
    return tables


def markdown_table(runs: list[StrategyRun], *, note: str | None = None) -> str:
    """Metrics × strategies as a GitHub-flavoured Markdown table (for pasting into docs), best values in bold.

    A `note` (e.g. why some annualised rows are "—") follows the table as a paragraph.
    """
    best = best_strategies(runs)

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "| Metric | " + " | ".join(cell(run.name) for run in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    for row in row_names(runs):
        cells = []
        for run in runs:
            text = cell(format_value(row, run.table_rows.get(row)))
            cells.append(f"**{text}**" if run.name in best.get(row, ()) else text)
        lines.append(f"| {cell(row)} | " + " | ".join(cells) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def period_text(candles: pd.DataFrame) -> str:
    return f"{format_value('', candles.index[0])} → {format_value('', candles.index[-1])} UTC"


def _three_decimals(value: float) -> str:
    """A small ratio or probability, where two decimals would hide it: "—" when undefined."""
    return "—" if math.isnan(value) else f"{value:.3f}"


def _whole_text(count: float) -> str:
    """A count that may be fractional, rounded up: "—" when undefined, "∞" when infinite."""
    if math.isnan(count):
        return "—"
    return "∞" if math.isinf(count) else f"{math.ceil(count):,}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not math.isnan(float(value))
