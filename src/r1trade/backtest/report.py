"""Backtest reports for any mix of strategies (rule baselines, the trained agent): the files, written together.

`write_report` writes, into one directory: `metrics.json` (every strategy's metrics, the splits, the costs:
`report_json`), `trades.csv` (all round trips, a `strategy` column first), `equity.csv` (one column per strategy),
`hits.csv` (per scored decision, whether each strategy's direction was right: what paired comparisons of runs
on the same decisions resample, `r1trade compare-seeds`), `equity.png` (equity curves and a drawdown panel),
`report.html` (`report_html`), `metrics.md` (the metrics as a Markdown table, `report_text`, which also draws
the terminal's tables) and the resolved `config.yaml`. What the runs are and what they were measured on is
`report_runs`.

On a span shorter than `backtest.min_annualise_days`, CAGR, Sortino and Calmar are NaN (null in JSON, "—" in
tables); `ReportContext.annualisation_note` says why, in metrics.json, metrics.md, the HTML page and the
terminal.

`Direction Accuracy [%]` scores every strategy on the same decision bars (`ReportContext.decision_bars`, the
models' decisions when models run); `Action Entropy [nats]` is a model's only, "—" (null) for rule baselines.
metrics.json's `decisions` and the HTML page's notes (`ReportContext.decision_note`) define both.

Each strategy's 95 % intervals (`StrategyRun.ci95`, `r1trade.backtest.uncertainty`), a model's comparison with
buy-and-hold and its verdict (`StrategyRun.vs_buy_and_hold`) and its deflated Sharpe ratio are shown as rows
below the metrics and stored beside them in metrics.json; `uncertainty_note` says how they were computed.
The verdicts that count every trial (`r1trade.backtest.verdicts`: each run's probabilistic Sharpe ratio and
minimum track record, the SPA and StepM tests against the benchmarks) follow in a "Verdicts" section
(`verdict_runs`, `superiority_lines`, `verdicts_note`) and in metrics.json (`psr`, `min_track_record` per
strategy; `spa` per benchmark).
A walk-forward backtest (`FoldReport`) shows the pooled runs first and then each fold's.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.dates as mdates
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from r1trade.backtest.metrics import drawdown
from r1trade.backtest.report_html import render_html
from r1trade.backtest.report_json import metrics_document
from r1trade.backtest.report_runs import FoldReport, ReportContext, StrategyRun, format_value, has_intervals
from r1trade.backtest.report_text import (
    markdown_table,
    period_text,
    uncertainty_note,
    verdict_lines,
    verdicts_markdown,
)
from r1trade.outputs import write_folder

HITS_FILE = "hits.csv"
"""Per scored decision, each strategy's hit: what paired comparisons of runs on the same decisions resample."""


def write_report(
    runs: list[StrategyRun], context: ReportContext, out_dir: Path, folds: Sequence[FoldReport] = ()
) -> list[Path]:
    """Write every report file into a fresh folder that replaces `out_dir` as a whole; return their paths.

    With `folds` (walk-forward), `runs` are the pooled runs and `context` spans the folds."""
    png = equity_png(runs, context)
    notes = [context.annualisation_note] if context.too_short_to_annualise else []
    notes += [*verdict_lines(runs), *([uncertainty_note(runs, context)] if has_intervals(runs) else [])]
    notes += [context.mandate_note] if context.mandate_note else []
    markdown = markdown_table(runs, note="\n\n".join(notes) or None) + verdicts_markdown(runs, context)
    for fold in folds:
        markdown += f"\n## Fold {fold.number}: {period_text(fold.context.candles)}\n\n" + markdown_table(
            fold.runs, note="\n\n".join(verdict_lines(fold.runs)) or None
        )
    files: dict[str, str | bytes] = {
        "metrics.json": json.dumps(metrics_document(runs, context, folds), indent=2) + "\n",
        "trades.csv": trades_frame(runs).to_csv(index=False),
        "equity.csv": equity_frame(runs).to_csv(),
        HITS_FILE: hits_frame(runs, context).to_csv(),
        "equity.png": png,
        "report.html": render_html(runs, context, png, folds),
        "metrics.md": markdown,
        "config.yaml": context.config.to_yaml(),
    }
    return write_folder(out_dir, files)


def trades_frame(runs: list[StrategyRun]) -> pd.DataFrame:
    """All runs' trades in one table, `strategy` first; a column a run lacks stays empty for its rows."""
    frames = [_nullable_integers(run.trades).assign(strategy=run.name) for run in runs]
    columns = ["strategy", *dict.fromkeys(c for frame in frames for c in frame.columns if c != "strategy")]
    filled = [frame for frame in frames if not frame.empty]
    if not filled:
        return pd.DataFrame(columns=columns)
    return pd.concat(filled, ignore_index=True).reindex(columns=columns)


def _nullable_integers(trades: pd.DataFrame) -> pd.DataFrame:
    """Integer columns as pandas' nullable Int64, so rows of other runs that lack them stay integers."""
    integers = [c for c in trades.columns if pd.api.types.is_integer_dtype(trades[c])]
    return trades.astype(dict.fromkeys(integers, "Int64"))


def equity_frame(runs: list[StrategyRun]) -> pd.DataFrame:
    """Equity per bar, one column per strategy, aligned on time."""
    return pd.concat({run.name: run.equity for run in runs}, axis=1)


def hits_frame(runs: list[StrategyRun], context: ReportContext) -> pd.DataFrame:
    """Per scored decision (indexed by its bar's time), one column per strategy scored there: 1 if its direction
    was right, 0 if not (the random baseline: the share of its seeds that were right)."""
    times = context.candles.index[context.decision_bars]
    scored = {run.name: run.hits for run in runs if run.hits is not None and len(run.hits) == len(times)}
    return pd.DataFrame(scored, index=pd.Index(times, name="timestamp"), dtype=float)


def equity_png(runs: list[StrategyRun], context: ReportContext) -> bytes:
    """Equity curves of all runs (log scale when they span more than 3×) above a drawdown panel, as PNG."""
    figure = Figure(figsize=(11, 7), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for run in runs:
        equity = run.equity.dropna()
        times = equity.index.tz_convert("UTC").tz_localize(None)
        change = run.metrics.get("Return [%]", math.nan)
        top.plot(times, equity.to_numpy(), linewidth=1.3, label=f"{run.name} ({format_value('', change)} %)")
        bottom.plot(times, 100.0 * drawdown(equity).to_numpy(), linewidth=1.0)
    top.axhline(context.config.env.initial_cash, color="0.45", linewidth=0.8, linestyle="--")
    values = equity_frame(runs).to_numpy(dtype=float)
    if np.nanmin(values) > 0 and np.nanmax(values) / np.nanmin(values) > 3:
        top.set_yscale("log")
        top.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        top.yaxis.set_minor_formatter(NullFormatter())
    top.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    candles = context.candles
    top.set_title(
        f"{candles.attrs.get('symbol', '')} {candles.attrs.get('timeframe', '')} · {context.split} split · "
        f"fee {context.config.env.fee_bps:g} bps, slippage {context.config.env.slippage_bps:g} bps",
        loc="left",
    )
    top.set_ylabel(f"equity [{context.quote_currency}]")
    top.legend(loc="upper left", fontsize="small")
    bottom.set_ylabel("drawdown [%]")
    bottom.set_xlabel("time (UTC)")
    locator = mdates.AutoDateLocator()
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    for axis in (top, bottom):
        axis.grid(True, which="major", alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
