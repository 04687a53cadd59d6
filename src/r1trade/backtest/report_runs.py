"""What a backtest report is made of: each strategy's run (`StrategyRun`), what the runs were measured on
(`ReportContext`), a walk-forward fold (`FoldReport`), the rows that rank, and how a value reads."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from r1trade.backtest.metrics import annualisation_note, too_short_to_annualise
from r1trade.backtest.significance import DeflatedSharpe, MinTrackRecord, ProbabilisticSharpe
from r1trade.backtest.superiority import SuperiorityTest
from r1trade.config import Config
from r1trade.data.splits import Splits
from r1trade.data.synthetic import decision_grid

HIGHER_IS_BETTER = frozenset({
    "Equity Final", "Return [%]", "CAGR [%]", "Sharpe Ratio", "Sortino Ratio", "Calmar Ratio",
    "Max. Drawdown [%]", "Win Rate [%]", "Profit Factor", "Valid Tool Calls [%]", "Direction Accuracy [%]",
})


MANDATE_PENALTY, REALISED_VOLATILITY, TARGET_VOLATILITY, SIZE_VOLATILITY_CORRELATION = MANDATE_ROWS = (
    "Mandate Penalty", "Realised Volatility [%]", "Target Volatility [%]", "Size-Volatility Rank Correlation"
)
"""The volatility-target mandate's rows (`r1trade.backtest.mandate`), shown only under that mandate."""


LOWER_IS_BETTER = frozenset({
    "Volatility (Ann.) [%]", "Max. Drawdown Duration [bars]", "Malformed Turns [%]", MANDATE_PENALTY,
})
"""Rows where one value is plainly best; exposure, trade count, fees, turnover, the action mix and its entropy
describe but do not rank, nor does a mandate's realised volatility (its closeness to the target is the
penalty) or its size-volatility correlation (how negative a good sizer's is depends on how forecastable the
volatility is)."""


@dataclass(frozen=True)
class StrategyRun:
    """One strategy's backtest, in the shape every report output needs.

    equity: value at each bar's close, on a DatetimeIndex. trades: one row per round trip (the engine's
    TRADE_COLUMNS, plus columns such as `seed`, or a model run's `window`, `exit_reason` and `reasoning`).
    metrics: the `compute_metrics` table. extra: further rows shown below the metrics (a model's valid-tool-call
    rate and action mix, the random baseline's seed count). note: how to read the numbers (e.g. averaged over
    seeds, or a model run's evaluation protocol).
    hits: per scored decision, 1 if its direction was right, else 0 (for the random baseline, the share of its
    seeds that were right); actions: a model's trade action per decision. ci95: 95 % intervals per metric;
    vs_buy_and_hold: a model's paired intervals of its differences with buy-and-hold, their point values
    (`difference`) and the `verdict` on the `verdict_on` metric; deflated_sharpe, psr, min_track_record: see
    `significance`; superiority: for a benchmark run, the SPA and StepM tests of the other runs against it.
    checkpoint: the checkpoint a trained agent's policy came from (in a walk-forward, each fold's own).
    exposures: under a volatility-target mandate, the long size held after each scored decision, (D,), or
    (seeds, D) for a run averaged over seeds (`r1trade.backtest.mandate`).
    """

    name: str
    equity: pd.Series
    trades: pd.DataFrame
    metrics: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    hits: np.ndarray | None = None
    actions: tuple[str, ...] = ()
    ci95: dict[str, tuple[float, float]] = field(default_factory=dict)
    vs_buy_and_hold: dict[str, Any] | None = None
    deflated_sharpe: DeflatedSharpe | None = None
    psr: ProbabilisticSharpe | None = None
    min_track_record: MinTrackRecord | None = None
    superiority: SuperiorityTest | None = None
    checkpoint: Path | None = None
    exposures: np.ndarray | None = None

    @property
    def rows(self) -> dict[str, Any]:
        """The metrics followed by the extra rows."""
        return {**self.metrics, **self.extra}

    @property
    def table_rows(self) -> dict[str, Any]:
        """What tables show: the metrics, the intervals as text, the verdict, the deflated Sharpe ratio, then
        the extra rows."""
        shown: dict[str, Any] = {f"{metric} 95 % CI": interval_text(ci) for metric, ci in self.ci95.items()}
        if self.vs_buy_and_hold is not None:
            versus = self.vs_buy_and_hold
            shown.update({
                f"{metric} − buy_and_hold 95 % CI": interval_text(versus[metric])
                for metric in versus["difference"]
            })
            shown["vs buy_and_hold (95 %)"] = versus["verdict"]
        if self.deflated_sharpe is not None:
            deflated = self.deflated_sharpe
            shown[f"Deflated Sharpe Ratio ({deflated.trials} trials)"] = deflated.probability
        return {**self.metrics, **shown, **self.extra}


@dataclass(frozen=True)
class ReportContext:
    """What the runs were measured on: the resolved config (data path, costs, risk-free rate), the splits.

    `first_bar` and `last_bar` (positions in the split, inclusive) restrict the evaluation to part of the
    split: a model needs warm-up history before its first decision, and every strategy is then measured on
    the same bars. `last_bar` None means the split's last bar.
    `span`: candles evaluated in place of a split (a walk-forward over every bar after the train split, whose
    `split` is then "all"); positions are then in it.
    """

    config: Config
    splits: Splits
    split: str
    bars_per_year: float
    first_bar: int = 0
    last_bar: int | None = None
    span: pd.DataFrame | None = None

    @property
    def split_candles(self) -> pd.DataFrame:
        """Every candle of the split, or of the span (history included)."""
        return self.splits.get(self.split) if self.span is None else self.span

    @property
    def bars(self) -> slice:
        """The evaluated bars as a slice of the split."""
        return slice(self.first_bar, None if self.last_bar is None else self.last_bar + 1)

    @property
    def candles(self) -> pd.DataFrame:
        """The evaluated candles."""
        return self.split_candles.iloc[self.bars]

    @property
    def is_partial(self) -> bool:
        """Whether only part of the split is evaluated."""
        return len(self.candles) < len(self.split_candles)

    @property
    def span_days(self) -> float:
        """Elapsed time of the evaluated candles, first to last bar, in days."""
        index = self.candles.index
        return (index[-1] - index[0]).total_seconds() / 86400 if len(index) else 0.0

    @property
    def too_short_to_annualise(self) -> bool:
        """Whether the evaluated span is under `backtest.min_annualise_days` (CAGR, Sortino, Calmar: NaN)."""
        return too_short_to_annualise(self.span_days, self.config.backtest.min_annualise_days)

    @property
    def annualisation_note(self) -> str:
        """How the annualised rows are computed and, on a short span, why some are not shown."""
        return annualisation_note(
            self.span_days,
            bars_per_year=self.bars_per_year,
            min_annualise_days=self.config.backtest.min_annualise_days,
        )

    @property
    def decision_bars(self) -> np.ndarray:
        """The decisions every strategy is scored on (`Direction Accuracy [%]`), as positions among the
        evaluated bars: every `env.decision_every` bars from the first evaluated bar (on generated data with a
        planted edge, from the first planted interval end at or after it), as long as a whole interval of
        `decision_every` bars follows within the evaluated bars. With a model in the backtest the evaluated
        bars are its plan's, so these are exactly the model's decision bars."""
        every = self.config.env.decision_every
        grid = decision_grid(self.split_candles)
        first = self.first_bar if grid is None else grid.next_on_grid(self.first_bar)
        last = self.first_bar + len(self.candles) - 1
        return np.arange(first, last - every + 1, every, dtype=np.int64) - self.first_bar

    @property
    def decision_note(self) -> str:
        """What `Direction Accuracy [%]` and `Action Entropy [nats]` measure, on which decisions."""
        bars, every = self.decision_bars, self.config.env.decision_every
        if len(bars) == 0:
            scope = f"no decision (none has a whole interval of {every} bars after it, so it shows —)"
        else:
            first = self.first_bar + int(bars[0])
            when = f"{self.split_candles.index[first]:%Y-%m-%d %H:%M}"
            scope = (
                f"{len(bars):,} decisions, one every {every} bars (env.decision_every) from bar {first:,} of "
                f"the split ({when} UTC), the same decision bars for every strategy"
            )
        return (
            f"Direction Accuracy [%] scores {scope}: the share of decisions after which the position held "
            "(long or short, after the decision's fill at the next open) points the way the price moved from "
            f"that open to the close {every} bars after the decision; being flat, or a move of exactly zero, "
            "counts as wrong. Rule baselines are scored on the position they hold right after each decision "
            "bar's fill. Action Entropy [nats] (models only) is the entropy of the model's trade actions "
            "over its decisions (long, short, hold, close; a forced hold counts as hold): 0 when it always "
            "does the same, ln 4 = 1.39 when all four are equally frequent."
        )

    @property
    def mandate_note(self) -> str:
        """What the volatility-target mandate's rows measure ("" without the mandate)."""
        config = self.config
        if config.env.mandate != "vol_target":
            return ""
        every, target = config.env.decision_every, 100 * config.rewards.vol_target
        sizes = ", ".join(f"{size:g}" for size in config.env.exposures)
        return (
            f"Volatility-target mandate (target {target:g} % a year, sizes {sizes}): every strategy decides "
            f"at the decision bars only and holds its size w for the {every} bars that follow; σ is the "
            "market's realised volatility over those bars (std of log-returns, annualised over a 365-day "
            f"year). Mandate Penalty is the mean of ((w σ − {target:g} %) / {target:g} %)² over the "
            "decisions, the agent's reward with its sign turned (cash: 1, lower is better); Realised "
            "Volatility [%] is the root mean square of w σ against Target Volatility [%]. Size-Volatility Rank "
            "Correlation is Spearman's between w and σ over the decisions: negative when a strategy holds less "
            "through the more volatile days, none (—) for a constant size. best_constant holds "
            "the size with the lowest mean penalty on the train split, and vol_forecast the size with the "
            "lowest expected penalty under a forecast of σ fitted there on the two volatilities get_volatility "
            "shows; the Mandate Penalty − best_constant interval pairs a run with best_constant on the same "
            "resampled decisions."
        )

    @property
    def quote_currency(self) -> str:
        """The currency money is counted in: the part of the symbol after '/' (BTC/USD → USD)."""
        symbol = str(self.candles.attrs.get("symbol", ""))
        return symbol.rsplit("/", 1)[-1] if "/" in symbol else "quote currency"


@dataclass(frozen=True)
class FoldReport:
    """One walk-forward fold: its number (from 1), the bars it evaluated and its runs."""

    number: int
    context: ReportContext
    runs: list[StrategyRun]


def has_intervals(runs: Sequence[StrategyRun]) -> bool:
    return any(run.ci95 for run in runs)


def interval_text(interval: tuple[float, float]) -> str:
    low, high = interval
    return f"[{format_value('', low)}, {format_value('', high)}]"


def format_value(row: str, value: Any) -> str:
    """A metric for people: dates to the minute, counts without decimals, everything else with two."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, pd.Timestamp):
        return f"{value:%Y-%m-%d %H:%M}"
    if isinstance(value, str):
        return value
    number = float(value)
    if math.isinf(number):
        return "∞" if number > 0 else "-∞"
    if number.is_integer() and (row.startswith("#") or "[bars]" in row or row == "Seeds"):
        return f"{number:,.0f}"
    return f"{number:,.2f}"
