"""The command line's one Typer app, its consoles, the options its commands share, and the root options."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from r1trade import __version__
from r1trade.config import Config, load_config

app = typer.Typer(
    name="r1trade",
    help="Train a small language model with multi-turn RL to trade crypto through tools, then backtest it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


ConfigOption = Annotated[
    str | None, typer.Option("--config", "-c", help="config name in configs/ (e.g. btc_momentum) or a YAML path")
]
SetOption = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="override a config field: section.key=value (repeatable)")
]


def print_wrote(what: str) -> None:
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


def resolve_config(config: str | None, overrides: list[str] | None) -> Config:
    """Load and validate the config before a command does anything else."""
    return load_config(config, overrides or [])



MetricOption = Annotated[
    str | None,
    typer.Option(help="the agent's report row to choose by: the highest wins, the lowest for a row such as "
                 "'Mandate Penalty' (default: Direction Accuracy [%])"),
]
EveryOption = Annotated[
    int, typer.Option(min=1, help="only the checkpoints whose step is a multiple of N, and the last")
]
