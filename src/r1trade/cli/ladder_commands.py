"""Commands over the ladder of learning runs (docs/results/ladder.json): add a record, summarise a level's
variants, and the probability that its best run is overfit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from r1trade.cli.app import app, console
from r1trade.errors import UsageError

LADDER = Path("docs/results/ladder.json")
LADDER_COLUMNS = {"direction_accuracy": "Direction Accuracy [%]", "signal_call_rate": "get_changes called [%]",
                  "info_call_rate": "Info Calls [%]", "forced_hold_rate": "Forced Holds [%]",
                  "return_pct": "Return [%]", "mandate_penalty": "Mandate Penalty",
                  "warmstart_mandate_penalty": "warm start's penalty", "vol_target_rule_penalty": "vol_target rule's",
                  "best_constant_penalty": "best constant's", "vol_forecast_penalty": "vol_forecast's",
                  "realised_volatility_pct": "Realised Volatility [%]",
                  "size_volatility_correlation": "size-volatility ρ"}

LEVEL_HELP = "planted_edge, btc, tool_gated, multi_decision or vol_target"
LevelOption = Annotated[str, typer.Option(help=LEVEL_HELP)]


def check_level(level: str) -> None:
    """`level` as a ladder level, or a one-line usage error naming them (read lazily: commands start fast)."""
    from r1trade.eval.ladder import LEVELS

    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, not '{level}'")



@app.command("ladder-record")
def ladder_record_command(
    report: Annotated[Path, typer.Option(help="a backtest report directory (its metrics.json)")],
    checkpoint: Annotated[Path, typer.Option(help="the evaluated checkpoint, runs/<name>/checkpoints/step-N")],
    level: LevelOption,
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
    from r1trade.eval.ladder import add_record, ladder_record

    check_level(level)
    record = ladder_record(report, checkpoint, level=level, variant=variant, model=model, command=command,
                           agent=agent, warmstart=warmstart, seed=seed)  # type: ignore[arg-type]
    records = add_record(ladder, record)
    console.print_json(json.dumps(record))
    console.print(f"{ladder}: {len(records)} records", markup=False, highlight=False, soft_wrap=True)


@app.command("ladder-summary")
def ladder_summary_command(
    level: LevelOption,
    prefix: Annotated[str, typer.Option(help="only variants whose name starts with this")] = "",
    ladder: Annotated[Path, typer.Option(help="the ladder file")] = LADDER,
) -> None:
    """Each variant's held-out figures over its seeds, mean ± standard deviation and range, as a Markdown
    table (the ablation tables of docs/results.md)."""
    from r1trade.eval.ladder import read_ladder, summarise, summary_fields

    check_level(level)
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
    level: LevelOption,
    ladder: Annotated[Path, typer.Option(help="the ladder file")] = LADDER,
    prefix: Annotated[str, typer.Option(help="only variants whose name starts with this")] = "",
    blocks: Annotated[int, typer.Option(help="S: the even number of blocks CSCV cuts the decisions into")] = 16,
) -> None:
    """Probability of backtest overfitting (CSCV) over a level's runs, from the per-decision returns of the
    reports their ladder records name."""
    from r1trade.backtest.ladder_overfitting import ladder_overfitting

    check_level(level)
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
