"""Paper trading: the agent on newly closed candles with simulated fills, and the report of its journal."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from r1trade.cli.app import app, console, print_wrote


@app.command()
def paper(
    checkpoint: Annotated[
        Path, typer.Option(help="checkpoint directory of a trained agent (runs/<name>/checkpoints/step-N)")
    ],
    journal: Annotated[Path, typer.Option(help="the run's SQLite journal: created, or resumed")],
    exchange: Annotated[
        str | None, typer.Option(help="ccxt exchange id to poll for closed candles, e.g. binance")
    ] = None,
    symbol: Annotated[str | None, typer.Option(help="market symbol, e.g. BTC/USDT")] = None,
    timeframe: Annotated[str | None, typer.Option(help="bar length, e.g. 1h")] = None,
    replay: Annotated[
        Path | None, typer.Option(help="a candle file played as live candles instead of an exchange")
    ] = None,
    speed: Annotated[
        float | None,
        typer.Option(help="with --replay: play at this many times real time, waiting at most a day between "
                          "candles (default: at once)"),
    ] = None,
    max_decisions: Annotated[
        int | None, typer.Option(min=1, help="stop once the journal holds this many settled decisions")
    ] = None,
    decision_every: Annotated[
        int | None, typer.Option(min=1, help="bars between decisions: the checkpoint's env.decision_every")
    ] = None,
    on_gap: Annotated[
        str, typer.Option(help="missing candles before a decision: tell (the agent is told) or skip it")
    ] = "tell",
    poll_seconds: Annotated[
        float, typer.Option(help="with --exchange: seconds between polls while a candle is late (1 to 3600)")
    ] = 10.0,
    allow_timeframe_change: Annotated[
        bool,
        typer.Option(
            "--allow-timeframe-change",
            help="trade candles of another bar length than the checkpoint trained on (refused without it)",
        ),
    ] = False,
) -> None:
    """Paper (dry-run) trading: the agent trades newly closed candles with simulated fills, into a journal.

    No real order is ever sent: no API key is read and no order endpoint is called. The env fills orders as in
    a backtest (next open, fees, slippage); a restart with the same journal resumes where the run stopped."""
    from r1trade.data.source import checkpoint_timeframes, refuse_timeframe_change
    from r1trade.paper.feed import open_feed
    from r1trade.paper.runner import paper_trade
    from r1trade.paper.view import LiveView

    trained = set() if allow_timeframe_change else checkpoint_timeframes(checkpoint)

    def feed_factory(on_retry):  # on_retry: Callable[[str], None]
        feed = open_feed(exchange=exchange, symbol=symbol, timeframe=timeframe, replay=replay, speed=speed,
                         poll_seconds=poll_seconds, on_retry=on_retry)
        refuse_timeframe_change(checkpoint, trained, feed.timeframe, f"'{replay}'" if replay else feed.source)
        return feed

    with LiveView(console) as view:
        outcome = paper_trade(checkpoint, journal, feed_factory=feed_factory, max_decisions=max_decisions,
                              decision_every=decision_every, on_gap=on_gap, view=view)
    events = outcome.events
    table = Table(title=f"paper run · {journal}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("stopped", outcome.reason)
    table.add_row("decisions", f"{outcome.decisions} settled, {outcome.skipped} skipped")
    table.add_row("equity", f"{outcome.equity:,.2f} ({outcome.return_pct:+.2f} %)")
    table.add_row(
        "candles",
        f"{events.get('gap', 0)} gaps, {events.get('late', 0)} late, {events.get('revised', 0)} revised; "
        f"{events.get('retry', 0)} network retries",
    )
    console.print(table)
    report = f"no real order was sent. Report: r1trade paper-report {journal} --out DIR"
    console.print(report, markup=False, highlight=False)


@app.command("paper-report")
def paper_report_command(
    journal: Annotated[Path, typer.Argument(help="a journal written by `r1trade paper`")],
    out: Annotated[Path, typer.Option("--out", "-o", help="report directory")],
    force: Annotated[
        bool, typer.Option("--force", help="replace a previous report in --out (never a run or other files)")
    ] = False,
) -> None:
    """A paper run's report from its journal, as a backtest's (metrics, trades, equity chart, HTML), beside
    buy-and-hold over the same candles."""
    from r1trade.backtest.report_text import comparison_tables
    from r1trade.paper.report import paper_report

    report = paper_report(journal, out, force=force)
    index = report.context.candles.index
    title = f"paper · {journal} · {index[0]:%Y-%m-%d %H:%M} → {index[-1]:%Y-%m-%d %H:%M}"
    for table in comparison_tables(report.runs, title=title, width=console.width):
        console.print(table)
    console.print(f"{report.runs[0].name}: {report.runs[0].note}", markup=False, highlight=False)
    files = ", ".join(path.name for path in report.files)
    print_wrote(f"{out}/: {files}")
