"""Backtesting: metrics, a vectorized engine with the trading environment's fill rules, and rule baselines."""

from r1trade.backtest.engine import BacktestResult, run_vectorized
from r1trade.backtest.metrics import (
    action_entropy,
    compute_metrics,
    direction_accuracy,
    drawdown,
    held_moves,
    infer_bars_per_year,
    simple_returns,
)
from r1trade.backtest.strategies import STRATEGIES, make_targets

__all__ = [
    "STRATEGIES",
    "BacktestResult",
    "action_entropy",
    "compute_metrics",
    "direction_accuracy",
    "drawdown",
    "held_moves",
    "infer_bars_per_year",
    "make_targets",
    "run_vectorized",
    "simple_returns",
]
