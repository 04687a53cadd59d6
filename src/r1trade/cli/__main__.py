"""`python -m r1trade.cli`: the `r1trade` command."""

from r1trade.cli import run

run()
