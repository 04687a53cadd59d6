"""Performance metrics of an equity curve, with units in their names (as backtesting.py does).

Crypto markets trade every day, so every annualisation uses a 365-day year. Money amounts (`Equity Final`,
`Fees Paid`, ...) are in the quote currency of the traded pair. All helpers are pure functions.

Below `MIN_ANNUALISE_DAYS` of elapsed time (`backtest.min_annualise_days`), the figures that extrapolate a
window to a year (`EXTRAPOLATED`: CAGR, Sortino, Calmar) are NaN: compounding a 1.33-day return to a year
(to the power 274) turns a few per cent into a CAGR of millions of per cent, which says nothing about the
strategy. Sharpe and volatility stay; they scale per-bar figures by sqrt(bars per year), as
`annualisation_note` states.

Two rows judge the decisions rather than the equity: `Direction Accuracy [%]` (`direction_accuracy`, whether
the position held after each decision points the way the market then moved, see `held_moves`) and, for a
language-model agent, `Action Entropy [nats]` (`action_entropy`, how spread its trade actions are).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

SECONDS_PER_YEAR = 365 * 24 * 3600
MIN_ANNUALISE_DAYS = 30.0
"""Default shortest elapsed time, in days, for which `EXTRAPOLATED` figures are shown."""
EXTRAPOLATED = ("CAGR [%]", "Sortino Ratio", "Calmar Ratio")
"""Annualised figures left out (NaN) on windows shorter than the minimum span."""


def infer_bars_per_year(index: pd.DatetimeIndex) -> float:
    """Bars in a 365-day year, from the median spacing of `index` (1h → 8760, 1d → 365); NaN below 2 bars."""
    if len(index) < 2:
        return math.nan
    nanoseconds = np.diff(index.to_numpy(dtype="datetime64[ns]").view(np.int64))
    return SECONDS_PER_YEAR / (float(np.median(nanoseconds)) / 1e9)


def per_bar_rate(annual_rate: float, bars_per_year: float) -> float:
    """Compounded per-bar equivalent of an annual rate: (1 + annual_rate) ** (1 / bars_per_year) - 1."""
    return (1.0 + annual_rate) ** (1.0 / bars_per_year) - 1.0


def simple_returns(equity: pd.Series) -> pd.Series:
    """Per-bar simple returns equity[t] / equity[t-1] - 1; one element shorter than `equity`."""
    values = equity.to_numpy(dtype=float)
    return pd.Series(values[1:] / values[:-1] - 1.0, index=equity.index[1:])


def drawdown(equity: pd.Series) -> pd.Series:
    """Fractional drawdown from the running peak, equity[t] / max(equity[:t+1]) - 1 (≤ 0)."""
    values = equity.to_numpy(dtype=float)
    return pd.Series(values / np.maximum.accumulate(values) - 1.0, index=equity.index)


def longest_underwater_bars(equity: pd.Series) -> int:
    """Longest run of consecutive bars whose equity is strictly below the running peak."""
    values = equity.to_numpy(dtype=float)
    underwater = np.r_[False, values < np.maximum.accumulate(values), False].astype(np.int8)
    edges = np.diff(underwater)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max()) if len(starts) else 0


def sharpe_ratio(returns: np.ndarray, *, bars_per_year: float, rf_per_bar: float = 0.0) -> float:
    """Annualised Sharpe: mean(r - rf) / std(r - rf, ddof=1) * sqrt(bars_per_year); NaN if std 0 or n < 2."""
    excess = returns - rf_per_bar
    if len(excess) < 2:
        return math.nan
    std = excess.std(ddof=1)
    return float(excess.mean() / std * math.sqrt(bars_per_year)) if std > 0 else math.nan


def sortino_ratio(returns: np.ndarray, *, bars_per_year: float, rf_per_bar: float = 0.0) -> float:
    """Annualised Sortino: mean(r - rf) / DD * sqrt(bars_per_year), DD = sqrt(mean(min(r - rf, 0)²)).

    DD is the downside deviation below the risk-free rate, averaged over every bar (not just losing ones).
    NaN when DD is 0 (no bar below the risk-free rate) or there are no returns.
    """
    excess = returns - rf_per_bar
    if len(excess) == 0:
        return math.nan
    downside = math.sqrt(np.mean(np.minimum(excess, 0.0) ** 2))
    return float(excess.mean() / downside * math.sqrt(bars_per_year)) if downside > 0 else math.nan


def cagr(equity: pd.Series) -> float:
    """Compound annual growth rate: (final / initial) ** (1 / years) - 1, years = elapsed time / 365 days.

    -1 when the final equity is ≤ 0 (ruin); inf on overflow (a large gain within hours); NaN without elapsed
    time.
    """
    years = (equity.index[-1] - equity.index[0]).total_seconds() / SECONDS_PER_YEAR
    if years <= 0:
        return math.nan
    growth = float(equity.iloc[-1] / equity.iloc[0])
    if growth <= 0:
        return -1.0
    with np.errstate(over="ignore"):
        return float(np.power(growth, 1.0 / years)) - 1.0


def trade_stats(pnl: np.ndarray | None) -> dict[str, float]:
    """`# Trades`, `Win Rate [%]` (share of trades with pnl > 0) and `Profit Factor` from per-trade PnL.

    Profit factor = gross profit / gross loss: inf when there is profit but no loss, NaN when both are 0
    (which includes having no trades). Win rate is NaN without trades; everything is NaN when pnl is None.
    """
    if pnl is None:
        return dict.fromkeys(["# Trades", "Win Rate [%]", "Profit Factor"], math.nan)
    gross_profit, gross_loss = pnl[pnl > 0].sum(), -pnl[pnl < 0].sum()
    if gross_loss > 0:
        profit_factor = gross_profit / gross_loss
    else:
        profit_factor = math.inf if gross_profit > 0 else math.nan
    return {
        "# Trades": float(len(pnl)),
        "Win Rate [%]": 100.0 * float(np.mean(pnl > 0)) if len(pnl) else math.nan,
        "Profit Factor": float(profit_factor),
    }


def held_moves(
    opens: np.ndarray, closes: np.ndarray, decision_bars: np.ndarray, every: int
) -> np.ndarray:
    """The price move over the interval each decision's position is held: close[d + every] - open[d + 1].

    A decision taken at the close of bar d fills at the open of bar d + 1 and its position is held until the
    next decision, at the close of bar d + every: the move that position earns or loses (before costs).
    On generated planted-edge data a bar opens at the previous close, so with `every` equal to the planted
    interval it is exactly the interval's close-to-close change, whose sign is the planted direction.

    opens, closes: one value per bar; decision_bars: positions of the decision bars in them. Only whole
    intervals are scored: every decision needs d + every on a bar of the data (ValueError otherwise), so a
    last decision whose interval runs past the data is left out by the caller, not scored on a shorter move.
    """
    bars = np.asarray(decision_bars, dtype=np.int64)
    if every < 1:
        raise ValueError("every must be >= 1")
    if len(bars) and (bars.min() < 0 or bars.max() + every >= len(closes)):
        raise ValueError(f"a decision bar has no whole interval of {every} bars after it in the data")
    return np.asarray(closes, dtype=float)[bars + every] - np.asarray(opens, dtype=float)[bars + 1]


def direction_accuracy(positions: np.ndarray, moves: np.ndarray) -> float:
    """`Direction Accuracy [%]`: the share of decisions whose position points the way the market moved.

    positions[i]: the position held after decision i (its sign: long > 0, short < 0, flat 0), i.e. after the
    decision's fill at the next open; moves[i]: the market's move over the interval that position is held
    (`held_moves`: next open to the close where the next decision is taken). A decision is right when
    sign(position) == sign(move) != 0: being flat counts as wrong, and so does a move of exactly zero.
    100 × right / decisions; NaN without decisions. Where the next move cannot be predicted, a policy that is
    always long or short scores about 50 % in expectation, and one that is often flat scores less.
    """
    hits = decision_hits(positions, moves)
    return 100.0 * float(hits.mean()) if len(hits) else math.nan


def decision_hits(positions: np.ndarray, moves: np.ndarray) -> np.ndarray:
    """Per decision, 1.0 when sign(position) == sign(move) != 0, else 0.0 (see `direction_accuracy`)."""
    positions, moves = np.asarray(positions, dtype=float), np.asarray(moves, dtype=float)
    if positions.shape != moves.shape:
        raise ValueError("positions and moves need one value per decision each")
    return (np.sign(positions) * np.sign(moves) > 0).astype(float)


def action_entropy(actions: Sequence[str]) -> float:
    """`Action Entropy [nats]`: the entropy -Σ p ln p of the empirical distribution of `actions`.

    One label per decision (for an agent: long, short, hold or close). 0 when every decision took the same
    action, ln k when k actions were taken equally often (ln 4 = 1.386 for the four trade actions); NaN
    without decisions.
    """
    if len(actions) == 0:
        return math.nan
    counts = np.array(list(Counter(actions).values()), dtype=float)
    shares = counts / counts.sum()
    return float(-(shares * np.log(shares)).sum()) + 0.0  # + 0.0: no "-0.0" for a single action


def compute_metrics(
    equity: pd.Series,
    *,
    trades: pd.DataFrame | None = None,
    positions: pd.Series | None = None,
    fees_paid: float | None = None,
    traded_notional: float | None = None,
    bars_per_year: float | None = None,
    risk_free_rate: float = 0.0,
    min_annualise_days: float = MIN_ANNUALISE_DAYS,
    decision_positions: np.ndarray | None = None,
    decision_moves: np.ndarray | None = None,
    actions: Sequence[str] | None = None,
) -> dict[str, float | pd.Timestamp]:
    """The statistics table of one backtest; every key is always present, NaN when undefined.

    equity: value at each bar's close, indexed by a tz-aware DatetimeIndex.
    trades: round trips with a `pnl` column (money, net of fees); None → trade statistics are NaN.
    positions: units held at each bar; `Exposure Time [%]` is the share of bars with a non-zero position.
    fees_paid, traded_notional: money totals; `Turnover` = traded_notional / mean(equity).
    bars_per_year: annualisation factor; inferred from the index spacing (365-day year) when None.
    risk_free_rate: annual, compounded to a per-bar rate (1 + rf) ** (1 / bars_per_year) - 1.
    min_annualise_days: when the equity spans fewer days, the `EXTRAPOLATED` rows (CAGR, Sortino, Calmar) are
      NaN; 0 always computes them.
    decision_positions, decision_moves: per scored decision, the position held after it and the market's move
      over the held interval (see `direction_accuracy`); None → `Direction Accuracy [%]` is NaN.
    actions: a model's trade action at each decision (long, short, hold, close); None (rule baselines) →
      `Action Entropy [nats]` is NaN.

    Formulas (r = per-bar simple returns of `equity`):
      Return [%] = 100 (final / initial - 1)
      CAGR [%] = 100 ((final / initial) ** (365 days / elapsed) - 1)
      Volatility (Ann.) [%] = 100 std(r, ddof=1) sqrt(bars_per_year)
      Sharpe Ratio, Sortino Ratio: see `sharpe_ratio`, `sortino_ratio`
      Max. Drawdown [%] = 100 min(drawdown) (≤ 0); Calmar Ratio = CAGR / |Max. Drawdown|, NaN without drawdown
      Max. Drawdown Duration [bars]: see `longest_underwater_bars`
      Direction Accuracy [%], Action Entropy [nats]: see `direction_accuracy`, `action_entropy`
    Edge cases: a single bar gives NaN for every return-based ratio; flat equity gives 0 % return,
    0 % volatility and NaN Sharpe, Sortino and Calmar.
    """
    if not isinstance(equity.index, pd.DatetimeIndex):
        raise TypeError("equity must be indexed by a DatetimeIndex")
    if len(equity) == 0:
        raise ValueError("equity is empty")
    bpy = infer_bars_per_year(equity.index) if bars_per_year is None else float(bars_per_year)
    values = equity.to_numpy(dtype=float)
    returns = values[1:] / values[:-1] - 1.0
    rf_per_bar = per_bar_rate(risk_free_rate, bpy) if risk_free_rate else 0.0
    max_dd = float(drawdown(equity).min())
    growth = cagr(equity)
    days = (equity.index[-1] - equity.index[0]).total_seconds() / 86400
    table = {
        "Start": equity.index[0],
        "End": equity.index[-1],
        "Duration [days]": days,
        "Exposure Time [%]": _exposure_pct(positions),
        "Equity Final": float(values[-1]),
        "Equity Peak": float(values.max()),
        "Return [%]": 100.0 * float(values[-1] / values[0] - 1.0),
        "CAGR [%]": 100.0 * growth,
        "Volatility (Ann.) [%]": 100.0 * _volatility(returns) * math.sqrt(bpy),
        "Sharpe Ratio": sharpe_ratio(returns, bars_per_year=bpy, rf_per_bar=rf_per_bar),
        "Sortino Ratio": sortino_ratio(returns, bars_per_year=bpy, rf_per_bar=rf_per_bar),
        "Calmar Ratio": growth / -max_dd if max_dd < 0 else math.nan,
        "Max. Drawdown [%]": 100.0 * max_dd,
        "Max. Drawdown Duration [bars]": float(longest_underwater_bars(equity)),
        **trade_stats(None if trades is None else trades["pnl"].to_numpy(dtype=float)),
        "Fees Paid": math.nan if fees_paid is None else float(fees_paid),
        "Turnover": math.nan if traded_notional is None else float(traded_notional / values.mean()),
        "Direction Accuracy [%]": (
            math.nan if decision_positions is None or decision_moves is None
            else direction_accuracy(decision_positions, decision_moves)
        ),
        "Action Entropy [nats]": math.nan if actions is None else action_entropy(actions),
    }
    if too_short_to_annualise(days, min_annualise_days):
        table.update(dict.fromkeys(EXTRAPOLATED, math.nan))
    return table


def too_short_to_annualise(days: float, min_annualise_days: float = MIN_ANNUALISE_DAYS) -> bool:
    """Whether a window of `days` is too short for the `EXTRAPOLATED` figures."""
    return days < min_annualise_days


def annualisation_note(
    days: float, *, bars_per_year: float, min_annualise_days: float = MIN_ANNUALISE_DAYS
) -> str:
    """How the annualised rows are computed; on a short window, also why CAGR, Sortino and Calmar show —."""
    scaling = (
        "Sharpe Ratio and Volatility (Ann.) scale the mean and std of per-bar returns by "
        f"sqrt({bars_per_year:,.0f}), the bars in a 365-day year."
    )
    if not too_short_to_annualise(days, min_annualise_days):
        return f"{scaling} CAGR compounds the return over a 365-day year."
    shown = ", ".join(EXTRAPOLATED[:-1]) + " and " + EXTRAPOLATED[-1]
    return (
        f"{shown} are not shown (—): the evaluated span is {days:,.2f} days, under "
        f"backtest.min_annualise_days ({min_annualise_days:g}), and extrapolating so short a window to a "
        f"year gives meaningless figures. {scaling}"
    )


def _volatility(returns: np.ndarray) -> float:
    """Per-bar standard deviation (ddof=1); NaN below two returns."""
    return float(returns.std(ddof=1)) if len(returns) > 1 else math.nan


def _exposure_pct(positions: pd.Series | None) -> float:
    """Percentage of bars holding a non-zero position; NaN when positions are unknown."""
    return math.nan if positions is None else 100.0 * float(np.mean(positions.to_numpy() != 0))
