"""Walk-forward evaluation: the backtest repeated on K consecutive folds of the evaluated data, then pooled.

One backtest window says little: a strategy can win in one regime and lose in the next. The folds are cut from
the evaluation split (`backtest.split`), or, with span "all", from every bar after the train split (less the
`data.split.embargo_bars` bars that follow it). Consecutive folds are `data.split.embargo_bars` bars apart, as
consecutive splits are: a model trained on everything before a fold (`train.walk_forward`, whose fold agents
`r1trade.backtest.fold_agents` plays) is then embargoed from it exactly as the train split is from the test
split. Fold sizes differ by at most one bar (`r1trade.data.splits.fold_bounds`). Each fold is backtested on
its own: every strategy starts flat with the initial cash at the fold's first evaluated bar (a model's, after
its warm-up, when models run), its signals computed from the whole span so that indicators have their history.

The pooled run of a strategy chains its folds (`pooled_run`); `r1trade.backtest.report_json.POOLED_NOTE` defines
its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from r1trade.backtest.metrics import action_entropy, compute_metrics
from r1trade.backtest.report_runs import ReportContext, StrategyRun
from r1trade.data.splits import fold_bounds
from r1trade.errors import UsageError

SPANS = ("split", "all")
"""Where folds are cut from: the evaluation split, or every bar after the train split."""
MIN_FOLD_DECISIONS = 2
"""Scored decisions a fold needs at least."""


def fold_contexts(context: ReportContext, folds: int) -> list[ReportContext]:
    """The context restricted to each fold of its split (or span); a fold must hold `MIN_FOLD_DECISIONS`."""
    bounds = fold_bounds(len(context.split_candles), folds, context.config.data.split.embargo_bars)
    contexts = [replace(context, first_bar=first, last_bar=last) for first, last in bounds]
    for number, fold in enumerate(contexts, start=1):
        if len(fold.decision_bars) < MIN_FOLD_DECISIONS:
            every = context.config.env.decision_every
            raise UsageError(
                f"--walk-forward {folds}: fold {number} has {len(fold.candles)} bars, too few for "
                f"{MIN_FOLD_DECISIONS} decisions every {every} bars (env.decision_every); use fewer folds"
            )
    return contexts


def pooled_run(runs: Sequence[StrategyRun], contexts: Sequence[ReportContext]) -> StrategyRun:
    """One strategy's fold runs (in fold order, with their contexts) chained into one run (see POOLED_NOTE).

    Each fold's curve starts flat at the initial cash; fold k's is scaled by the pooled equity at the end of
    fold k - 1 over its first value and joined without its first bar, so the pooled per-bar returns are the
    folds' returns. Trades gain a `fold` column (from 1) and their money is scaled the same way.
    """
    pieces, trades, scales = [], [], []
    level = float(runs[0].equity.iloc[0])
    for k, run in enumerate(runs):
        scale = level / float(run.equity.iloc[0])
        piece = run.equity * scale
        pieces.append(piece if k == 0 else piece.iloc[1:])
        trades.append(_scaled_trades(run.trades, scale).assign(fold=k + 1))
        scales.append(scale)
        level = float(piece.iloc[-1])
    equity = pd.concat(pieces).rename("equity")
    all_trades = pd.concat([t for t in trades if not t.empty] or trades[:1], ignore_index=True)
    settings = contexts[0].config.backtest
    metrics = compute_metrics(
        equity,
        trades=all_trades,
        bars_per_year=contexts[0].bars_per_year,
        risk_free_rate=settings.risk_free_rate,
        min_annualise_days=settings.min_annualise_days,
    )
    bars = np.array([len(context.candles) for context in contexts], dtype=float)
    count = np.array([run.metrics["# Trades"] for run in runs], dtype=float)
    wins = np.array([run.metrics["Win Rate [%]"] for run in runs], dtype=float)
    hits = np.concatenate([run.hits for run in runs]) if all(run.hits is not None for run in runs) else None
    exposures = (  # a mandate's sizes per decision, folds in order (the last axis: decisions)
        np.concatenate([run.exposures for run in runs], axis=-1)
        if all(run.exposures is not None for run in runs) else None
    )
    actions = tuple(action for run in runs for action in run.actions)
    metrics.update({
        "Exposure Time [%]": float(np.dot([r.metrics["Exposure Time [%]"] for r in runs], bars) / bars.sum()),
        "# Trades": float(count.sum()),
        "Win Rate [%]": float(np.nansum(wins * count) / count.sum()) if count.sum() > 0 else float("nan"),
        "Fees Paid": float(np.dot([run.metrics["Fees Paid"] for run in runs], scales)),
        "Turnover": float(
            sum(run.metrics["Turnover"] * run.equity.mean() * s for run, s in zip(runs, scales, strict=True))
            / equity.mean()
        ),
        "Direction Accuracy [%]": 100.0 * float(hits.mean()) if hits is not None else float("nan"),
        "Action Entropy [nats]": action_entropy(actions) if actions else float("nan"),
    })
    return StrategyRun(
        name=runs[0].name,
        equity=equity,
        trades=all_trades,
        metrics=metrics,
        note=f"pooled over {len(runs)} walk-forward folds (see each fold's notes)",
        hits=hits,
        actions=actions,
        exposures=exposures,
    )


def _scaled_trades(trades: pd.DataFrame, scale: float) -> pd.DataFrame:
    """Trades with their money (units, fees, PnL) scaled; prices and returns in per cent are unchanged."""
    money = [column for column in ("units", "fees", "pnl") if column in trades]
    scaled = trades.copy()
    scaled[money] = scaled[money] * scale
    return scaled
