"""Commands over seeds: does a recipe learn on each of them, and how do its variants differ, seed by seed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from r1trade.cli.app import EveryOption, MetricOption, SetOption, app, console, print_wrote, resolve_config
from r1trade.cli.ladder_commands import LEVEL_HELP, check_level
from r1trade.config import MAX_BOOTSTRAP_RESAMPLES
from r1trade.errors import TrainingInterrupted, UsageError


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
    metric: MetricOption = None,
    every: EveryOption = 1,
    ladder: Annotated[
        Path | None, typer.Option(help="also add a record per seed to this ladder, as soon as the seed is tested")
    ] = None,
    level: Annotated[str | None, typer.Option(help=f"with --ladder: {LEVEL_HELP}")] = None,
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
    from r1trade.backtest.step_selection import DEFAULT_METRIC
    from r1trade.seeds import (
        SeedResult,
        add_ladder_record,
        default_out_dir,
        ladder_model,
        parse_seeds,
        run_seeds,
        wants_warmstart,
    )

    chosen = parse_seeds(seeds)
    metric = metric or DEFAULT_METRIC
    if (ladder is None) != (level is None):
        raise UsageError("--ladder and --level go together: give both to add ladder records, or neither")
    if level is not None:
        check_level(level)
    resolved = resolve_config(config, set_)
    out = out or default_out_dir(resolved)
    flags = [*(["--warmstart"] if warm else ["--no-warmstart"] if warm is False else []),
             *(["--warmstart-from", str(warm_from)] if warm_from is not None else []),
             *(part for item in set_ or [] for part in ("--set", item))]
    command = shlex.join(["r1trade", "seeds", "--config", config, "--seeds", seeds, *flags,
                          "--out", str(out), "--metric", metric, "--every", str(every)])
    model = ladder_model(resolved, warm=wants_warmstart(resolved, warm))

    def record(result: SeedResult) -> None:  # as soon as a seed is tested: a later seed's stop keeps it
        records = add_ladder_record(result, ladder, level=level,  # type: ignore[arg-type]
                                    variant=variant or out.name, model=model, command=command)
        console.print(f"seed {result.seed}: ladder record written ({ladder}: {len(records)} records)",
                      markup=False, highlight=False)

    try:
        outcome = run_seeds(config, set_ or [], chosen, warm=warm, out_dir=out, metric=metric, every=every,
                            warm_from=warm_from, on_tested=None if ladder is None else record, console=console)
    except TrainingInterrupted as stop:
        raise stop.continued_by("the same r1trade seeds command (what finished is skipped)") from None
    held = ",".join(str(result.seed) for result in outcome.summarised)
    title = f"{config} · seeds {held} · step chosen on validation by {metric} · held out: test split"
    console.print(_seeds_table(outcome, title=escape(title)))
    print_wrote(str(outcome.file))


def _seeds_table(outcome, *, title: str) -> Table:  # outcome: SeedsOutcome
    """Each seed's chosen step and figures, then each figure's mean, sd, worst seed and IQM (short headers:
    the full names are in seeds.json); a figure no seed's report has (the mandate's outside its rung) is left
    out."""
    from r1trade.backtest.report_runs import MANDATE_PENALTY, REALISED_VOLATILITY
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
