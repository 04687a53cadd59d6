"""Vectorized backtest of a target-position series, with the trading environment's fill rules.

Semantics (shared with the trading environment):
- `target[t]` in [-m, m] is the position as a fraction of equity, decided at the close of bar t from bars
  0..t, with m = `max_exposure` (1 by default; above 1 the position is held on margin, cash going negative,
  with no interest charged). Negative is short. The position before bar 0 is flat (target 0).
- An order is sent only when the target changes (no drift rebalancing). It fills at the open of bar t + 1;
  a decision on the last bar never fills.
- Fill price p = open * (1 + s) for a buy and open * (1 - s) for a sell, s = slippage_bps / 1e4. The side is
  decided at the open price: buy if target * equity > units * open, sell if lower.
- Units after the fill = target * equity_at_fill / p, where equity_at_fill = cash + units * p (the portfolio
  valued at the fill price). If slippage makes that overshoot to the other side of the current units, nothing
  is traded.
- A fee of fee_bps / 1e4 * |units traded| * p is paid from cash on every fill. Cash may go negative (a long
  position of 100 % of equity pays its entry fee on margin).
- Equity at each bar is cash + units * close. There is no margin call: a full short in a strong rally can take
  equity below zero.
- A trade (round trip) runs from opening a position to closing or flipping it; a flip is a close and an open
  in one fill, whose units and fee are split between the two trades. A trade still open on the last bar is
  marked at the last close without exit costs, so the trades' PnL always sums to final equity - initial cash.

Only the fills are walked in Python (a few float operations each); everything per-bar is numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from r1trade.backtest.metrics import MIN_ANNUALISE_DAYS, compute_metrics, held_moves

CANDLE_COLUMNS = ("open", "high", "low", "close", "volume")
# The columns of BacktestResult.fills and .trades, in order.
FILL_COLUMNS = ["time", "bar", "target", "side", "units", "price", "notional", "fee", "position", "cash"]
TRADE_COLUMNS = [
    "entry_time",
    "exit_time",
    "entry_bar",
    "exit_bar",
    "direction",
    "units",
    "entry_price",
    "exit_price",
    "fees",
    "pnl",
    "return_pct",
    "is_open",
]


@dataclass(frozen=True)
class BacktestResult:
    """Everything a backtest produces; money in the quote currency, positions in base-asset units.

    equity, cash, position: one value per bar, at its close (position = units held after that bar's fill).
    fills: one row per executed order (see FILL_COLUMNS; `units` is signed, `side` is +1 buy / -1 sell).
    trades: one row per round trip (see TRADE_COLUMNS; `direction` is +1 long / -1 short, `units` is the total
    units entered, prices are unit-weighted averages including slippage, `pnl` is net of fees).
    """

    equity: pd.Series
    cash: pd.Series
    position: pd.Series
    target: pd.Series
    fills: pd.DataFrame
    trades: pd.DataFrame
    initial_cash: float
    fee_bps: float
    slippage_bps: float

    @property
    def fees_paid(self) -> float:
        """Total fees paid."""
        return float(self.fills["fee"].sum())

    @property
    def traded_notional(self) -> float:
        """Total |units| * price over all fills."""
        return float(self.fills["notional"].sum())

    def metrics(
        self,
        *,
        bars_per_year: float | None = None,
        risk_free_rate: float = 0.0,
        min_annualise_days: float = MIN_ANNUALISE_DAYS,
        decision_bars: np.ndarray | None = None,
        candles: pd.DataFrame | None = None,
        decision_every: int | None = None,
    ) -> dict[str, float | pd.Timestamp]:
        """The `compute_metrics` table for this run.

        With `decision_bars` (positions in `candles`, the candles this run traded) and `decision_every`, the
        run is also scored on those decisions: `Direction Accuracy [%]` compares the position held after
        each decision bar d's fill (at the open of bar d + 1) with the move from that open to the close of bar
        d + decision_every (`held_moves`). Targets changed between decision bars are not scored.
        """
        scored = {}
        if decision_bars is not None:
            if candles is None or decision_every is None or not candles.index.equals(self.equity.index):
                raise ValueError("decision_bars needs decision_every and the candles the run traded")
            bars = np.asarray(decision_bars, dtype=np.int64)
            moves = held_moves(candles["open"].to_numpy(), candles["close"].to_numpy(), bars, decision_every)
            scored = {"decision_positions": self.position.to_numpy()[bars + 1], "decision_moves": moves}
        return compute_metrics(
            self.equity,
            trades=self.trades,
            positions=self.position,
            fees_paid=self.fees_paid,
            traded_notional=self.traded_notional,
            bars_per_year=bars_per_year,
            risk_free_rate=risk_free_rate,
            min_annualise_days=min_annualise_days,
            **scored,
        )


def run_vectorized(
    candles: pd.DataFrame,
    target: pd.Series,
    *,
    initial_cash: float,
    fee_bps: float,
    slippage_bps: float,
    allow_short: bool = True,
    max_exposure: float = 1.0,
) -> BacktestResult:
    """Backtest `target` (fraction of equity per bar, on the candles' index) under the module's fill rules;
    |target| may reach `max_exposure`."""
    targets = _validated_targets(candles, target, allow_short=allow_short, max_exposure=max_exposure)
    if initial_cash <= 0 or fee_bps < 0 or slippage_bps < 0:
        raise ValueError("initial_cash must be > 0, fee_bps and slippage_bps >= 0")
    opens = candles["open"].to_numpy(dtype=float)
    closes = candles["close"].to_numpy(dtype=float)
    fills = _fills_frame(
        _simulate_fills(
            opens, targets, initial_cash=float(initial_cash), fee=fee_bps / 1e4, slippage=slippage_bps / 1e4
        ),
        targets,
        candles.index,
        fee=fee_bps / 1e4,
    )
    cash, units = _per_bar_state(fills, len(opens), initial_cash=float(initial_cash))
    index = candles.index
    return BacktestResult(
        equity=pd.Series(cash + units * closes, index=index, name="equity"),
        cash=pd.Series(cash, index=index, name="cash"),
        position=pd.Series(units, index=index, name="position"),
        target=pd.Series(targets, index=index, name="target"),
        fills=fills,
        trades=round_trips(fills, index, last_close=float(closes[-1])),
        initial_cash=float(initial_cash),
        fee_bps=float(fee_bps),
        slippage_bps=float(slippage_bps),
    )


def _validated_targets(
    candles: pd.DataFrame, target: pd.Series, *, allow_short: bool, max_exposure: float = 1.0
) -> np.ndarray:
    """The target as a float array, after checking it matches the candles and the position limits."""
    missing = [c for c in CANDLE_COLUMNS if c not in candles.columns]
    if missing or len(candles) == 0:
        raise ValueError(f"candles must be non-empty with columns {CANDLE_COLUMNS}; missing {missing}")
    if not target.index.equals(candles.index):
        raise ValueError("target must have exactly the candles' index")
    values = target.to_numpy(dtype=float)
    if not np.isfinite(values).all():
        raise ValueError("target contains NaN or inf; fill warm-up bars with 0 (flat)")
    lower = -max_exposure if allow_short else 0.0
    if values.min() < lower or values.max() > max_exposure:
        raise ValueError(f"target must lie in [{lower:g}, {max_exposure:g}]")
    return values


def _simulate_fills(
    opens: np.ndarray, targets: np.ndarray, *, initial_cash: float, fee: float, slippage: float
) -> np.ndarray:
    """Walk the orders (one per target change); one row per fill: bar, side, units, price, position, cash."""
    previous = np.r_[0.0, targets[:-1]]
    decision_bars = np.flatnonzero(targets != previous)
    decision_bars = decision_bars[decision_bars < len(targets) - 1]
    cash, units, rows = initial_cash, 0.0, []
    fill_bars = decision_bars + 1
    for bar, frac, open_ in zip(
        fill_bars.tolist(), targets[decision_bars].tolist(), opens[fill_bars].tolist(), strict=True
    ):
        side = 1.0 if frac * (cash + units * open_) > units * open_ else -1.0
        price = open_ * (1.0 + side * slippage)
        delta = frac * cash / price + (frac - 1.0) * units  # target units - units, valued at the fill price
        if delta * side <= 0.0:
            continue
        notional = abs(delta) * price
        cash -= delta * price + fee * notional
        units += delta
        rows.append((bar, side, delta, price, units, cash))
    return np.array(rows, dtype=float).reshape(-1, 6)  # (n_fills, 6)


def _fills_frame(
    raw: np.ndarray, targets: np.ndarray, index: pd.DatetimeIndex, *, fee: float
) -> pd.DataFrame:
    """The FILL_COLUMNS table from `_simulate_fills` rows."""
    bar = raw[:, 0].astype(np.int64)
    notional = np.abs(raw[:, 2]) * raw[:, 3]
    return pd.DataFrame(
        {
            "time": index[bar],
            "bar": bar,
            "target": targets[bar - 1],
            "side": raw[:, 1].astype(np.int64),
            "units": raw[:, 2],
            "price": raw[:, 3],
            "notional": notional,
            "fee": fee * notional,
            "position": raw[:, 4],
            "cash": raw[:, 5],
        }
    )


def _per_bar_state(fills: pd.DataFrame, n_bars: int, *, initial_cash: float) -> tuple[np.ndarray, np.ndarray]:
    """Cash and units held at each bar's close: piecewise constant between fills."""
    marks = np.zeros(n_bars, dtype=np.int64)
    marks[fills["bar"].to_numpy()] = 1
    segment = np.cumsum(marks)  # 0 before the first fill, k from the k-th fill on
    units = np.r_[0.0, fills["position"].to_numpy()][segment]
    cash = np.r_[initial_cash, fills["cash"].to_numpy()][segment]
    return cash, units


def round_trips(fills: pd.DataFrame, index: pd.DatetimeIndex, *, last_close: float) -> pd.DataFrame:
    """Group fills into round trips (TRADE_COLUMNS); a flip fill closes one trade and opens the next.

    fills: one row per fill in time order with `bar` (position in `index`), signed `units`, `price`, `fee` and
    `position` (units held after the fill, starting from flat). A trade still open is marked at `last_close`,
    the close of `index`'s last bar.
    """
    bar, price = fills["bar"].to_numpy(), fills["price"].to_numpy()
    delta, after = fills["units"].to_numpy(), fills["position"].to_numpy()
    before = np.r_[0.0, after[:-1]]
    held_before, held_after = np.sign(before), np.sign(after)
    closes = (held_before != 0) & (held_after != held_before)  # ends the open trade (to flat, or flipping)
    reduces = ~closes & (held_before == -np.sign(delta))
    closing = np.where(closes, np.abs(before), np.where(reduces, np.abs(delta), 0.0))
    opening = np.where(closes, np.abs(after), np.where(reduces, 0.0, np.abs(delta)))
    starts = (opening > 0) & ((before == 0) | closes)
    opening_trade = np.cumsum(starts) - 1  # the trade a fill's opening units belong to
    closing_trade = opening_trade - starts  # the trade open before the fill
    n_trades = int(starts.sum())
    fee_per_unit = fills["fee"].to_numpy() / np.abs(delta)

    def per_trade(trade: np.ndarray, units: np.ndarray, per_unit: np.ndarray) -> np.ndarray:
        held = units > 0
        sums = np.bincount(trade[held], (units * per_unit)[held], minlength=n_trades)
        return sums.astype(float)  # bincount gives ints when nothing is held

    ones = np.ones_like(delta)
    units = per_trade(opening_trade, opening, ones)
    entry_value = per_trade(opening_trade, opening, price)
    exit_units = per_trade(closing_trade, closing, ones)
    exit_value = per_trade(closing_trade, closing, price)
    fees = per_trade(opening_trade, opening, fee_per_unit) + per_trade(closing_trade, closing, fee_per_unit)
    exit_bar = bar[closes]
    is_open = np.arange(n_trades) >= len(exit_bar)
    if is_open.any():  # the last trade: mark what is left at the last close, without exit costs
        exit_value[-1] += (units[-1] - exit_units[-1]) * last_close
        exit_units[-1] = units[-1]
        exit_bar = np.r_[exit_bar, len(index) - 1]
    direction = held_after[starts].astype(np.int64)
    pnl = direction * (exit_value - entry_value) - fees
    return pd.DataFrame(
        {
            "entry_time": index[bar[starts]],
            "exit_time": index[exit_bar],
            "entry_bar": bar[starts],
            "exit_bar": exit_bar,
            "direction": direction,
            "units": units,
            "entry_price": entry_value / units,
            "exit_price": exit_value / exit_units,
            "fees": fees,
            "pnl": pnl,
            "return_pct": 100.0 * pnl / entry_value,
            "is_open": is_open,
        }
    )
