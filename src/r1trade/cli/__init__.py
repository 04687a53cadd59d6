"""The `r1trade` command line: each command loads its config, calls one function, prints a Rich summary."""

from __future__ import annotations

import inspect
import sys

import click
import typer
from rich.markup import escape

from r1trade.cli.app import app, err_console
from r1trade.errors import R1TradeError, TrainingInterrupted

# Importing a command module registers its commands; `r1trade --help` lists them in this order.
# isort: off
from r1trade.cli import data_commands, train_commands, ladder_commands  # noqa: F401
from r1trade.cli import backtest_commands, seeds_commands, paper_commands  # noqa: F401
# isort: on


def _flow_help_paragraphs() -> None:
    """Typer keeps the line breaks of a command's docstring after its first paragraph, which leaves ragged help
    on a narrow terminal; each paragraph on one line wraps at the terminal's width."""
    for command in app.registered_commands:
        text = inspect.getdoc(command.callback) if command.help is None else command.help
        command.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in (text or "").split("\n\n"))


_flow_help_paragraphs()

CLICK_ERRORS = (click.ClickException, *([typer.TyperException] if hasattr(typer, "TyperException") else []))
"""Usage errors from click, and from the copy of click that newer typer releases carry."""


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

