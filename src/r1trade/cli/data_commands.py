"""Commands for candles and configs: show a config, describe, import and fetch candles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from r1trade.cli.app import ConfigOption, SetOption, app, console, err_console, resolve_config
from r1trade.errors import DataError, UsageError
from r1trade.outputs import resolve_output


@app.command("show-config")
def show_config(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Print the fully resolved config as YAML."""
    resolved = resolve_config(config, set_)
    console.print(resolved.to_yaml(), end="", highlight=False, markup=False, soft_wrap=True)



@app.command("data-info")
def data_info(
    path: Annotated[
        Path | None, typer.Argument(help="candle file (.parquet or .csv); leave out to describe --config's data")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option("--config", "-c", help="describe this config's data (a file, or generated: e.g. planted_edge)"),
    ] = None,
    set_: SetOption = None,
) -> None:
    """Validate candles and print rows, range, timeframe, gaps and problems (generated data: its realised edge)."""
    from r1trade.data.source import describe_source, read_config_candles, split_edges, synthetic_interval
    from r1trade.data.store import load_candles, validate_candles
    from r1trade.data.synthetic import measure_edge

    if (path is None) == (config is None):
        raise UsageError("give a candle file or --config NAME (e.g. --config planted_edge), not both")
    resolved = None if config is None else resolve_config(config, set_)
    if resolved is None:
        candles, title = load_candles(path), str(path)
    else:
        candles = read_config_candles(resolved)
        title = resolved.data.path if resolved.data.source == "file" else describe_source(resolved)
    report = validate_candles(candles)
    table = render_report(title, candles.attrs, report)
    edge = measure_edge(candles) if resolved is not None and resolved.data.source == "synthetic" else None
    if resolved is not None and edge is not None:
        planted = resolved.data.synthetic
        table.add_row(
            "planted edge",
            f"the sign of a {synthetic_interval(resolved)}-bar interval's change repeats in the next with p = "
            f"{planted.p:g}; mean move {100 * planted.move:g} %",
        )
        table.add_row(
            "realised edge",
            f"{edge.repeat_rate:.4f} ± {edge.standard_error:.4f} over {edge.pairs:,} consecutive interval pairs",
        )
    if resolved is not None and report.ok:
        edges = split_edges(resolved, candles)
        table.add_row(
            "sign repeats",
            f"{resolved.env.decision_every}-bar intervals (0.5: none; above: momentum; below: reversal): "
            + " · ".join(
                f"{name} {edge.repeat_rate:.3f} ± {edge.standard_error:.3f} ({edge.pairs:,} pairs)"
                for name, edge in edges.items()
            ),
        )
    console.print(table)
    if not report.ok:
        raise typer.Exit(1)


def render_report(path: Path | str, attrs: dict, report) -> Table:  # report: ValidationReport
    """A Rich table for a validation report; what the file says is shown as plain text, never as markup."""
    from rich.text import Text

    table = Table(title=Text(str(path)), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("symbol", Text(str(attrs.get("symbol"))))
    table.add_row("source", Text(str(attrs.get("source"))))
    table.add_row("timeframe", Text(report.timeframe))
    table.add_row("rows", f"{report.rows:,}")
    span = f"{report.start:%Y-%m-%d %H:%M} → {report.end:%Y-%m-%d %H:%M} UTC" if report.rows else "empty"
    table.add_row("range", span)
    gaps = report.gaps
    table.add_row(
        "gaps",
        f"{gaps.count} (largest {gaps.largest_bars} bars at {gaps.largest_at}, {gaps.missing_bars} bars missing)"
        if gaps.count
        else "none",
    )
    if not report.problems:
        table.add_row("problems", "[green]none[/green]")
    for problem in report.problems:
        colour = "red" if problem.error else "yellow"
        table.add_row("error" if problem.error else "warning", f"[{colour}]{problem.describe()}[/{colour}]")
    return table


@app.command("import-csv")
def import_csv(
    source: Annotated[Path, typer.Argument(help="CSV file to convert")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output file (.parquet or .csv)")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto (detect from the header), canonical, cryptodatadownload (banner line, newest first), "
            "exchange (named columns: date/time/open_time, Open/High/..., epoch s or ms) or ccxt (headerless "
            "ts,open,high,low,close,volume rows)",
        ),
    ] = "auto",
    timeframe: Annotated[
        str | None, typer.Option(help="bar length, e.g. 1h (default: from the file, else the bar spacing)")
    ] = None,
    symbol: Annotated[
        str | None, typer.Option(help="pair, e.g. BTC/USDT (default: from the file, else UNKNOWN)")
    ] = None,
    date_format: Annotated[
        str | None,
        typer.Option(
            "--date-format",
            help="read the times with these strftime codes, e.g. '%d/%m/%Y %H:%M' (default: detected; dates such "
            "as 03/04/2024 whose order of day and month the data cannot tell are refused without it)",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="replace an existing --out file (only with candles that pass validation)")
    ] = False,
) -> None:
    """Convert a CSV of candles into the canonical schema (Parquet or CSV); the layout is detected.

    An existing --out is replaced only with --force, and only by candles that pass validation: the new file is
    written beside it, flushed and read back before it takes the old one's place."""
    from r1trade.data.csv_import import import_candle_csv
    from r1trade.data.store import check_candle_suffix, save_candles, timeframe_to_timedelta, validate_candles
    from r1trade.outputs import check_output_file

    if timeframe is not None:
        timeframe_to_timedelta(timeframe)  # a bad value is a usage error before any work
    check_candle_suffix(out)
    if resolve_output(out) == resolve_output(source):
        raise UsageError(f"--out '{out}' is the CSV being read: write the candles to another file")
    target = check_output_file(out, force=force)
    imported = import_candle_csv(source, fmt=fmt, timeframe=timeframe, symbol=symbol, date_format=date_format)
    candles = imported.candles
    report = validate_candles(candles)  # before writing, so a file that cannot be described leaves nothing
    console.print(f"read {source} as {imported.description}", markup=False, highlight=False, soft_wrap=True)
    console.print(render_report(out, candles.attrs, report))
    if not report.ok and target.exists():
        details = "; ".join(f"{problem.kind}: {problem.count:,} row(s)" for problem in report.errors)
        raise DataError(f"'{out}' was kept as it was: the imported candles fail validation ({details})")
    save_candles(candles, target)  # a temporary file, flushed, read back and renamed into place
    if not report.ok:
        console.print(
            "[red]the file was written as read; training and backtests refuse it until the source is fixed[/red]"
        )
        raise typer.Exit(1)


@app.command("fetch-data")
def fetch_data(
    exchange: Annotated[str, typer.Option(help="ccxt exchange id, e.g. binance")] = "binance",
    symbol: Annotated[str, typer.Option(help="market symbol, e.g. BTC/USDT")] = "BTC/USDT",
    timeframe: Annotated[str, typer.Option(help="bar length, e.g. 1h")] = "1h",
    since: Annotated[str, typer.Option(help="first bar (UTC date or timestamp)")] = "2024-01-01",
    until: Annotated[str | None, typer.Option(help="stop before this time (UTC); default: now")] = None,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("data"),
    max_retries: Annotated[int, typer.Option(help="retries for transient network errors")] = 5,
) -> None:
    """Download OHLCV candles with ccxt (paged, deduplicated, resumable) into a Parquet file."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from r1trade.data.fetch import default_output_path, fetch_to_file, make_exchange

    start = _timestamp(since, "--since")
    stop = _timestamp(until, "--until") if until is not None else None
    client = make_exchange(exchange)
    path = default_output_path(out, exchange_id=exchange, symbol=symbol, timeframe=timeframe)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), console=err_console, transient=True,
    ) as progress:
        task = progress.add_task(f"{exchange} {symbol} {timeframe}", total=1.0, status="")

        def update(state) -> None:  # state: FetchProgress
            status = state.retry or f"{state.rows} rows, {state.pages} pages, at {state.current:%Y-%m-%d %H:%M}"
            progress.update(task, completed=state.fraction, status=status)

        result = fetch_to_file(
            client, symbol=symbol, timeframe=timeframe, since=start, until=stop, path=path,
            progress=update, max_retries=max_retries,
        )
    console.print(f"fetched {result.rows_fetched} candles, added {result.rows_added} new to {result.path}",
                  markup=False, highlight=False, soft_wrap=True)
    from r1trade.data.store import load_candles

    console.print(render_report(result.path, load_candles(result.path).attrs, result.report))



def _timestamp(text: str, flag: str) -> pd.Timestamp:
    """`text` as a UTC time (naive as UTC); pandas reads blank text as "no time", never meant here."""
    try:
        stamp = pd.Timestamp(text).as_unit("ns")
    except (ValueError, OverflowError):
        stamp = pd.NaT
    if pd.isna(stamp):
        raise UsageError(f"bad {flag} '{text}': use a date like 2024-01-01 or 2024-01-01T12:00 (UTC)")
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")

