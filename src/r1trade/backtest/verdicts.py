"""The verdicts of a backtest that count every trial: how many variants were tried on this market, each run's
probabilistic Sharpe ratio and minimum track record, and the SPA and StepM tests against the benchmarks.

All of them work on per-decision excess returns (`decision_returns`): a decision's return over its bars less
the risk-free rate compounded over them, the same returns the deflated Sharpe ratio uses.

- Trials (`count_trials`): with `--trials N`, N. Otherwise, for a report with models, the number of ladder
  records (`backtest.ladder`) of the level this config's market belongs to (`backtest.ladder_level`): every
  variant reported on that market was a trial, at least as many as the report's models. Without a level, or
  when the ladder is missing, the report's models, as before.
- PSR and MinTRL (`r1trade.backtest.significance`): against a Sharpe ratio of 0 (`PSR_BENCHMARK`) at 95 %
  (`CONFIDENCE`), per decision; the minimum track record is also given in years of a 24/7 market (365-day
  year), a decision spanning the mean bars per decision of the run.
- SPA and StepM (`r1trade.backtest.superiority`): every other strategy and model of the report against
  buy-and-hold and against a `vol_target` baseline (`BENCHMARKS`), with the bootstrap settings of the report's
  intervals. Under the volatility-target mandate the test against `vol_target` asks the mandate's question, on
  each decision's miss instead of its return, so `r1trade.backtest.mandate` runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from r1trade.backtest.bootstrap import DecisionSample
from r1trade.backtest.mandate import MANDATE_BENCHMARK, is_mandate
from r1trade.backtest.metrics import per_bar_rate
from r1trade.backtest.report_runs import ReportContext
from r1trade.backtest.significance import (
    MinTrackRecord,
    ProbabilisticSharpe,
    min_track_record,
    probabilistic_sharpe,
)
from r1trade.backtest.superiority import SuperiorityTest, superiority_test
from r1trade.config import Config, resolve_path
from r1trade.errors import ConfigError
from r1trade.eval.ladder import LEVELS, read_ladder

BENCHMARKS = ("buy_and_hold", MANDATE_BENCHMARK)
"""What the SPA and StepM tests compare every other run of a report against, where the report has them."""
PSR_BENCHMARK = 0.0
"""SR*: the per-decision Sharpe ratio the PSR and the minimum track record are judged against."""
CONFIDENCE = 0.95
"""The confidence the minimum track record length is computed for."""


@dataclass(frozen=True)
class Trials:
    """How many variants were tried on this data, and where that number comes from."""

    count: int
    source: str


def count_trials(config: Config, *, models: int, given: int | None = None) -> Trials:
    """The trials a report's deflated Sharpe ratios count (see the module docstring)."""
    if given is not None:
        return Trials(given, "given with --trials")
    level = config.backtest.ladder_level
    own = Trials(models, f"the {models} model{'s' if models != 1 else ''} of this report")
    if models == 0 or level is None:
        return own
    if level not in LEVELS:
        raise ConfigError(f"backtest.ladder_level '{level}': use one of {', '.join(LEVELS)}")
    path = resolve_path(config.backtest.ladder)
    if not path.is_file():
        return Trials(models, f"{own.source} (no ladder at {config.backtest.ladder})")
    records = sum(record.get("level") == level for record in read_ladder(path))
    return Trials(max(records, models), f"the {records} {level} records of {config.backtest.ladder}")


def decision_returns(sample: DecisionSample, context: ReportContext) -> np.ndarray:
    """(D,) excess return of each decision: its growth less the risk-free growth over its bars."""
    rate = context.config.backtest.risk_free_rate
    return sample.excess_returns(per_bar_rate(rate, context.bars_per_year) if rate else 0.0)


def track_record(sample: DecisionSample, context: ReportContext) -> tuple[ProbabilisticSharpe, MinTrackRecord]:
    """The run's PSR(`PSR_BENCHMARK`) and minimum track record at `CONFIDENCE`, in decisions and years."""
    returns = decision_returns(sample, context)
    period_years = float(sample.bars.sum()) / len(sample) / context.bars_per_year
    return (
        probabilistic_sharpe(returns, benchmark=PSR_BENCHMARK),
        min_track_record(returns, period_years=period_years, benchmark=PSR_BENCHMARK, confidence=CONFIDENCE),
    )


def superiority_tests(returns: Mapping[str, np.ndarray], context: ReportContext) -> list[SuperiorityTest]:
    """SPA and StepM against each of `BENCHMARKS` the report has, when it has another run and 3 decisions."""
    settings = context.config.backtest
    count = len(next(iter(returns.values()))) if returns else 0
    if len(returns) < 2 or count < 3:
        return []
    return [
        superiority_test(
            returns, benchmark, block=settings.bootstrap_block, resamples=settings.bootstrap_resamples,
            seed=context.config.seed,
        )
        for benchmark in BENCHMARKS if benchmark in returns
        and not (benchmark == MANDATE_BENCHMARK and is_mandate(context.config))
    ]
