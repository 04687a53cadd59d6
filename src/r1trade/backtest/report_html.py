"""report.html: the report as one self-contained page (inline CSS, the chart embedded as base64, no scripts);
every piece of text from data is escaped."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from r1trade import __version__
from r1trade.backtest.report_json import POOLED_NOTE
from r1trade.backtest.report_runs import FoldReport, ReportContext, StrategyRun, format_value, has_intervals
from r1trade.backtest.report_text import (
    best_strategies,
    period_text,
    row_names,
    superiority_lines,
    uncertainty_note,
    verdict_lines,
    verdict_runs,
    verdicts_note,
)
from r1trade.data.source import describe_source

MAX_HTML_TRADES = 500
"""Trades listed per strategy in the HTML page; trades.csv always has them all."""


_DIRECTIONS = {1: "long", -1: "short"}


_TRADE_HEADERS = {
    "entry_time": "Entry", "exit_time": "Exit", "entry_bar": "Entry Bar", "exit_bar": "Exit Bar",
    "direction": "Side", "units": "Units", "entry_price": "Entry Price", "exit_price": "Exit Price",
    "fees": "Fees", "pnl": "PnL", "return_pct": "Return [%]", "is_open": "Open", "seed": "Seed",
    "window": "Window", "exit_reason": "Exit Reason", "reasoning": "Reasoning",
}


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #dde1e8; }
table { border-collapse: collapse; margin: .6rem 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #dde1e8; padding: .25rem .6rem; vertical-align: top; }
th { background: #f3f5f8; text-align: left; } td.num { text-align: right; white-space: nowrap; }
td.best { font-weight: 700; color: #11723a; background: #eaf7ef; }
td.reasoning { white-space: pre-wrap; max-width: 40rem; font-size: .9em; }
table.facts th { width: 11rem; } .note { color: #5a6475; font-size: .92em; } .verdict { font-size: 1.05em; }
img { max-width: 100%; border: 1px solid #dde1e8; } .scroll { max-height: 32rem; overflow: auto; }
footer { margin-top: 2rem; color: #8a93a3; font-size: .85em; }
"""


def render_html(
    runs: list[StrategyRun], context: ReportContext, png: bytes, folds: Sequence[FoldReport] = ()
) -> str:
    """The report as one self-contained HTML page; every piece of text from data is escaped."""
    title = f"Backtest · {context.config.name} · {context.split} split"
    if folds:
        title += f" · walk-forward, {len(folds)} folds"
    image = base64.b64encode(png).decode("ascii")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        (
            f'<p class="note">{_e(", ".join(run.name for run in runs))} on {len(context.candles):,} bars, '
            f"{_e(period_text(context.candles))}</p>"
        ),
        _facts_table(context),
        "<h2>Metrics</h2>" if not folds else f"<h2>Metrics, pooled over {len(folds)} folds</h2>",
        *(f'<p class="verdict"><b>{_e(line)}</b></p>' for line in verdict_lines(runs)),
        _metrics_table(runs),
        *([f'<p class="note"><b>Intervals</b>: {_e(uncertainty_note(runs, context))}</p>']
          if has_intervals(runs) else []),
        *([f'<p class="note"><b>Walk-forward</b>: {_e(POOLED_NOTE)}</p>'] if folds else []),
        f'<p class="note"><b>Annualisation</b>: {_e(context.annualisation_note)}</p>',
        f'<p class="note"><b>Decisions</b>: {_e(context.decision_note)}</p>',
        *([f'<p class="note"><b>Mandate</b>: {_e(context.mandate_note)}</p>']
          if context.mandate_note else []),
        *(f'<p class="note"><b>{_e(run.name)}</b>: {_e(run.note)}</p>' for run in runs if run.note),
        *_verdicts_section(runs, context),
        *(_fold_section(fold) for fold in folds),
        "<h2>Equity and drawdown</h2>",
        f'<img alt="equity curves and drawdowns" src="data:image/png;base64,{image}">',
        "<h2>Trades</h2>",
        *(_trades_section(run) for run in runs),
        "<h2>Splits</h2>",
        _splits_table(context),
        f"<footer>r1trade {_e(__version__)} · generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC</footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _e(text: Any) -> str:
    """Text escaped for HTML content and attributes."""
    return html.escape(str(text), quote=True)


def _table(header: list[str], rows: list[str], css_class: str = "") -> str:
    """A table from escaped header texts and ready-made `<tr>` rows."""
    head = "".join(f"<th>{_e(text)}</th>" for text in header)
    opening = f'<table class="{css_class}">' if css_class else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _facts_table(context: ReportContext) -> str:
    config, candles, env = context.config, context.candles, context.config.env
    attrs = candles.attrs
    facts = [
        ("Data", f"{describe_source(config)} · {attrs.get('symbol')} · {attrs.get('timeframe')} bars"),
        ("Source", str(attrs.get("source"))),
        ("Split", _split_fact(context)),
        ("Embargo", f"{config.data.split.embargo_bars} bars dropped between consecutive splits"),
        ("Period", period_text(candles)),
        ("Costs", f"fee {env.fee_bps:g} bps of notional per fill; slippage {env.slippage_bps:g} bps"),
        ("Fills", "a decision at a bar's close fills at the next bar's open"),
        ("Initial cash", f"{env.initial_cash:,.2f} {context.quote_currency}"),
        ("Annualisation", f"{context.bars_per_year:,.0f} bars per 365-day year"),
        ("Risk-free rate", f"{100 * config.backtest.risk_free_rate:g} % per year"),
    ]
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{_e(value)}</td></tr>" for name, value in facts)
    return f'<table class="facts">{rows}</table>'


def _split_fact(context: ReportContext) -> str:
    """The split's size and, when only part of it is evaluated, which bars (positions in the split)."""
    total = len(context.split_candles)
    where = f"{context.split} split" if context.span is None else "the bars after the train split and embargo"
    text = f"{where} of config {context.config.name}: {total:,} bars"
    if not context.is_partial:
        return text
    bars = len(context.candles)
    last = context.first_bar + bars - 1
    return f"{text}; evaluated: bars {context.first_bar:,}–{last:,} ({bars:,} bars, see the notes)"


def _metrics_table(runs: list[StrategyRun]) -> str:
    best = best_strategies(runs)
    rows = []
    for row in row_names(runs):
        cells = "".join(
            f'<td class="num{" best" if run.name in best.get(row, ()) else ""}">'
            f"{_e(format_value(row, run.table_rows.get(row)))}</td>"
            for run in runs
        )
        rows.append(f"<tr><th>{_e(row)}</th>{cells}</tr>")
    return _table(["Metric", *(run.name for run in runs)], rows, "metrics")


def _verdicts_section(runs: list[StrategyRun], context: ReportContext) -> list[str]:
    """The Verdicts heading, SPA lines, table and note; nothing when no run has decisions to judge."""
    shown = verdict_runs(runs)
    if not shown:
        return []
    return [
        "<h2>Verdicts</h2>",
        *(f'<p class="verdict">{_e(line)}</p>' for line in superiority_lines(runs)),
        _metrics_table(shown),
        f'<p class="note"><b>Verdicts</b>: {_e(verdicts_note(runs, context))}</p>',
    ]


def _fold_section(fold: FoldReport) -> str:
    """A walk-forward fold: its period, verdicts and metrics table."""
    context = fold.context
    lines = "".join(f'<p class="verdict">{_e(line)}</p>' for line in verdict_lines(fold.runs))
    return (
        f"<h2>Fold {fold.number}</h2>"
        f'<p class="note">{len(context.candles):,} bars (bars {context.first_bar:,}–'
        f"{context.first_bar + len(context.candles) - 1:,} of the evaluated span), "
        f"{_e(period_text(context.candles))}; {len(context.decision_bars):,} decisions</p>"
        f"{lines}{_metrics_table(fold.runs)}"
    )


def _trades_section(run: StrategyRun) -> str:
    trades = run.trades
    heading = f"<h3>{_e(run.name)} · {len(trades):,} trade{'s' if len(trades) != 1 else ''}</h3>"
    if trades.empty:
        return heading + '<p class="note">No trades.</p>'
    shown = trades.head(MAX_HTML_TRADES)
    more = (
        f'<p class="note">The first {MAX_HTML_TRADES:,} of {len(trades):,}; trades.csv lists them all.</p>'
        if len(trades) > MAX_HTML_TRADES else ""
    )
    rows = [
        "<tr>" + "".join(_trade_cell(c, v) for c, v in zip(shown.columns, record, strict=True)) + "</tr>"
        for record in shown.itertuples(index=False, name=None)
    ]
    header = [_TRADE_HEADERS.get(column, column) for column in shown.columns]
    return f'{heading}{more}<div class="scroll">{_table(header, rows, "trades")}</div>'


def _trade_cell(column: str, value: Any) -> str:
    """One trades-table cell: long/short for the direction, prices with two decimals, units with six."""
    if column == "reasoning":
        return f'<td class="reasoning">{_e("" if pd.isna(value) else value)}</td>'
    if value is None or value is pd.NaT or (np.isscalar(value) and pd.isna(value)):
        return "<td></td>"
    if isinstance(value, (bool, np.bool_)):
        return f"<td>{'yes' if value else 'no'}</td>"
    if column == "direction":
        return f"<td>{_e(_DIRECTIONS.get(int(value), value))}</td>"
    if isinstance(value, pd.Timestamp):
        return f"<td>{value:%Y-%m-%d %H:%M}</td>"
    if isinstance(value, (int, np.integer)):
        return f'<td class="num">{int(value)}</td>'
    if isinstance(value, (float, np.floating)):
        return f'<td class="num">{value:,.{6 if column == "units" else 2}f}</td>'
    return f"<td>{_e(value)}</td>"


def _splits_table(context: ReportContext) -> str:
    rows = [
        f"<tr><th>{_e(name)}{' (evaluated)' if name == context.split else ''}</th>"
        f'<td class="num">{info["rows"]:,}</td><td>{_e(info["start"] or "—")}</td>'
        f'<td>{_e(info["end"] or "—")}</td></tr>'
        for name, info in context.splits.describe().items()
    ]
    return _table(["Split", "Bars", "Start", "End"], rows)
