"""The `r1trade` command line: each command loads its config, calls one function, prints a Rich summary."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import pandas as pd
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from r1trade import __version__
from r1trade.config import MAX_BOOTSTRAP_RESAMPLES, Config, load_config
from r1trade.errors import DataError, R1TradeError, TrainingInterrupted, UsageError
from r1trade.outputs import resolve_output, write_file

if TYPE_CHECKING:
    from r1trade.backtest.assets import AssetsOutcome
    from r1trade.backtest.report import ReportContext, StrategyRun
    from r1trade.backtest.runner import BacktestOutcome

app = typer.Typer(
    name="r1trade",
    help="Train a small language model with multi-turn RL to trade crypto through tools, then backtest it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

CLICK_ERRORS = (click.ClickException, *([typer.TyperException] if hasattr(typer, "TyperException") else []))
"""Usage errors from click, and from the copy of click that newer typer releases carry."""

BASE_MODEL = "base-model"
"""`--baseline` value that adds the untrained base model to a backtest."""

LADDER = Path("docs/results/ladder.json")
LADDER_COLUMNS = {"direction_accuracy": "Direction Accuracy [%]", "signal_call_rate": "get_changes called [%]",
                  "info_call_rate": "Info Calls [%]", "forced_hold_rate": "Forced Holds [%]",
                  "return_pct": "Return [%]", "mandate_penalty": "Mandate Penalty",
                  "warmstart_mandate_penalty": "warm start's penalty", "vol_target_rule_penalty": "vol_target rule's",
                  "best_constant_penalty": "best constant's", "vol_forecast_penalty": "vol_forecast's",
                  "realised_volatility_pct": "Realised Volatility [%]",
                  "size_volatility_correlation": "size-volatility ρ"}

ConfigOption = Annotated[
    str | None, typer.Option("--config", "-c", help="config name in configs/ (e.g. btc_momentum) or a YAML path")
]
SetOption = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="override a config field: section.key=value (repeatable)")
]


def _wrote(what: str) -> None:
    """`wrote <paths>`, printed as is: no markup, and never a line break inside a path."""
    console.print(f"wrote {what}", markup=False, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        console.print(f"r1trade {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="show full tracebacks on errors, and everything --verbose shows")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="show the libraries' warnings, logs and progress bars, and r1trade's notes"
        ),
    ] = False,
) -> None:
    """r1trade: an RL-trained, tool-using crypto trading agent."""
    from r1trade.quiet import quiet_third_party, show_messages

    show_messages(verbose=debug or verbose)
    if not (debug or verbose):
        quiet_third_party()


def _config(config: str | None, overrides: list[str] | None) -> Config:
    """Load and validate the config before a command does anything else."""
    return load_config(config, overrides or [])


# --------------------------------------------------------------------------- config


@app.command("show-config")
def show_config(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Print the fully resolved config as YAML."""
    resolved = _config(config, set_)
    console.print(resolved.to_yaml(), end="", highlight=False, markup=False, soft_wrap=True)


# --------------------------------------------------------------------------- data


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
    resolved = None if config is None else _config(config, set_)
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
    console.print(f"fetched {result.rows_fetched} candles, added {result.rows_added} new to {result.path}")
    from r1trade.data.store import load_candles

    console.print(render_report(result.path, load_candles(result.path).attrs, result.report))


def _signed(value: float | None) -> str:
    """A probability difference for the console: +0.034, or n/a when it is undefined."""
    return "n/a" if value is None else f"{value:+.3f}"


def _timestamp(text: str, flag: str) -> pd.Timestamp:
    """`text` as a UTC time (naive as UTC); pandas reads blank text as "no time", never meant here."""
    try:
        stamp = pd.Timestamp(text).as_unit("ns")
    except (ValueError, OverflowError):
        stamp = pd.NaT
    if pd.isna(stamp):
        raise UsageError(f"bad {flag} '{text}': use a date like 2024-01-01 or 2024-01-01T12:00 (UTC)")
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


# --------------------------------------------------------------------------- training and evaluation


@app.command("check-env")
def check_env(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
    episodes: Annotated[int, typer.Option(help="episodes per scripted policy")] = 5,
    split: Annotated[str, typer.Option(help="data split to replay")] = "train",
) -> None:
    """Run scripted policies (random, malformed, momentum) through the env and check determinism."""
    resolved = _config(config, set_)
    from r1trade.env.check import render_check_report, run_check_env

    report = run_check_env(resolved, episodes=episodes, seed=resolved.seed, split=split)
    console.print(render_check_report(report))


@app.command("show-rollout")
def show_rollout(
    config: ConfigOption = "smoke",
    set_: SetOption = None,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint directory (default: the untrained model)")] = None,
    split: Annotated[str, typer.Option(help="data split to replay")] = "train",
    greedy: Annotated[bool, typer.Option(help="greedy decoding instead of sampling")] = False,
) -> None:
    """Play one episode and print it: sampled tokens highlighted, masked tokens dimmed, rewards per turn.

    With a checkpoint the episode follows the run's own config (--config is not read), with --set applied to it,
    so `--set seed=N` shows another episode of the same policy."""
    import torch

    from r1trade.rollout.backend import sampling_from_config
    from r1trade.models.loading import load_agent_models
    from r1trade.rollout.build import transformers_engine
    from r1trade.rollout.viewer import render_trajectory
    from r1trade.env.trading_env import make_envs
    from r1trade.rl.checkpoint import load_trained_agent

    if checkpoint is not None:
        resolved, models = load_trained_agent(checkpoint, set_ or [])
    else:
        resolved = _config(config, set_)
        models = load_agent_models(resolved.model, seed=resolved.seed)
    engine = transformers_engine(models.policy, models.tokenizer, sampling_from_config(resolved.rollout, greedy=greedy))
    generator = torch.Generator().manual_seed(resolved.seed)
    (trajectory,) = engine.run(make_envs(resolved, 1, split), [resolved.seed], generator=generator)
    console.print(render_trajectory(models.tokenizer, trajectory))


@app.command()
def warmstart(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
) -> None:
    """Supervised warm start on demonstrations in the tool-call format (TRL SFTTrainer); writes a model.

    `--set warmstart.policy=random` demonstrates uniformly random trades (format only, entropy over actions kept);
    the default `rule` demonstrates a trend rule. With `--set train.engine=trl` the demonstrations are rendered as
    TRL's GRPOTrainer renders an episode, the env's tool schemas in the system turn, and the model keeps them."""
    from r1trade.warmstart import warmstart as run_warmstart

    resolved = _config(config, set_)
    run_dir = Path(resolved.output_dir) / f"{resolved.name}-warmstart"
    resolved.save(run_dir)
    tools = None
    if resolved.train.engine == "trl":
        from r1trade.integrations.trl import tool_schemas

        tools = tool_schemas(resolved)
    model_dir = run_warmstart(resolved, run_dir, tools=tools, console=console)
    console.print(f"warm-started model: [bold]{model_dir}[/bold]")
    console.print(f"train from it with: r1trade train --config ... --set model.name_or_path={model_dir}")


@app.command("action-stats")
def action_stats_command(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
    checkpoint: Annotated[Path | None, typer.Option(help="RL checkpoint (default: model.name_or_path)")] = None,
    split: Annotated[str, typer.Option(help="data split to play")] = "test",
    episodes: Annotated[int, typer.Option(min=1, help="held-out episodes (env.episode_decisions each)")] = 16,
    out: Annotated[Path | None, typer.Option(help="write the figures as JSON here")] = None,
) -> None:
    """A policy on held-out decisions: valid calls, action mix, entropy at the decision token."""
    from r1trade.models.loading import load_base_model
    from r1trade.eval.action_stats import action_stats
    from r1trade.rl.checkpoint import load_trained_agent

    resolved = _config(config, set_)
    if checkpoint is not None:
        trained, models = load_trained_agent(checkpoint)
        resolved = resolved.model_copy(update={"rollout": trained.rollout})
        policy, tokenizer = models.policy, models.tokenizer
    else:
        policy, tokenizer = load_base_model(resolved.model)
    stats = action_stats(policy, tokenizer, resolved, split=split, episodes=episodes, seed=resolved.seed)
    table = Table(title=f"{checkpoint or resolved.model.name_or_path} on {episodes} {split} episodes")
    table.add_column("figure")
    table.add_column("greedy", justify="right")
    table.add_column(f"sampled (T={resolved.rollout.temperature:g})", justify="right")
    table.add_row("valid calls", f"{stats.valid_call_rate:.1%}", f"{stats.sampled_valid_call_rate:.1%}")
    for kind, share in stats.mix.items():
        table.add_row(f"  {kind}", f"{share:.1%}", f"{stats.sampled_mix[kind]:.1%}")
    table.add_row("direction accuracy", f"{stats.direction_accuracy:.1%}", f"{stats.sampled_direction_accuracy:.1%}")
    console.print(table)
    console.print(
        f"{stats.decisions} greedy trade decisions: entropy at the decision token {stats.decision_token_entropy:.3f} "
        f"nats; after 'Action:' ({stats.action_prompt_share:.0%} of them) the action choice's entropy is "
        f"{stats.action_entropy:.3f} nats (ln 4 = 1.386), P = "
        + ", ".join(f"{a} {p:.2f}" for a, p in stats.action_probabilities.items())
        + f"; expected direction accuracy there {stats.expected_direction_accuracy:.1%}"
    )
    for label, use in (("greedy", stats.information), (f"sampled (T={resolved.rollout.temperature:g})",
                                                      stats.sampled_information)):
        tools = ", ".join(f"{name} {rate:.0%}" for name, rate in use["tool_rates"].items()) or "none"
        console.print(f"{label}: information calls before {use['info_call_rate']:.0%} of trades ({tools})")
    if out is not None:
        write_file(out, json.dumps(stats.to_dict(), indent=1) + "\n")


@app.command()
def train(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
    resume: Annotated[Path | None, typer.Option(help="run directory to continue from its last checkpoint")] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="start over in a run directory that holds an earlier run (deletes what the run wrote, all or "
            "nothing; a symbolic link there is removed as a link, never what it points to)",
        ),
    ] = False,
) -> None:
    """Train the agent with multi-turn RL (PPO, GRPO, Dr. GRPO, RLOO or REINFORCE++); writes runs/<name>/
    (with train.walk_forward K, one agent per fold in runs/<name>/fold-<k>/)."""
    from r1trade.train import train_run

    if resume is not None:
        if force:
            raise UsageError("--force starts a run over and --resume continues one: give one of them")
        if not (resume / "config.yaml").is_file():
            raise UsageError(f"cannot resume: '{resume}' is not a run directory (no config.yaml)")
        resolved = load_config(resume / "config.yaml", set_ or [])
        run_dir = resolve_output(resume)
    else:
        resolved = _config(config, set_)
        run_dir = resolve_output(Path(resolved.output_dir) / resolved.name)  # `..` and links followed
    checkpoint = train_run(resolved, run_dir, resume=resume is not None, force=force, console=console)
    if resolved.train.walk_forward is None:
        console.print(f"final checkpoint: [bold]{checkpoint}[/bold]")
    else:
        console.print(f"fold agents: [bold]{run_dir}[/bold] (r1trade backtest --checkpoint {run_dir})")


@app.command("plot-run")
def plot_run(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `r1trade train`")],
    out: Annotated[Path | None, typer.Option(help="where to write the PNGs (default: the run directory)")] = None,
) -> None:
    """Draw a run's learning curves (return, PnL, valid calls, entropy, KL, each reward component) as PNGs."""
    from r1trade.rl.plots import plot_learning_curves

    for path in plot_learning_curves(run_dir, out):
        _wrote(str(path))


@app.command("compare-runs")
def compare_runs(
    run_dirs: Annotated[list[Path], typer.Argument(help="two or more run directories written by `r1trade train`")],
    out: Annotated[
        Path, typer.Option(help="the PNG to write (.png is added to a name without a suffix)")
    ] = Path("reports/compare-runs.png"),
    metric: Annotated[
        list[str] | None, typer.Option(help="a metrics.jsonl key to draw (repeatable; default: return, valid"
                                            " calls, PnL, entropy)")
    ] = None,
) -> None:
    """Overlay several runs' learning curves (ablations, algorithm comparisons) in one PNG."""
    from r1trade.rl.plots import plot_comparison

    _wrote(str(plot_comparison(run_dirs, out, metric)))


@app.command("probe-run")
def probe_run_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `r1trade train`")],
    every: Annotated[int, typer.Option(min=1, help="probe every N-th checkpoint (and the start and the last)")] = 1,
    points: Annotated[int, typer.Option(min=1, help="held-out decisions, evenly spaced over the split")] = 200,
    split: Annotated[str, typer.Option(help="data split to probe")] = "test",
) -> None:
    """A held-out learning curve: the direction the policy picks at fresh decisions, at its start and checkpoints."""
    from r1trade.eval.probe import probe_run
    from r1trade.rl.plots import plot_probe

    if split not in ("train", "validation", "test"):
        raise UsageError(f"--split must be train, validation or test, not '{split}'")

    def show(record: dict) -> None:
        console.print(
            f"step {record['step']:>4}: expected direction accuracy {record['expected_direction_accuracy']:.1%}, "
            f"greedy {record['greedy_direction_accuracy']:.1%}, P(long) {record['long_share']:.2f}, "
            f"discrimination {_signed(record.get('discrimination'))}, call follows the stated action "
            f"{record['call_follows_word']:.0%} ({record['points']} decisions)"
            + (f"; looked first {record['info_call_rate']:.0%}, at get_changes {record['signal_call_rate']:.0%}"
               if record.get("info_call_rate") is not None else "")
            + ("; by decision " + " ".join(f"{int(k) + 1}: {v:.0%}" for k, v in by_decision.items())
               if len(by_decision := record.get("expected_accuracy_by_decision", {})) > 1 else "")
        )

    records = probe_run(run_dir, every=every, count=points, split=split, on_step=show)
    png = plot_probe(records, run_dir / f"probe-{split}.png")
    _wrote(f"{run_dir / f'probe-{split}.json'} and {png}")


@app.command("ladder-record")
def ladder_record_command(
    report: Annotated[Path, typer.Option(help="a backtest report directory (its metrics.json)")],
    checkpoint: Annotated[Path, typer.Option(help="the evaluated checkpoint, runs/<name>/checkpoints/step-N")],
    level: Annotated[str, typer.Option(help="planted_edge, btc, tool_gated, multi_decision or vol_target")],
    variant: Annotated[str, typer.Option(help="what the run is, e.g. 'rloo turn-level, full masks, seed 0'")],
    command: Annotated[str, typer.Option(help="the backtest command that wrote the report")],
    model: Annotated[str, typer.Option(help="the model and adapter, as the record should name them")],
    agent: Annotated[str | None, typer.Option(help="the agent's row (default: the report's only 'agent (...)')")]
    = None,
    warmstart: Annotated[str, typer.Option(help="the warm start's row")] = "base model",
    seed: Annotated[int | None, typer.Option(help="the run's seed, where a variant has several")] = None,
    ladder: Annotated[Path, typer.Option(help="the ladder file")] = LADDER,
) -> None:
    """Add a learning run's held-out figures to docs/results/ladder.json (one record per level, variant and seed)."""
    from r1trade.eval.ladder import LEVELS, add_record, ladder_record

    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, not '{level}'")
    record = ladder_record(report, checkpoint, level=level, variant=variant, model=model, command=command,
                           agent=agent, warmstart=warmstart, seed=seed)  # type: ignore[arg-type]
    records = add_record(ladder, record)
    console.print_json(json.dumps(record))
    console.print(f"{ladder}: {len(records)} records")


@app.command("ladder-summary")
def ladder_summary_command(
    level: Annotated[str, typer.Option(help="planted_edge, btc, tool_gated, multi_decision or vol_target")],
    prefix: Annotated[str, typer.Option(help="only variants whose name starts with this")] = "",
    ladder: Annotated[Path, typer.Option(help="the ladder file")] = LADDER,
) -> None:
    """Each variant's held-out figures over its seeds, mean ± standard deviation [range], as a Markdown table (the
    ablation tables of docs/results.md)."""
    from r1trade.eval.ladder import LEVELS, read_ladder, summarise, summary_fields

    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, not '{level}'")
    rows = summarise(read_ladder(ladder), level=level, prefix=prefix)
    if not rows:
        raise UsageError(f"{ladder} has no {level} records whose variant starts with '{prefix}'")
    fields = summary_fields(level)
    header = ["variant", "seeds", *(LADDER_COLUMNS[field] for field in fields)]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * len(fields)]
    for row in rows:
        cells = [row["variant"], " ".join(map(str, row["seeds"])) or "—",
                 *(_spread_text(row[field], field) for field in fields)]
        lines.append("| " + " | ".join(cells) + " |")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


@app.command("overfitting")
def overfitting_command(
    level: Annotated[str, typer.Option(help="planted_edge, btc, tool_gated, multi_decision or vol_target")],
    ladder: Annotated[Path, typer.Option(help="the ladder file")] = LADDER,
    prefix: Annotated[str, typer.Option(help="only variants whose name starts with this")] = "",
    blocks: Annotated[int, typer.Option(help="S: the even number of blocks CSCV cuts the decisions into")] = 16,
) -> None:
    """Probability of backtest overfitting (CSCV) over a level's runs, from the per-decision returns of the
    reports their ladder records name."""
    from r1trade.backtest.ladder_overfitting import ladder_overfitting
    from r1trade.eval.ladder import LEVELS

    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, not '{level}'")
    result = ladder_overfitting(ladder, level, prefix=prefix, blocks=blocks)
    table = Table(title=f"{level} runs (trials) · {ladder}", title_justify="left")
    for column in ("variant", "seed", "report", "decisions"):
        table.add_column(column, justify="right" if column == "decisions" else "left")
    for run in result.runs:
        seed = "—" if run.seed is None else str(run.seed)
        table.add_row(escape(run.variant), seed, escape(str(run.report)), f"{len(run.returns.returns):,}")
    console.print(table)
    found = result.overfitting
    console.print(
        f"PBO = {found.probability:.3f}: over the C({found.blocks}, {found.blocks // 2}) = {len(found.logits):,} "
        f"splits of the last {found.periods:,} decisions into {found.blocks} blocks, the run with the best "
        f"in-sample Sharpe ratio ranked at or below the out-of-sample median of the {found.trials} runs in "
        f"{100 * found.probability:.1f} % of them (Bailey, Borwein, López de Prado & Zhu 2017).",
        markup=False, highlight=False,
    )


def _spread_text(spread: dict | None, field: str) -> str:
    """`mean ± sd [min, max]`, in percent for the rates; penalties and correlations as they are, to three
    decimals."""
    if spread is None:
        return "—"
    as_is = field.endswith(("penalty", "correlation"))
    scale = 1.0 if field.endswith("_pct") or as_is else 100.0
    mean, sd, low, high = (scale * spread[k] for k in ("mean", "sd", "min", "max"))
    digits = 3 if as_is else 1
    return (f"{mean:.{digits}f} ± {sd:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]" if spread["n"] > 1
            else f"{mean:.{digits}f}")


@app.command()
def backtest(
    config: Annotated[
        str | None,
        typer.Option(
            "--config", "-c",
            help="config name in configs/ or a YAML path (default: the checkpoint's config, else btc_momentum)",
        ),
    ] = None,
    set_: SetOption = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            help="run this baseline alone (oracle: beside buy_and_hold; default: every one in backtest.strategies)"
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="checkpoint directory of a trained agent to run beside the baselines, or a walk-forward run "
            "(runs/<name> trained with train.walk_forward): each fold's agent plays its own fold"
        ),
    ] = None,
    step: Annotated[
        int | None,
        typer.Option(
            "--step", metavar="N",
            help="with a walk-forward run: each fold agent's checkpoint step-N (default: its last)",
        ),
    ] = None,
    baseline: Annotated[
        list[str] | None,
        typer.Option(
            "--baseline",
            help="base-model: also run the model before RL (the one the checkpoint started from, else the "
            "config's) the agent's way",
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="also run this model (a name such as smollm2-135m-instruct, or a model directory) the agent's "
            "way, e.g. the untrained model a warm start began from; repeatable",
        ),
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="train, validation or test (default: backtest.split)")
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="one candle file in place of data.path or data.paths (e.g. an asset never "
                                       "trained on), validated as theirs are")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="report directory (default: reports/<name>-<split>)")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="replace a previous report in --out (never a run or other files)")
    ] = False,
    walk_forward: Annotated[
        int | None,
        typer.Option(
            "--walk-forward", metavar="K",
            help="also backtest K consecutive folds (data.split.embargo_bars apart); report each and pooled",
        ),
    ] = None,
    walk_forward_span: Annotated[
        str | None,
        typer.Option(
            "--walk-forward-span",
            help="split: cut the folds from the evaluated split; all: from every bar after the train split "
            "(default: split, or a walk-forward run's)",
        ),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            help="variants compared on this data, for the deflated Sharpe ratio (default: number of models)"
        ),
    ] = None,
    allow_timeframe_change: Annotated[
        bool,
        typer.Option(
            "--allow-timeframe-change",
            help="play --checkpoint on candles of another bar length than it trained on (refused without it)",
        ),
    ] = False,
) -> None:
    """Backtest baselines (and a checkpoint) on held-out data: metrics with 95 % intervals, trades, HTML.

    A config with several candle files (data.paths) is backtested on each, then pooled."""
    from r1trade.backtest.runner import run_backtest
    from r1trade.data.source import check_checkpoint_timeframe

    unknown = [name for name in baseline or [] if name != BASE_MODEL]
    if unknown:
        raise UsageError(
            f"unknown --baseline '{unknown[0]}': use {BASE_MODEL} (rule baselines: --strategy or backtest.strategies)"
        )
    if config is None:
        saved = None if checkpoint is None else checkpoint / "config.yaml"
        config = str(saved) if saved is not None and saved.is_file() else "btc_momentum"
    flags = {
        "data.source": None if data is None else "file",
        "data.path": None if data is None else str(data),
        "data.paths": None if data is None else [],
        "backtest.split": split,
    }
    # quoted as JSON strings (valid YAML), so a path such as `null` or `1e3` stays a string
    overrides = [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]
    resolved = _config(config, [*(set_ or []), *overrides])
    if checkpoint is not None and not allow_timeframe_change:
        check_checkpoint_timeframe(checkpoint, resolved)
    options = {
        "strategy": strategy, "checkpoint": checkpoint, "base_model": bool(baseline), "models": model or (),
        "out_dir": out, "force": force, "walk_forward": walk_forward, "span": walk_forward_span,
        "trials": trials, "step": step,
    }
    if len(resolved.data.paths) > 1:
        from r1trade.backtest.assets import run_asset_backtests

        assets = run_asset_backtests(resolved, **options)
        for report in assets.assets:
            _show_backtest(report.outcome, resolved, label=report.label)
        _show_pooled_assets(assets, resolved)
        return
    _show_backtest(run_backtest(resolved, **options), resolved)


def _show_backtest(outcome: BacktestOutcome, resolved: Config, *, label: str = "") -> None:
    """A backtest's tables, verdicts and notes, and where its report went; `label`: its asset's."""
    from r1trade.backtest.report import comparison_tables, fold_tables, uncertainty_note, verdict_lines

    index, env = outcome.context.candles.index, resolved.env
    pooled = f" · pooled over {len(outcome.folds)} walk-forward folds" if outcome.folds else ""
    title = (
        f"{resolved.name}{f' · {label}' if label else ''} · {outcome.context.split} split · "
        f"{index[0]:%Y-%m-%d} → {index[-1]:%Y-%m-%d} · fee {env.fee_bps:g} bps, slippage "
        f"{env.slippage_bps:g} bps{pooled}"
    )
    for table in comparison_tables(outcome.runs, title=title, width=console.width):
        console.print(table)
    for table in fold_tables(outcome.folds, width=console.width):
        console.print(table)
    for line in verdict_lines(outcome.runs):
        console.print(line, markup=False, highlight=False, style="bold")
    if any(run.ci95 for run in outcome.runs):
        console.print(uncertainty_note(outcome.runs, outcome.context), markup=False, highlight=False)
    if outcome.context.mandate_note:
        console.print(outcome.context.mandate_note, markup=False, highlight=False)
    _show_verdicts(outcome.runs, outcome.context)
    if outcome.context.too_short_to_annualise:
        console.print(outcome.context.annualisation_note, markup=False, highlight=False)
    for run in outcome.runs:
        if run.note:
            console.print(f"{run.name}: {run.note}", markup=False, highlight=False)
    files = ", ".join(path.name for path in outcome.files)
    _wrote(f"{outcome.out_dir}/: {files}")


def _show_verdicts(runs: list[StrategyRun], context: ReportContext) -> None:
    """The Verdicts section: PSR and minimum track record per run, then SPA and StepM per benchmark."""
    from r1trade.backtest.report import comparison_tables, superiority_lines, verdict_runs, verdicts_note

    shown = verdict_runs(runs)
    if not shown:
        return
    for table in comparison_tables(shown, title="Verdicts", width=console.width):
        console.print(table)
    for line in superiority_lines(runs):
        console.print(line, markup=False, highlight=False, style="bold")
    console.print(verdicts_note(runs, context), markup=False, highlight=False)


def _show_pooled_assets(assets: AssetsOutcome, resolved: Config) -> None:
    """The runs pooled over a backtest's assets, their verdicts and how they are pooled."""
    from r1trade.backtest.assets import POOLED_ASSETS_NOTE
    from r1trade.backtest.report import comparison_tables, uncertainty_note, verdict_lines

    if assets.pooled is None:
        console.print("Not pooled: the assets' bar lengths differ (see each asset's report).", markup=False)
    else:
        env = resolved.env
        title = (
            f"{resolved.name} · pooled over {len(assets.assets)} assets · fee {env.fee_bps:g} bps, slippage "
            f"{env.slippage_bps:g} bps"
        )
        for table in comparison_tables(assets.pooled, title=title, width=console.width):
            console.print(table)
        for line in verdict_lines(assets.pooled):
            console.print(line, markup=False, highlight=False, style="bold")
        if any(run.ci95 for run in assets.pooled):
            note = uncertainty_note(assets.pooled, assets.pooled_context)
            console.print(note, markup=False, highlight=False)
        _show_verdicts(assets.pooled, assets.pooled_context)
        console.print(POOLED_ASSETS_NOTE, markup=False, highlight=False)
    files = ", ".join(path.name for path in assets.files)
    _wrote(f"{assets.out_dir}/: {files}")


MetricOption = Annotated[
    str, typer.Option(help="the agent's report row to maximise (higher is better), e.g. 'Return [%]'")
]
EveryOption = Annotated[
    int, typer.Option(min=1, help="only the checkpoints whose step is a multiple of N, and the last")
]


@app.command("select-step")
def select_step_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `r1trade train`")],
    split: Annotated[str, typer.Option(help="the split to choose on: validation (or train), never test")]
    = "validation",
    metric: MetricOption = LADDER_COLUMNS["direction_accuracy"],
    every: EveryOption = 1,
) -> None:
    """Choose a run's step without the test split: each checkpoint backtested greedily on --split, the highest
    --metric kept (the earliest of equal steps); writes RUN/selected_step.json."""
    from r1trade.backtest.step_selection import SELECTION_FILE, select_step

    def show(step: int, value: float) -> None:
        console.print(f"step {step:>4}: {metric} {value:.2f}", markup=False, highlight=False)

    selection = select_step(run_dir, split=split, metric=metric, every=every, on_step=show)
    best = selection.figures[selection.step]
    console.print(
        f"selected step-{selection.step}: {metric} {best:.2f} on the {split} split ({selection.checkpoint})",
        markup=False, highlight=False, soft_wrap=True,
    )
    _wrote(str(run_dir / SELECTION_FILE))


@app.command("seeds")
def seeds_command(
    config: Annotated[str, typer.Option("--config", "-c", help="config name in configs/ or a YAML path")],
    seeds: Annotated[str, typer.Option(help="seeds to run: a range 0-4, a list 0,2,5 or one seed")] = "0-4",
    set_: SetOption = None,
    warm: Annotated[
        bool | None,
        typer.Option("--warmstart/--no-warmstart",
                     help="warm-start each seed first (default: when the config has a warmstart section)"),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="the seeds' folder (default: <output_dir>/<name>-seeds)"),
    ] = None,
    metric: MetricOption = LADDER_COLUMNS["direction_accuracy"],
    every: EveryOption = 1,
    ladder: Annotated[Path | None, typer.Option(help="also add a record per seed to this ladder")] = None,
    level: Annotated[str | None, typer.Option(help="with --ladder: planted_edge, btc, tool_gated, "
                                                   "multi_decision or vol_target")] = None,
    variant: Annotated[str | None, typer.Option(help="with --ladder: the records' variant (default: the "
                                                     "--out folder's name)")] = None,
    warm_from: Annotated[
        Path | None,
        typer.Option("--warmstart-from", help="start each seed from the finished warm start of this other "
                     "seeds folder (same config outside train, rewards, backtest and sampling): variants compared from "
                     "the same models"),
    ] = None,
) -> None:
    """Does a recipe learn? One config over several seeds, one after another: warm start, RL, the step chosen
    on the validation split (likewise for each of the config's seeds.restarts, keeping the run best on
    validation), a test backtest beside the warm start; then each held-out figure's mean, sd, worst seed and
    IQM. Run again after a stop: finished stages are skipped, unfinished training resumes."""
    from r1trade.eval.ladder import LEVELS
    from r1trade.seeds import (
        add_ladder_records,
        default_out_dir,
        ladder_model,
        parse_seeds,
        run_seeds,
        wants_warmstart,
    )

    chosen = parse_seeds(seeds)
    if (ladder is None) != (level is None):
        raise UsageError("--ladder and --level go together: give both to add ladder records, or neither")
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, not '{level}'")
    resolved = _config(config, set_)
    out = out or default_out_dir(resolved)
    outcome = run_seeds(config, set_ or [], chosen, warm=warm, out_dir=out, metric=metric, every=every,
                        warm_from=warm_from, console=console)
    held = ",".join(str(result.seed) for result in outcome.summarised)
    title = f"{config} · seeds {held} · step chosen on validation by {metric} · held out: test split"
    console.print(_seeds_table(outcome, title=escape(title)))
    _wrote(str(outcome.file))
    if ladder is not None:
        flags = [*(["--warmstart"] if warm else ["--no-warmstart"] if warm is False else []),
                 *(["--warmstart-from", str(warm_from)] if warm_from is not None else []),
                 *(part for item in set_ or [] for part in ("--set", item))]
        command = shlex.join(["r1trade", "seeds", "--config", config, "--seeds", seeds, *flags,
                              "--out", str(out), "--metric", metric, "--every", str(every)])
        model = ladder_model(resolved, warm=wants_warmstart(resolved, warm))
        records = add_ladder_records(
            outcome, ladder, level=level,  # type: ignore[arg-type]
            variant=variant or out.name, model=model, command=command,
        )
        console.print(f"{ladder}: {len(records)} records", markup=False, highlight=False)


def _seeds_table(outcome, *, title: str) -> Table:  # outcome: SeedsOutcome
    """Each seed's chosen step and figures, then each figure's mean, sd, worst seed and IQM (short headers:
    the full names are in seeds.json); a figure no seed's report has (the mandate's outside its rung) is left
    out."""
    from r1trade.backtest.report import MANDATE_PENALTY, REALISED_VOLATILITY
    from r1trade.eval.ladder import SIGNAL_ROW
    from r1trade.seeds import ACCURACY, FIGURES, GAIN, INFO_CALLS, RETURN

    headers = {ACCURACY: "accuracy [%]", GAIN: "gain [pp]", RETURN: "return [%]",
               INFO_CALLS: "info calls [%]", SIGNAL_ROW: "get_changes [%]", MANDATE_PENALTY: "penalty",
               REALISED_VOLATILITY: "volatility [%]"}
    shown = [f for f in FIGURES if any(result.figures.get(f) is not None for result in outcome.summarised)]

    def cell(value: float | None, figure: str, *, signed: bool = True) -> str:
        if value is None:
            return "—"
        return f"{value:+.1f}" if signed and figure in (GAIN, RETURN) else f"{value:.3f}" \
            if figure == MANDATE_PENALTY else f"{value:.1f}"

    caption = "accuracy: direction accuracy; gain: its points over the model RL started from (the warm start)"
    if MANDATE_PENALTY in shown:
        caption += "; penalty: the mandate's mean miss (lower is better, its worst seed the highest)"
    restarts = any(len(result.validation) > 1 for result in outcome.summarised)
    if restarts:
        caption += "; run: the one tested, its chosen step the best on validation (0: the config as written, K: " \
                   "restart K)"
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("seed")
    blank = [""] if restarts else []
    if restarts:
        table.add_column("run", justify="right")
    table.add_column("step", justify="right")
    for figure in shown:
        table.add_column(escape(headers[figure]), justify="right")
    for result in outcome.summarised:
        kept = [str(result.kept)] if restarts else []
        table.add_row(str(result.seed), *kept, str(result.step), *(cell(result.figures[f], f) for f in shown))
    spreads = [outcome.spreads[figure] for figure in shown]
    table.add_section()
    for label, field in (("mean", "mean"), ("sd", "sd"), ("worst", "worst"), ("IQM", "iqm")):
        values = [None if spread is None else getattr(spread, field) for spread in spreads]
        table.add_row(label, *blank, "", *(cell(v, figure, signed=field != "sd")
                                           for v, figure in zip(values, shown, strict=True)))
    table.add_row("worst seed", *blank, "", *("—" if s is None else str(s.worst_seed) for s in spreads))
    return table


@app.command("compare-seeds")
def compare_seeds_command(
    reference: Annotated[Path, typer.Argument(help="the recipe's seeds folder (`r1trade seeds --out`)")],
    variants: Annotated[list[Path], typer.Argument(help="seeds folders of its variants, run on the same seeds")],
    resamples: Annotated[int, typer.Option(min=100, max=MAX_BOOTSTRAP_RESAMPLES, help="bootstrap resamples")] = 2000,
    block: Annotated[float, typer.Option(min=1.0, help="mean block length of the decisions' bootstrap")] = 10.0,
) -> None:
    """Each variant's held-out Direction Accuracy [%] minus the recipe's, paired by seed and by test decision,
    with a 95 % interval that resamples both the seeds and the decisions (an ablation's table, in Markdown)."""
    from r1trade.backtest.paired_seeds import compare_seeds

    lines = ["| variant | seeds | recipe [%] | variant [%] | per seed [pp] | difference [pp] (95 % interval) |",
             "|---|---|---:|---:|---|---:|"]
    for variant in variants:
        found = compare_seeds(reference, variant, resamples=resamples, mean_block=block)
        mean = {arm: sum(values.values()) / len(values) for arm, values in
                (("reference", found.reference), ("variant", found.variant))}
        per_seed = ", ".join(f"{seed}: {value:+.1f}" for seed, value in found.per_seed.items())
        low, high = found.interval
        lines.append(f"| {variant.name} | {' '.join(map(str, found.seeds))} | {mean['reference']:.1f} | "
                     f"{mean['variant']:.1f} | {per_seed} | {found.difference:+.1f} [{low:+.1f}, {high:+.1f}] |")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- paper trading


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
    from r1trade.backtest.report import comparison_tables
    from r1trade.paper.report import paper_report

    report = paper_report(journal, out, force=force)
    index = report.context.candles.index
    title = f"paper · {journal} · {index[0]:%Y-%m-%d %H:%M} → {index[-1]:%Y-%m-%d %H:%M}"
    for table in comparison_tables(report.runs, title=title, width=console.width):
        console.print(table)
    console.print(f"{report.runs[0].name}: {report.runs[0].note}", markup=False, highlight=False)
    files = ", ".join(path.name for path in report.files)
    _wrote(f"{out}/: {files}")


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; known errors become one line on stderr and an exit code (2 usage/config, 1 runtime)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name="r1trade", standalone_mode=False)
    except R1TradeError as exc:
        if "--debug" in args:
            raise
        err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except CLICK_ERRORS as exc:  # a mistyped command or option: the usage line, the "did you mean" hint
        exc.show()
        return exc.exit_code
    except TrainingInterrupted as exc:
        err_console.print(f"interrupted: {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 130
    except (click.exceptions.Abort, typer.Abort, KeyboardInterrupt):
        err_console.print("interrupted")
        return 130
    except OSError as exc:
        if "--debug" in args:
            raise
        err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    return result if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
