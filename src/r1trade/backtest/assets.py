"""The backtest of a config with several candle files (`data.paths`): each asset on its own, then pooled.

Each asset is backtested as if it were the config's only file (`asset_configs`), with every option of the
backtest, walk-forward folds included, into its own complete report `<out_dir>-<label>`. The pooled runs
chain the assets' runs (with a walk-forward, their folds) as a walk-forward chains its folds (`pooled_run`);
`out_dir` holds them beside each asset's figures: metrics.json, metrics.md and config.yaml.
`POOLED_ASSETS_NOTE` defines the pooled rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from r1trade.backtest.bootstrap import DecisionSample
from r1trade.backtest.metrics import cagr as annual_growth
from r1trade.backtest.metrics import too_short_to_annualise
from r1trade.backtest.report_json import spa_document, strategy_entry, verdicts_document
from r1trade.backtest.report_runs import FoldReport, ReportContext, StrategyRun
from r1trade.backtest.report_text import markdown_table, uncertainty_note, verdict_lines, verdicts_markdown
from r1trade.backtest.runner import BacktestOutcome, default_report_dir, run_backtest
from r1trade.backtest.uncertainty import run_sample, with_uncertainty
from r1trade.backtest.verdicts import Trials, count_trials
from r1trade.backtest.walk_forward import pooled_run
from r1trade.config import Config
from r1trade.data.source import asset_configs, asset_labels
from r1trade.outputs import check_report_folder, write_folder

POOLED_ASSETS_NOTE = (
    "Each asset is backtested on its own, every strategy starting flat with the initial cash. The pooled "
    "run chains the assets (with a walk-forward, their folds) in the order of data.paths: each one's equity "
    "curve, less its first bar, is compounded on the pooled equity at the end of the one before, so its "
    "per-bar returns are exactly the assets' returns and its Return [%] is their returns compounded one "
    "after the other. Sharpe, volatility, drawdowns, Direction Accuracy [%] and the 95 % intervals are over "
    "all assets' bars and decisions; Duration [days] is the sum of the assets' evaluated spans, over which "
    "CAGR compounds. The assets' periods overlap in time and the bootstrap resamples them as one sequence, "
    "so it does not see how assets move together: when they are correlated the pooled intervals are too "
    "narrow."
)
"""What the pooled metrics of a backtest over several assets are."""


@dataclass(frozen=True)
class AssetReport:
    """One asset's backtest: its label (`asset_labels`), its file and its outcome (its own report folder)."""

    label: str
    path: str
    outcome: BacktestOutcome


@dataclass(frozen=True)
class AssetsOutcome:
    """A backtest over several assets: each asset's, and the pooled runs (None when their bar lengths differ,
    as per-bar returns of different lengths do not mix); `out_dir` holds the pooled report."""

    assets: list[AssetReport]
    pooled: list[StrategyRun] | None
    out_dir: Path
    files: list[Path]

    @property
    def pooled_context(self) -> ReportContext:
        """The first asset's context: the settings (costs, bootstrap, bar length) every asset shares."""
        return self.assets[0].outcome.context


def run_asset_backtests(
    config: Config,
    *,
    strategy: str | None = None,
    out_dir: Path | None = None,
    force: bool = False,
    walk_forward: int | None = None,
    span: str | None = None,
    trials: int | None = None,
    **players: Any,
) -> AssetsOutcome:
    """`run_backtest` on each candle file of `config.data.paths` into `<out_dir>-<label>`, then the pooled
    report into `out_dir` (default `default_report_dir`). Every folder is checked before anything runs.
    `players`: `run_backtest`'s checkpoint, step, base_model and models, the same for every asset."""
    assets = asset_configs(config)
    labels = asset_labels(assets)
    out_dir = out_dir or default_report_dir(config, strategy, walk_forward=walk_forward, span=span or "split")
    folders = [out_dir.with_name(f"{out_dir.name}-{label}") for label in labels]
    for folder in (out_dir, *folders):
        check_report_folder(folder, force=force)
    reports = [
        AssetReport(label, asset.data.path, run_backtest(
            asset, strategy=strategy, out_dir=folder, force=force, walk_forward=walk_forward, span=span,
            trials=trials, **players,
        ))
        for asset, label, folder in zip(assets, labels, folders, strict=True)
    ]
    models = {run.name for run in reports[0].outcome.runs if run.actions}  # only a model's run has actions
    counted = count_trials(config, models=len(models), given=trials)
    pooled = pool_assets(reports, models=models, trials=counted)
    files = write_folder(out_dir, {
        "metrics.json": json.dumps(assets_document(config, reports, pooled), indent=2) + "\n",
        "metrics.md": assets_markdown(reports, pooled),
        "config.yaml": config.to_yaml(),
    })
    return AssetsOutcome(assets=reports, pooled=pooled, out_dir=out_dir, files=files)


def pool_assets(
    reports: Sequence[AssetReport], *, models: set[str], trials: Trials
) -> list[StrategyRun] | None:
    """Each strategy's runs on every asset (or fold of an asset) chained into one run with its intervals (see
    POOLED_ASSETS_NOTE); None when the assets' bar lengths differ."""
    pieces = [piece for report in reports for piece in _pieces(report.outcome)]
    contexts = [piece.context for piece in pieces]
    if len({context.bars_per_year for context in contexts}) > 1:
        return None
    runs, samples = [], {}
    for name in [run.name for run in pieces[0].runs]:
        parts = [next(run for run in piece.runs if run.name == name) for piece in pieces]
        pooled = pooled_run(parts, contexts)
        note = f"pooled over {len(reports)} assets" + (f" ({len(pieces)} walk-forward folds)" if
                                                       len(pieces) > len(reports) else "")
        runs.append(replace(pooled, metrics=_over_summed_time(pooled.metrics, contexts), note=note))
        decisions = [run_sample(run, piece.context) for run, piece in zip(parts, pieces, strict=True)]
        if all(sample is not None for sample in decisions):
            samples[name] = DecisionSample.concat(decisions)
    return with_uncertainty(
        runs, samples, contexts[0], models=models, trials=trials.count, trials_source=trials.source
    )


def _pieces(outcome: BacktestOutcome) -> list[FoldReport]:
    """An asset's runs as pooling takes them: its walk-forward folds, or its one evaluation."""
    return list(outcome.folds) or [FoldReport(1, outcome.context, outcome.runs)]


def _over_summed_time(metrics: dict[str, Any], contexts: Sequence[ReportContext]) -> dict[str, Any]:
    """Start, End, Duration [days], CAGR [%] and Calmar Ratio of a chain of pieces that overlap in time: the
    duration is the sum of their spans, CAGR compounds the return over it (a 365-day year)."""
    days = sum(context.span_days for context in contexts)
    start = contexts[0].candles.index[0]
    ends = pd.DatetimeIndex([start, start + pd.Timedelta(days=days)])
    growth = 100.0 * annual_growth(pd.Series([1.0, 1.0 + metrics["Return [%]"] / 100.0], index=ends))
    drawdown = metrics["Max. Drawdown [%]"]
    settings = contexts[0].config.backtest
    short = too_short_to_annualise(days, settings.min_annualise_days)
    return {
        **metrics,
        "Start": min(context.candles.index[0] for context in contexts),
        "End": max(context.candles.index[-1] for context in contexts),
        "Duration [days]": days,
        "CAGR [%]": math.nan if short else growth,
        "Calmar Ratio": math.nan if short or drawdown >= 0 else growth / -drawdown,
    }


def assets_document(
    config: Config, reports: Sequence[AssetReport], pooled: list[StrategyRun] | None
) -> dict[str, Any]:
    """The pooled report's metrics.json: the pooled strategies and, per asset, its period and strategies and
    the folder of its full report."""
    document: dict[str, Any] = {"config": config.name, "split": reports[0].outcome.context.split}
    if pooled is None:
        document["pooled"] = {"note": "not pooled: the assets' bar lengths differ (see each asset's report)"}
    else:
        context = reports[0].outcome.context
        document["pooled"] = {
            "note": POOLED_ASSETS_NOTE,
            "strategies": {run.name: strategy_entry(run) for run in pooled},
            "notes": {run.name: run.note for run in pooled if run.note},
            **({"uncertainty": uncertainty_note(pooled, context)} if any(run.ci95 for run in pooled) else {}),
            **({"verdicts": verdicts_document(pooled, context)} if any(run.psr for run in pooled) else {}),
            **({"spa": spa} if (spa := spa_document(pooled)) else {}),
        }
    document["assets"] = [_asset_entry(report) for report in reports]
    return document


def _asset_entry(report: AssetReport) -> dict[str, Any]:
    context = report.outcome.context
    index = context.candles.index
    return {
        "label": report.label,
        "path": report.path,
        "symbol": context.candles.attrs.get("symbol"),
        "timeframe": context.candles.attrs.get("timeframe"),
        "report": str(report.outcome.out_dir),
        "period": {"start": index[0].isoformat(), "end": index[-1].isoformat(), "bars": len(index)},
        "strategies": {run.name: strategy_entry(run) for run in report.outcome.runs},
    }


def assets_markdown(reports: Sequence[AssetReport], pooled: list[StrategyRun] | None) -> str:
    """The pooled table (with its verdicts and how it is computed), then each asset's."""
    if pooled is None:
        text = "# Not pooled\n\nThe assets' bar lengths differ: see each asset's report.\n"
    else:
        notes = [*verdict_lines(pooled), POOLED_ASSETS_NOTE]
        text = f"# Pooled over {len(reports)} assets\n\n" + markdown_table(pooled, note="\n\n".join(notes))
        text += verdicts_markdown(pooled, reports[0].outcome.context)
    for report in reports:
        index, runs = report.outcome.context.candles.index, report.outcome.runs
        text += (
            f"\n## {report.label}: {index[0]:%Y-%m-%d} → {index[-1]:%Y-%m-%d} ({report.outcome.out_dir})\n\n"
            + markdown_table(runs, note="\n\n".join(verdict_lines(runs)) or None)
        )
    return text
