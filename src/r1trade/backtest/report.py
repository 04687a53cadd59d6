"""Backtest reports for any mix of strategies (rule baselines, the trained agent): files and a terminal table.

`write_report` writes, into one directory: `metrics.json` (every strategy's metrics, the splits, the costs),
`trades.csv` (all round trips, a `strategy` column first), `equity.csv` (one column per strategy),
`hits.csv` (per scored decision, whether each strategy's direction was right: what paired comparisons of runs
on the same decisions resample, `r1trade compare-seeds`), `equity.png` (equity curves and a drawdown panel),
`report.html` (self-contained: inline CSS, the PNG embedded as base64, no scripts), `metrics.md` (the metrics
as a Markdown table) and the resolved `config.yaml`. `comparison_tables` is the same metrics as Rich tables.

JSON has no NaN or infinity, so metrics.json writes NaN as null and ±infinity as the strings "inf" / "-inf"
(a profit factor without a losing trade is infinite).

On a span shorter than `backtest.min_annualise_days`, CAGR, Sortino and Calmar are NaN (null in JSON, "—" in
tables); `ReportContext.annualisation_note` says why, in metrics.json, metrics.md, the HTML page and the
terminal.

`Direction Accuracy [%]` scores every strategy on the same decision bars (`ReportContext.decision_bars`, the
models' decisions when models run); `Action Entropy [nats]` is a model's only, "—" (null) for rule baselines.
metrics.json's `decisions` and the HTML page's notes (`ReportContext.decision_note`) define both.

Each strategy's 95 % intervals (`StrategyRun.ci95`, `r1trade.backtest.uncertainty`), a model's comparison with
buy-and-hold and its verdict (`StrategyRun.vs_buy_and_hold`) and its deflated Sharpe ratio are shown as rows
below the metrics and stored beside them in metrics.json; `uncertainty_note` says how they were computed.
The verdicts that count every trial (`r1trade.backtest.verdicts`: each run's probabilistic Sharpe ratio and
minimum track record, the SPA and StepM tests against the benchmarks) follow in a "Verdicts" section
(`verdict_runs`, `superiority_lines`, `verdicts_note`) and in metrics.json (`psr`, `min_track_record` per
strategy; `spa` per benchmark).
A walk-forward backtest (`FoldReport`) shows the pooled runs first and then each fold's.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib.dates as mdates
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from rich.markup import escape
from rich.table import Table

from r1trade import __version__
from r1trade.backtest.metrics import annualisation_note, drawdown, too_short_to_annualise
from r1trade.backtest.significance import DeflatedSharpe, MinTrackRecord, ProbabilisticSharpe
from r1trade.backtest.superiority import RETURN_LOSS, SuperiorityTest
from r1trade.config import Config
from r1trade.data.source import describe_source
from r1trade.data.splits import Splits
from r1trade.data.synthetic import decision_grid
from r1trade.outputs import write_folder

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

MAX_HTML_TRADES = 500
"""Trades listed per strategy in the HTML page; trades.csv always has them all."""

HITS_FILE = "hits.csv"
"""Per scored decision, each strategy's hit: what paired comparisons of runs on the same decisions resample."""

_DATA_ATTRS = ("symbol", "timeframe", "source")
_DIRECTIONS = {1: "long", -1: "short"}
_TRADE_HEADERS = {
    "entry_time": "Entry", "exit_time": "Exit", "entry_bar": "Entry Bar", "exit_bar": "Exit Bar",
    "direction": "Side", "units": "Units", "entry_price": "Entry Price", "exit_price": "Exit Price",
    "fees": "Fees", "pnl": "PnL", "return_pct": "Return [%]", "is_open": "Open", "seed": "Seed",
    "window": "Window", "exit_reason": "Exit Reason", "reasoning": "Reasoning",
}


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
        shown: dict[str, Any] = {f"{metric} 95 % CI": _interval_text(ci) for metric, ci in self.ci95.items()}
        if self.vs_buy_and_hold is not None:
            versus = self.vs_buy_and_hold
            shown.update({
                f"{metric} − buy_and_hold 95 % CI": _interval_text(versus[metric])
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


def write_report(
    runs: list[StrategyRun], context: ReportContext, out_dir: Path, folds: Sequence[FoldReport] = ()
) -> list[Path]:
    """Write every report file into a fresh folder that replaces `out_dir` as a whole; return their paths.

    With `folds` (walk-forward), `runs` are the pooled runs and `context` spans the folds."""
    png = equity_png(runs, context)
    notes = [context.annualisation_note] if context.too_short_to_annualise else []
    notes += [*verdict_lines(runs), *([uncertainty_note(runs, context)] if _has_intervals(runs) else [])]
    notes += [context.mandate_note] if context.mandate_note else []
    markdown = markdown_table(runs, note="\n\n".join(notes) or None) + verdicts_markdown(runs, context)
    for fold in folds:
        markdown += f"\n## Fold {fold.number}: {_period(fold.context.candles)}\n\n" + markdown_table(
            fold.runs, note="\n\n".join(verdict_lines(fold.runs)) or None
        )
    files: dict[str, str | bytes] = {
        "metrics.json": json.dumps(metrics_document(runs, context, folds), indent=2) + "\n",
        "trades.csv": trades_frame(runs).to_csv(index=False),
        "equity.csv": equity_frame(runs).to_csv(),
        HITS_FILE: hits_frame(runs, context).to_csv(),
        "equity.png": png,
        "report.html": render_html(runs, context, png, folds),
        "metrics.md": markdown,
        "config.yaml": context.config.to_yaml(),
    }
    return write_folder(out_dir, files)


def verdict_lines(runs: Sequence[StrategyRun]) -> list[str]:
    """A line per model compared with buy-and-hold: does it beat it at 95 %, on which metric, by how much."""
    lines = []
    for run in runs:
        if run.vs_buy_and_hold is None:
            continue
        versus = run.vs_buy_and_hold
        metric = versus["verdict_on"]
        low, high = versus[metric]
        verb = {
            "better": "beats buy-and-hold", "worse": "does worse than buy-and-hold",
            "undecided": "neither beats nor trails buy-and-hold",
        }[versus["verdict"]]
        lines.append(
            f"{run.name} {verb} at 95 %: its {metric} minus buy-and-hold's is "
            f"{versus['difference'][metric]:+,.2f} (95 % interval {low:+,.2f} to {high:+,.2f})."
        )
    return lines


def uncertainty_note(runs: Sequence[StrategyRun], context: ReportContext) -> str:
    """How the intervals, the verdicts and the deflated Sharpe ratios were computed."""
    settings = context.config.backtest
    text = (
        "95 % CI: percentile intervals of a stationary block bootstrap (Politis & Romano 1994) over the "
        f"scored decisions: blocks of consecutive decisions of mean length {settings.bootstrap_block}, "
        f"{settings.bootstrap_resamples:,} resamples, seed {context.config.seed}; each decision carries the "
        "bar returns up to the next decision. A model's differences with buy_and_hold resample both on the "
        "same decisions; its verdict is better (worse) when the interval of the Return [%] difference lies "
        "above (below) 0, else undecided."
    )
    deflated = [run.deflated_sharpe for run in runs if run.deflated_sharpe is not None]
    if deflated:
        text += (
            f" Deflated Sharpe Ratio (Bailey & López de Prado 2014; {deflated[0].trials} trials): the "
            "probability that the per-decision Sharpe ratio beats the expected best of that many skill-less "
            "trials, given the returns' skewness and kurtosis; above 0.95 it is significant at 95 %."
        )
    return text


def verdict_runs(runs: Sequence[StrategyRun]) -> list[StrategyRun]:
    """The runs with a track record, their rows replaced by the Verdicts section's (for the tables'
    renderers): decisions, per-decision Sharpe ratio, PSR, minimum track record and, per benchmark, StepM's
    finding."""
    tests = [run.superiority for run in runs if run.superiority is not None]
    shown = []
    for run in runs:
        psr, record = run.psr, run.min_track_record
        if psr is None or record is None:
            continue
        rows: dict[str, Any] = {
            "Decisions": f"{psr.observations:,}",
            "Sharpe per Decision": _three_decimals(psr.sharpe),
            "PSR (Sharpe > 0)": _three_decimals(psr.probability),
            "Min. Track Record [decisions]": _whole_text(record.periods),
            "Min. Track Record [years]": record.years,
        }
        for test in tests:
            rows[f"StepM vs {test.benchmark} ({100 * test.size:g} %)"] = (
                "benchmark" if run.name == test.benchmark else "better" if run.name in test.superior
                else "tied" if run.name in test.tied else "not shown better"
            )
        shown.append(StrategyRun(name=run.name, equity=run.equity, trades=run.trades, metrics=rows))
    return shown


def superiority_lines(runs: Sequence[StrategyRun]) -> list[str]:
    """A line per benchmark: SPA's p-value over every other run, and the runs StepM finds better."""
    lines = []
    for test in (run.superiority for run in runs if run.superiority is not None):
        level = f"{100 * (1 - test.size):g} %"
        found = "the best of them beats it" if test.pvalue < test.size else "none is shown to beat it"
        better = ", ".join(test.superior) or "none"
        tied = f" ({', '.join(test.tied)}: the benchmark's losses, left out)" if test.tied else ""
        count = f"{len(test.candidates)} run{'s' if len(test.candidates) > 1 else ''}"
        on = "" if test.loss == RETURN_LOSS else f", on {test.loss}"
        lines.append(
            f"SPA against {test.benchmark} over {count}{tied}{on}: p = {test.pvalue:.3f}, {found} at {level} "
            f"once all are counted; StepM finds better: {better}."
        )
    return lines


def verdicts_note(runs: Sequence[StrategyRun], context: ReportContext) -> str:
    """How the Verdicts section's figures were computed, and the trials the deflated Sharpe ratios count."""
    settings = context.config.backtest
    records = [run.min_track_record for run in runs if run.min_track_record is not None]
    tests = [run.superiority for run in runs if run.superiority is not None]
    confidence = f"{100 * records[0].confidence:g} %" if records else "95 %"
    size = f"{100 * tests[0].size:g} %" if tests else "5 %"
    text = (
        "Per-decision excess returns (a decision's return over its bars less the risk-free rate). PSR "
        "(Bailey & López de Prado 2012): the probability that the true per-decision Sharpe ratio exceeds 0, "
        "given the returns' skewness and kurtosis. Min. Track Record: the decisions needed for the PSR to "
        f"reach {confidence} (∞ when the Sharpe ratio is not above 0), and the years they span in a market "
        "open 24/7 at the run's mean bars per decision; the record is long enough when Decisions reaches it. "
        "SPA (Hansen 2005) and "
        "StepM (Romano & Wolf 2005), from the arch package: every other run against the benchmark on "
        "per-decision losses (minus the excess return), stationary bootstrap of mean block "
        f"{settings.bootstrap_block} decisions, {settings.bootstrap_resamples:,} resamples, seed "
        f"{context.config.seed}; SPA's p-value accounts for the best run having been picked after the fact, "
        f"StepM names the runs better than the benchmark at {size} family-wise error."
    )
    other = sorted({f"against {test.benchmark}, {test.loss}" for test in tests if test.loss != RETURN_LOSS})
    if other:
        text += f" Losses otherwise: {'; '.join(other)}."
    deflated = [run.deflated_sharpe for run in runs if run.deflated_sharpe is not None]
    if deflated:
        source = f": {deflated[0].trials_source}" if deflated[0].trials_source else ""
        text += f" Deflated Sharpe Ratio: {deflated[0].trials} trials{source}."
    return text


def verdicts_markdown(runs: Sequence[StrategyRun], context: ReportContext) -> str:
    """The Verdicts section of metrics.md ("" when no run has decisions to judge)."""
    shown = verdict_runs(runs)
    if not shown:
        return ""
    note = "\n\n".join([*superiority_lines(runs), verdicts_note(runs, context)])
    return "\n## Verdicts\n\n" + markdown_table(shown, note=note)


def _three_decimals(value: float) -> str:
    """A small ratio or probability, where two decimals would hide it: "—" when undefined."""
    return "—" if math.isnan(value) else f"{value:.3f}"


def _whole_text(count: float) -> str:
    """A count that may be fractional, rounded up: "—" when undefined, "∞" when infinite."""
    if math.isnan(count):
        return "—"
    return "∞" if math.isinf(count) else f"{math.ceil(count):,}"


def _has_intervals(runs: Sequence[StrategyRun]) -> bool:
    return any(run.ci95 for run in runs)


def _interval_text(interval: tuple[float, float]) -> str:
    low, high = interval
    return f"[{format_value('', low)}, {format_value('', high)}]"


# --------------------------------------------------------------------------- tables and JSON


def metrics_document(
    runs: list[StrategyRun], context: ReportContext, folds: Sequence[FoldReport] = ()
) -> dict[str, Any]:
    """What metrics.json holds: the setting (data, split, period, costs, splits) and each strategy's rows,
    with its intervals; with `folds`, each fold's range and runs, the top-level strategies being pooled."""
    config, candles = context.config, context.candles
    index, bars = candles.index, context.decision_bars
    decisions = {
        "first_bar": context.first_bar + int(bars[0]) if len(bars) else None,
        "every": context.config.env.decision_every,
        "count": len(bars),
        "note": context.decision_note,
    }
    if folds:
        decisions = {
            **decisions,
            "first_bar": _first_decision(folds[0].context),
            "count": sum(len(fold.context.decision_bars) for fold in folds),
            "note": "pooled over the folds' decisions (each fold's are in `folds`); fold 1: "
            + folds[0].context.decision_note,
        }
    document = {
        "config": config.name,
        "data": {
            "path": config.data.path if config.data.source == "file" else None,
            **{key: candles.attrs.get(key) for key in _DATA_ATTRS},
            **({"synthetic": config.data.synthetic.model_dump(mode="json")} if config.data.source == "synthetic"
               else {}),
        },
        "split": context.split,
        "period": {"start": index[0].isoformat(), "end": index[-1].isoformat(), "bars": len(candles)},
        "evaluated_bars": {"first": context.first_bar, "last": context.first_bar + len(candles) - 1},
        "splits": context.splits.describe(),
        "embargo_bars": config.data.split.embargo_bars,
        "costs": {
            "initial_cash": config.env.initial_cash,
            "fee_bps": config.env.fee_bps,
            "slippage_bps": config.env.slippage_bps,
        },
        "bars_per_year": context.bars_per_year,
        "risk_free_rate": config.backtest.risk_free_rate,
        "min_annualise_days": config.backtest.min_annualise_days,
        "annualisation": context.annualisation_note,
        "decisions": decisions,
        "strategies": {run.name: strategy_entry(run) for run in runs},
        "notes": {run.name: run.note for run in runs if run.note},
    }
    if _has_intervals(runs):
        document["uncertainty"] = {
            "method": "stationary block bootstrap over decisions (Politis & Romano 1994), percentiles",
            "level": 0.95,
            "mean_block_decisions": config.backtest.bootstrap_block,
            "resamples": config.backtest.bootstrap_resamples,
            "seed": config.seed,
            "note": uncertainty_note(runs, context),
        }
    if context.mandate_note:
        document["mandate"] = {
            "kind": "vol_target",
            "target_vol": config.rewards.vol_target,
            "exposures": list(config.env.exposures),
            "note": context.mandate_note,
        }
    if any(run.psr is not None for run in runs):
        document["verdicts"] = verdicts_document(runs, context)
    if spa := spa_document(runs):
        document["spa"] = spa
    if folds:
        document["walk_forward"] = {
            "folds": len(folds),
            "span": context.split,
            "embargo_bars": config.data.split.embargo_bars,
            "pooled": POOLED_NOTE,
        }
        document["folds"] = [_fold_entry(fold) for fold in folds]
    return document


POOLED_NOTE = (
    "Each fold is backtested on its own, every strategy starting flat with the initial cash. The pooled "
    "run chains the folds: fold k's equity curve, less its first bar (the flat start), is compounded on the "
    "pooled equity at the end of fold k - 1, so its per-bar returns are exactly the folds' returns, in "
    "order, and its Return [%] is the compounded return of the folds; Sharpe, volatility and drawdowns are "
    "computed on it (CAGR over the time from the first fold's start to the last fold's end, gaps included). "
    "Trades are the folds' round trips with money scaled to that equity; # Trades, Win Rate [%] and Exposure "
    "Time [%] combine the folds' rows weighted by trades and bars; Direction Accuracy [%], Action Entropy "
    "[nats] and the intervals are over all folds' decisions together."
)
"""What the pooled metrics of a walk-forward backtest are."""


def strategy_entry(run: StrategyRun) -> dict[str, Any]:
    """A strategy in metrics.json: its rows, then its intervals, comparison and deflated Sharpe if present."""
    entry = {key: _jsonable(value) for key, value in run.rows.items()}
    if run.ci95:
        entry["ci95"] = {metric: [_jsonable(v) for v in interval] for metric, interval in run.ci95.items()}
    if run.vs_buy_and_hold is not None:
        entry["vs_buy_and_hold"] = {
            key: (
                [_jsonable(v) for v in value] if isinstance(value, tuple)
                else {k: _jsonable(v) for k, v in value.items()} if isinstance(value, dict)
                else value
            )
            for key, value in run.vs_buy_and_hold.items()
        }
    if run.deflated_sharpe is not None:
        entry["deflated_sharpe"] = {
            key: _jsonable(value) for key, value in asdict(run.deflated_sharpe).items()
        }
    if run.psr is not None:
        entry["psr"] = {key: _jsonable(value) for key, value in asdict(run.psr).items()}
    if run.min_track_record is not None:
        record = run.min_track_record
        entry["min_track_record"] = {
            "decisions": _jsonable(record.periods), "years": _jsonable(record.years),
            "observed_decisions": record.observed, "benchmark": record.benchmark, "confidence": record.confidence,
        }
    return entry


def spa_document(runs: Sequence[StrategyRun]) -> dict[str, Any]:
    """metrics.json's `spa`: per benchmark, the SPA p-values over the other runs and the runs StepM finds better."""
    return {
        test.benchmark: {
            "candidates": list(test.candidates),
            "pvalues": {kind: _jsonable(value) for kind, value in test.pvalues.items()},
            "pvalue": _jsonable(test.pvalue),
            "stepm_better": list(test.superior),
            "tied": list(test.tied),
            "size": test.size,
            "decisions": test.observations,
            "bootstrap": "stationary",
            "mean_block_decisions": test.block,
            "resamples": test.resamples,
            "seed": test.seed,
            "losses": test.loss,
        }
        for test in (run.superiority for run in runs if run.superiority is not None)
    }


def verdicts_document(runs: Sequence[StrategyRun], context: ReportContext) -> dict[str, Any]:
    """metrics.json's `verdicts`: the settings behind `psr`, `min_track_record` and the deflated Sharpe's trials."""
    psr = next(run.psr for run in runs if run.psr is not None)
    record = next(run.min_track_record for run in runs if run.min_track_record is not None)
    deflated = [run.deflated_sharpe for run in runs if run.deflated_sharpe is not None]
    return {
        "returns": "per decision, in excess of the risk-free rate; Sharpe ratios not annualised",
        "psr_benchmark_sharpe": psr.benchmark,
        "min_track_record_confidence": record.confidence,
        **({"trials": deflated[0].trials, "trials_source": deflated[0].trials_source} if deflated else {}),
        "note": verdicts_note(runs, context),
    }


def _first_decision(context: ReportContext) -> int | None:
    bars = context.decision_bars
    return context.first_bar + int(bars[0]) if len(bars) else None


def _fold_entry(fold: FoldReport) -> dict[str, Any]:
    """A fold in metrics.json: its range (timestamps, positions in the evaluated span, bars), its runs and the
    checkpoint each trained agent played it with."""
    context = fold.context
    index = context.candles.index
    entry = {
        "fold": fold.number,
        "start": index[0].isoformat(),
        "end": index[-1].isoformat(),
        "bars": len(index),
        "first_bar": context.first_bar,
        "last_bar": context.first_bar + len(index) - 1,
        "decisions": {"first_bar": _first_decision(context), "count": len(context.decision_bars)},
        "strategies": {run.name: strategy_entry(run) for run in fold.runs},
        "notes": {run.name: run.note for run in fold.runs if run.note},
        **({"spa": spa} if (spa := spa_document(fold.runs)) else {}),
    }
    checkpoints = {run.name: str(run.checkpoint) for run in fold.runs if run.checkpoint is not None}
    return {**entry, "checkpoints": checkpoints} if checkpoints else entry


def trades_frame(runs: list[StrategyRun]) -> pd.DataFrame:
    """All runs' trades in one table, `strategy` first; a column a run lacks stays empty for its rows."""
    frames = [_nullable_integers(run.trades).assign(strategy=run.name) for run in runs]
    columns = ["strategy", *dict.fromkeys(c for frame in frames for c in frame.columns if c != "strategy")]
    filled = [frame for frame in frames if not frame.empty]
    if not filled:
        return pd.DataFrame(columns=columns)
    return pd.concat(filled, ignore_index=True).reindex(columns=columns)


def _nullable_integers(trades: pd.DataFrame) -> pd.DataFrame:
    """Integer columns as pandas' nullable Int64, so rows of other runs that lack them stay integers."""
    integers = [c for c in trades.columns if pd.api.types.is_integer_dtype(trades[c])]
    return trades.astype(dict.fromkeys(integers, "Int64"))


def equity_frame(runs: list[StrategyRun]) -> pd.DataFrame:
    """Equity per bar, one column per strategy, aligned on time."""
    return pd.concat({run.name: run.equity for run in runs}, axis=1)


def hits_frame(runs: list[StrategyRun], context: ReportContext) -> pd.DataFrame:
    """Per scored decision (indexed by its bar's time), one column per strategy scored there: 1 if its direction
    was right, 0 if not (the random baseline: the share of its seeds that were right)."""
    times = context.candles.index[context.decision_bars]
    scored = {run.name: run.hits for run in runs if run.hits is not None and len(run.hits) == len(times)}
    return pd.DataFrame(scored, index=pd.Index(times, name="timestamp"), dtype=float)


def best_strategies(runs: list[StrategyRun]) -> dict[str, set[str]]:
    """For each row where "best" means something, the strategies holding the best value (ties share it).

    Rows with fewer than two comparable (non-NaN) values get no winner.
    """
    best: dict[str, set[str]] = {}
    for row in HIGHER_IS_BETTER | LOWER_IS_BETTER:
        values = {run.name: float(run.rows[row]) for run in runs if _is_number(run.rows.get(row))}
        if len(values) < 2:
            continue
        target = max(values.values()) if row in HIGHER_IS_BETTER else min(values.values())
        best[row] = {name for name, value in values.items() if value == target}
    return best


def row_names(runs: list[StrategyRun]) -> list[str]:
    """Every row tables show (`StrategyRun.table_rows`), in order of first appearance."""
    return list(dict.fromkeys(name for run in runs for name in run.table_rows))


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


def comparison_tables(runs: list[StrategyRun], *, title: str, width: int | None = None) -> list[Table]:
    """Metrics × strategies as Rich tables, the best value of each comparable row in bold green.

    With a `width`, the strategies are split over several tables of whole columns so that each fits it
    (a terminal of 80 columns would otherwise squeeze every number onto several lines); the first keeps the title.
    """
    best = best_strategies(runs)
    rows = row_names(runs)
    texts = {run.name: [escape(format_value(row, run.table_rows.get(row))) for row in rows] for run in runs}

    def column_width(run: StrategyRun) -> int:
        longest_word = max((len(word) for word in run.name.split()), default=1)
        return max(longest_word, *(len(text) for text in texts[run.name]))

    metric_width = max(len(row) for row in rows)
    groups: list[list[StrategyRun]] = [[]]
    used = 1 + metric_width + 3  # left border, then each column: its text, two padding spaces and a border
    for run in runs:
        need = column_width(run) + 3
        if width is not None and groups[-1] and used + need > width:
            groups.append([])
            used = 1 + metric_width + 3
        groups[-1].append(run)
        used += need

    tables = []
    for number, group in enumerate(groups):
        table = Table(title=title if number == 0 else None, title_justify="left")
        table.add_column("Metric", style="bold", no_wrap=True)
        for run in group:
            table.add_column(escape(run.name), justify="right", min_width=column_width(run))
        for i, row in enumerate(rows):
            cells = []
            for run in group:
                text = texts[run.name][i]
                cells.append(f"[bold green]{text}[/bold green]" if run.name in best.get(row, ()) else text)
            table.add_row(escape(row), *cells)
        tables.append(table)
    return tables


FOLD_ROWS = ("Return [%]", "Sharpe Ratio", "Max. Drawdown [%]", "Direction Accuracy [%]")
"""The metrics `fold_tables` show for each fold, beside the intervals and verdicts (and a mandate's rows)."""


def fold_tables(folds: Sequence[FoldReport], *, width: int | None = None) -> list[Table]:
    """A walk-forward backtest's folds at a glance: per fold, the key metrics with their intervals and
    verdicts (`comparison_tables`, so they fit `width` too)."""
    tables = []
    for fold in folds:
        shown = (*FOLD_ROWS, *MANDATE_ROWS)
        runs = [
            replace(run, metrics={row: run.metrics[row] for row in shown if row in run.metrics}, extra={},
                    deflated_sharpe=None)
            for run in fold.runs
        ]
        title = f"Fold {fold.number} · {_period(fold.context.candles)} · {len(fold.context.candles):,} bars"
        tables += comparison_tables(runs, title=title, width=width)
    return tables


def markdown_table(runs: list[StrategyRun], *, note: str | None = None) -> str:
    """Metrics × strategies as a GitHub-flavoured Markdown table (for pasting into docs), best values in bold.

    A `note` (e.g. why some annualised rows are "—") follows the table as a paragraph.
    """
    best = best_strategies(runs)

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "| Metric | " + " | ".join(cell(run.name) for run in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    for row in row_names(runs):
        cells = []
        for run in runs:
            text = cell(format_value(row, run.table_rows.get(row)))
            cells.append(f"**{text}**" if run.name in best.get(row, ()) else text)
        lines.append(f"| {cell(row)} | " + " | ".join(cells) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not math.isnan(float(value))


def _jsonable(value: Any) -> Any:
    """A metric value as strict JSON: ISO time, null for NaN, "inf"/"-inf" for infinities."""
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number):
            return None
        return number if math.isfinite(number) else ("inf" if number > 0 else "-inf")
    if isinstance(value, np.integer):
        return int(value)
    return value


# --------------------------------------------------------------------------- chart


def equity_png(runs: list[StrategyRun], context: ReportContext) -> bytes:
    """Equity curves of all runs (log scale when they span more than 3×) above a drawdown panel, as PNG."""
    figure = Figure(figsize=(11, 7), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for run in runs:
        equity = run.equity.dropna()
        times = equity.index.tz_convert("UTC").tz_localize(None)
        change = run.metrics.get("Return [%]", math.nan)
        top.plot(times, equity.to_numpy(), linewidth=1.3, label=f"{run.name} ({format_value('', change)} %)")
        bottom.plot(times, 100.0 * drawdown(equity).to_numpy(), linewidth=1.0)
    top.axhline(context.config.env.initial_cash, color="0.45", linewidth=0.8, linestyle="--")
    values = equity_frame(runs).to_numpy(dtype=float)
    if np.nanmin(values) > 0 and np.nanmax(values) / np.nanmin(values) > 3:
        top.set_yscale("log")
        top.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        top.yaxis.set_minor_formatter(NullFormatter())
    top.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    candles = context.candles
    top.set_title(
        f"{candles.attrs.get('symbol', '')} {candles.attrs.get('timeframe', '')} · {context.split} split · "
        f"fee {context.config.env.fee_bps:g} bps, slippage {context.config.env.slippage_bps:g} bps",
        loc="left",
    )
    top.set_ylabel(f"equity [{context.quote_currency}]")
    top.legend(loc="upper left", fontsize="small")
    bottom.set_ylabel("drawdown [%]")
    bottom.set_xlabel("time (UTC)")
    locator = mdates.AutoDateLocator()
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    for axis in (top, bottom):
        axis.grid(True, which="major", alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #dde1e8; }
table { border-collapse: collapse; margin: .6rem 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #dde1e8; padding: .25rem .6rem; vertical-align: top; }
th { background: #f3f5f8; text-align: left; } td.num { text-align: right; white-space: nowrap; }
td.best { font-weight: 700; color: #11723a; background: #eaf7ef; }
td.reasoning { white-space: pre-wrap; max-width: 40rem; font-size: .9em; }
table.facts th { width: 11rem; } .note { color: #5a6475; font-size: .92em; } .verdict { font-size: 1.05em; }
img { max-width: 100%; border: 1px solid #dde1e8; } .scroll { max-height: 32rem; overflow: auto; }
footer { margin-top: 2rem; color: #8a93a3; font-size: .85em; }
"""


def render_html(
    runs: list[StrategyRun], context: ReportContext, png: bytes, folds: Sequence[FoldReport] = ()
) -> str:
    """The report as one self-contained HTML page; every piece of text from data is escaped."""
    title = f"Backtest · {context.config.name} · {context.split} split"
    if folds:
        title += f" · walk-forward, {len(folds)} folds"
    image = base64.b64encode(png).decode("ascii")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        (
            f'<p class="note">{_e(", ".join(run.name for run in runs))} on {len(context.candles):,} bars, '
            f"{_e(_period(context.candles))}</p>"
        ),
        _facts_table(context),
        "<h2>Metrics</h2>" if not folds else f"<h2>Metrics, pooled over {len(folds)} folds</h2>",
        *(f'<p class="verdict"><b>{_e(line)}</b></p>' for line in verdict_lines(runs)),
        _metrics_table(runs),
        *([f'<p class="note"><b>Intervals</b>: {_e(uncertainty_note(runs, context))}</p>']
          if _has_intervals(runs) else []),
        *([f'<p class="note"><b>Walk-forward</b>: {_e(POOLED_NOTE)}</p>'] if folds else []),
        f'<p class="note"><b>Annualisation</b>: {_e(context.annualisation_note)}</p>',
        f'<p class="note"><b>Decisions</b>: {_e(context.decision_note)}</p>',
        *([f'<p class="note"><b>Mandate</b>: {_e(context.mandate_note)}</p>']
          if context.mandate_note else []),
        *(f'<p class="note"><b>{_e(run.name)}</b>: {_e(run.note)}</p>' for run in runs if run.note),
        *_verdicts_section(runs, context),
        *(_fold_section(fold) for fold in folds),
        "<h2>Equity and drawdown</h2>",
        f'<img alt="equity curves and drawdowns" src="data:image/png;base64,{image}">',
        "<h2>Trades</h2>",
        *(_trades_section(run) for run in runs),
        "<h2>Splits</h2>",
        _splits_table(context),
        f"<footer>r1trade {_e(__version__)} · generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC</footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _e(text: Any) -> str:
    """Text escaped for HTML content and attributes."""
    return html.escape(str(text), quote=True)


def _period(candles: pd.DataFrame) -> str:
    return f"{format_value('', candles.index[0])} → {format_value('', candles.index[-1])} UTC"


def _table(header: list[str], rows: list[str], css_class: str = "") -> str:
    """A table from escaped header texts and ready-made `<tr>` rows."""
    head = "".join(f"<th>{_e(text)}</th>" for text in header)
    opening = f'<table class="{css_class}">' if css_class else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _facts_table(context: ReportContext) -> str:
    config, candles, env = context.config, context.candles, context.config.env
    attrs = candles.attrs
    facts = [
        ("Data", f"{describe_source(config)} · {attrs.get('symbol')} · {attrs.get('timeframe')} bars"),
        ("Source", str(attrs.get("source"))),
        ("Split", _split_fact(context)),
        ("Embargo", f"{config.data.split.embargo_bars} bars dropped between consecutive splits"),
        ("Period", _period(candles)),
        ("Costs", f"fee {env.fee_bps:g} bps of notional per fill; slippage {env.slippage_bps:g} bps"),
        ("Fills", "a decision at a bar's close fills at the next bar's open"),
        ("Initial cash", f"{env.initial_cash:,.2f} {context.quote_currency}"),
        ("Annualisation", f"{context.bars_per_year:,.0f} bars per 365-day year"),
        ("Risk-free rate", f"{100 * config.backtest.risk_free_rate:g} % per year"),
    ]
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{_e(value)}</td></tr>" for name, value in facts)
    return f'<table class="facts">{rows}</table>'


def _split_fact(context: ReportContext) -> str:
    """The split's size and, when only part of it is evaluated, which bars (positions in the split)."""
    total = len(context.split_candles)
    where = f"{context.split} split" if context.span is None else "the bars after the train split and embargo"
    text = f"{where} of config {context.config.name}: {total:,} bars"
    if not context.is_partial:
        return text
    bars = len(context.candles)
    last = context.first_bar + bars - 1
    return f"{text}; evaluated: bars {context.first_bar:,}–{last:,} ({bars:,} bars, see the notes)"


def _metrics_table(runs: list[StrategyRun]) -> str:
    best = best_strategies(runs)
    rows = []
    for row in row_names(runs):
        cells = "".join(
            f'<td class="num{" best" if run.name in best.get(row, ()) else ""}">'
            f"{_e(format_value(row, run.table_rows.get(row)))}</td>"
            for run in runs
        )
        rows.append(f"<tr><th>{_e(row)}</th>{cells}</tr>")
    return _table(["Metric", *(run.name for run in runs)], rows, "metrics")


def _verdicts_section(runs: list[StrategyRun], context: ReportContext) -> list[str]:
    """The Verdicts heading, SPA lines, table and note; nothing when no run has decisions to judge."""
    shown = verdict_runs(runs)
    if not shown:
        return []
    return [
        "<h2>Verdicts</h2>",
        *(f'<p class="verdict">{_e(line)}</p>' for line in superiority_lines(runs)),
        _metrics_table(shown),
        f'<p class="note"><b>Verdicts</b>: {_e(verdicts_note(runs, context))}</p>',
    ]


def _fold_section(fold: FoldReport) -> str:
    """A walk-forward fold: its period, verdicts and metrics table."""
    context = fold.context
    lines = "".join(f'<p class="verdict">{_e(line)}</p>' for line in verdict_lines(fold.runs))
    return (
        f"<h2>Fold {fold.number}</h2>"
        f'<p class="note">{len(context.candles):,} bars (bars {context.first_bar:,}–'
        f"{context.first_bar + len(context.candles) - 1:,} of the evaluated span), "
        f"{_e(_period(context.candles))}; {len(context.decision_bars):,} decisions</p>"
        f"{lines}{_metrics_table(fold.runs)}"
    )


def _trades_section(run: StrategyRun) -> str:
    trades = run.trades
    heading = f"<h3>{_e(run.name)} · {len(trades):,} trade{'s' if len(trades) != 1 else ''}</h3>"
    if trades.empty:
        return heading + '<p class="note">No trades.</p>'
    shown = trades.head(MAX_HTML_TRADES)
    more = (
        f'<p class="note">The first {MAX_HTML_TRADES:,} of {len(trades):,}; trades.csv lists them all.</p>'
        if len(trades) > MAX_HTML_TRADES else ""
    )
    rows = [
        "<tr>" + "".join(_trade_cell(c, v) for c, v in zip(shown.columns, record, strict=True)) + "</tr>"
        for record in shown.itertuples(index=False, name=None)
    ]
    header = [_TRADE_HEADERS.get(column, column) for column in shown.columns]
    return f'{heading}{more}<div class="scroll">{_table(header, rows, "trades")}</div>'


def _trade_cell(column: str, value: Any) -> str:
    """One trades-table cell: long/short for the direction, prices with two decimals, units with six."""
    if column == "reasoning":
        return f'<td class="reasoning">{_e("" if pd.isna(value) else value)}</td>'
    if value is None or value is pd.NaT or (np.isscalar(value) and pd.isna(value)):
        return "<td></td>"
    if isinstance(value, (bool, np.bool_)):
        return f"<td>{'yes' if value else 'no'}</td>"
    if column == "direction":
        return f"<td>{_e(_DIRECTIONS.get(int(value), value))}</td>"
    if isinstance(value, pd.Timestamp):
        return f"<td>{value:%Y-%m-%d %H:%M}</td>"
    if isinstance(value, (int, np.integer)):
        return f'<td class="num">{int(value)}</td>'
    if isinstance(value, (float, np.floating)):
        return f'<td class="num">{value:,.{6 if column == "units" else 2}f}</td>'
    return f"<td>{_e(value)}</td>"


def _splits_table(context: ReportContext) -> str:
    rows = [
        f"<tr><th>{_e(name)}{' (evaluated)' if name == context.split else ''}</th>"
        f'<td class="num">{info["rows"]:,}</td><td>{_e(info["start"] or "—")}</td>'
        f'<td>{_e(info["end"] or "—")}</td></tr>'
        for name, info in context.splits.describe().items()
    ]
    return _table(["Split", "Bars", "Start", "End"], rows)
