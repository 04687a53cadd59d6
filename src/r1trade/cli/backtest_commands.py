"""Commands that judge a policy on held-out data: the backtest and its console summary, and the choice of a
run's step on the validation split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from r1trade.cli.app import EveryOption, MetricOption, SetOption, app, console, print_wrote, resolve_config
from r1trade.config import Config
from r1trade.errors import UsageError

if TYPE_CHECKING:
    from r1trade.backtest.assets import AssetsOutcome
    from r1trade.backtest.report_runs import ReportContext, StrategyRun
    from r1trade.backtest.runner import BacktestOutcome

BASE_MODEL = "base-model"
"""`--baseline` value that adds the untrained base model to a backtest."""


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
    resolved = resolve_config(config, [*(set_ or []), *overrides])
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
    from r1trade.backtest.report_text import comparison_tables, fold_tables, uncertainty_note, verdict_lines

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
    print_wrote(f"{outcome.out_dir}/: {files}")


def _show_verdicts(runs: list[StrategyRun], context: ReportContext) -> None:
    """The Verdicts section: PSR and minimum track record per run, then SPA and StepM per benchmark."""
    from r1trade.backtest.report_text import comparison_tables, superiority_lines, verdict_runs, verdicts_note

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
    from r1trade.backtest.report_text import comparison_tables, uncertainty_note, verdict_lines

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
    print_wrote(f"{assets.out_dir}/: {files}")

@app.command("select-step")
def select_step_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `r1trade train`")],
    split: Annotated[str, typer.Option(help="the split to choose on: validation (or train), never test")]
    = "validation",
    metric: MetricOption = None,
    every: EveryOption = 1,
    up_to: Annotated[int | None, typer.Option(
        "--up-to", help="choose among the checkpoints up to this step: what a budget of that many updates chooses"
    )] = None,
) -> None:
    """Choose a run's step without the test split: each checkpoint of the run's schedule (not one a stop wrote)
    backtested greedily on --split, the best --metric kept (the earliest of equal steps); writes
    RUN/selected_step.json. A step the run's last selection measured on the same split and metric keeps its
    figure (delete that file to measure it again)."""
    from r1trade.backtest.step_selection import DEFAULT_METRIC, SELECTION_FILE, select_step

    metric = metric or DEFAULT_METRIC

    def show(step: int, value: float) -> None:
        console.print(f"step {step:>4}: {metric} {value:.2f}", markup=False, highlight=False)

    selection = select_step(run_dir, split=split, metric=metric, every=every, up_to=up_to, on_step=show)
    best = selection.figures[selection.step]
    console.print(
        f"selected step-{selection.step}: {metric} {best:.2f} on the {split} split ({selection.checkpoint})",
        markup=False, highlight=False, soft_wrap=True,
    )
    print_wrote(str(run_dir / SELECTION_FILE))
