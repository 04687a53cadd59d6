"""metrics.json: the setting, each strategy's rows with their intervals and verdicts, the folds.

JSON has no NaN or infinity, so NaN is written as null and ±infinity as the strings "inf" / "-inf" (a profit
factor without a losing trade is infinite)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from r1trade.backtest.report_runs import FoldReport, ReportContext, StrategyRun, has_intervals
from r1trade.backtest.report_text import uncertainty_note, verdicts_note

_DATA_ATTRS = ("symbol", "timeframe", "source")


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
    if has_intervals(runs):
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
