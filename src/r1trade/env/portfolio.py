"""A single-asset margin portfolio: cash, a signed position, average entry, PnL, stops, and the fill rules.

Fill rules (the same as `r1trade.backtest.engine`, so both can be compared):
- A target is a signed fraction of equity (negative = short). An order is sent only when the target changes.
- It fills at a bar's open: price p = open × (1 + s) for a buy, open × (1 − s) for a sell, where s ≥ 0 is the
  slippage fraction. The side is decided at the open: buy if target × equity > units × open.
- Units after the fill = target × (cash + units × p) / p. If slippage makes that overshoot to the other side
  of the current units, nothing is traded.
- A fee of fee_rate × |units traded| × p is paid from cash on every fill; cash may go negative (margin).
- Equity = cash + units × price.

Stops: a stop-loss and a take-profit, set as distances in percent from the average entry, are checked against
each following bar. A bar that opens beyond a level fills at that open (a gap through the level); otherwise
the level is touched when low ≤ level ≤ high and fills at the level. A stop-loss is a market order and pays
slippage; a take-profit is a resting limit order and fills at its level (or the better open) without slippage.
When one bar touches both, the stop-loss is assumed to fill first: the bar's path inside is unknown, so assume
the worse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FillReason = Literal["order", "stop_loss", "take_profit"]


@dataclass(frozen=True)
class Fill:
    """One executed trade; `units` is signed (+ bought, − sold), `realized_pnl` is gross of the fee."""

    bar: int
    units: float
    price: float
    fee: float
    reason: FillReason
    realized_pnl: float

    @property
    def side(self) -> Literal["buy", "sell"]:
        return "buy" if self.units > 0 else "sell"

    @property
    def notional(self) -> float:
        return abs(self.units) * self.price


class Portfolio:
    """Cash and one position; every money change goes through `_fill`, so the books always balance.

    Invariant: equity(price) = initial_cash + realized_pnl + unrealized_pnl(price) − fees_paid.
    """

    def __init__(self, *, initial_cash: float, fee_rate: float) -> None:
        if initial_cash <= 0 or fee_rate < 0:
            raise ValueError("initial_cash must be > 0 and fee_rate >= 0")
        self.initial_cash = float(initial_cash)
        self.fee_rate = float(fee_rate)
        self.cash = float(initial_cash)
        self.units = 0.0
        self.avg_entry = 0.0
        self.target = 0.0
        self.realized_pnl = 0.0
        self.fees_paid = 0.0
        self.traded_notional = 0.0
        self.stop_price: float | None = None
        self.take_price: float | None = None

    # ----------------------------------------------------------------------------------------- valuation

    def equity(self, price: float) -> float:
        """Cash plus the position valued at `price`."""
        return self.cash + self.units * price

    def unrealized_pnl(self, price: float) -> float:
        """Gain of the open position at `price` relative to its average entry."""
        return self.units * (price - self.avg_entry)

    def exposure(self, price: float) -> float:
        """Signed position value as a fraction of equity (0 when equity is not positive)."""
        equity = self.equity(price)
        return self.units * price / equity if equity > 0 else 0.0

    @property
    def direction(self) -> Literal["long", "short", "flat"]:
        return "long" if self.units > 0 else "short" if self.units < 0 else "flat"

    # ----------------------------------------------------------------------------------------- orders

    def rebalance(self, target: float, *, bar: int, open_price: float, slippage: float) -> Fill | None:
        """Move to `target` (signed fraction of equity) at `open_price`; none if the target is unchanged."""
        if target == self.target:
            return None
        self.target = target
        side = 1.0 if target * (self.cash + self.units * open_price) > self.units * open_price else -1.0
        price = open_price * (1.0 + side * slippage)
        delta = target * self.cash / price + (target - 1.0) * self.units  # target units − units, at price p
        if delta * side <= 0.0:
            return None
        return self._fill(delta, price, bar=bar, reason="order")

    def set_exits(self, *, stop_loss_pct: float | None, take_profit_pct: float | None) -> None:
        """Place (or remove, with None) the stop-loss and take-profit of the open position."""
        if self.units == 0.0:
            self.stop_price = self.take_price = None
            return
        sign = 1.0 if self.units > 0 else -1.0
        entry = self.avg_entry
        self.stop_price = None if stop_loss_pct is None else entry * (1.0 - sign * stop_loss_pct / 100.0)
        self.take_price = None if take_profit_pct is None else entry * (1.0 + sign * take_profit_pct / 100.0)

    def check_exits(
        self, *, bar: int, open_price: float, high: float, low: float, slippage: float
    ) -> Fill | None:
        """Close the position if bar `bar` reaches its stop-loss (checked first) or take-profit."""
        if self.units == 0.0:
            return None
        long = self.units > 0
        stop, take = self.stop_price, self.take_price
        if stop is not None and (low <= stop if long else high >= stop):
            level = min(open_price, stop) if long else max(open_price, stop)
            price = level * (1.0 - slippage) if long else level * (1.0 + slippage)
            return self.close(bar=bar, price=price, reason="stop_loss")
        if take is not None and (high >= take if long else low <= take):
            price = max(open_price, take) if long else min(open_price, take)
            return self.close(bar=bar, price=price, reason="take_profit")
        return None

    def close(self, *, bar: int, price: float, reason: FillReason) -> Fill:
        """Trade the whole position away at `price`; the target becomes flat."""
        self.target = 0.0
        return self._fill(-self.units, price, bar=bar, reason=reason)

    # ----------------------------------------------------------------------------------------- books

    def _fill(self, delta: float, price: float, *, bar: int, reason: FillReason) -> Fill:
        """Book `delta` units at `price`: cash, fee, average entry and realized PnL."""
        notional = abs(delta) * price
        fee = self.fee_rate * notional
        before = self.units
        after = before + delta
        realized = 0.0
        if before != 0.0 and before * delta < 0.0:  # reducing, closing or flipping
            closed = min(abs(delta), abs(before))
            realized = closed * (price - self.avg_entry) * (1.0 if before > 0 else -1.0)
        if after == 0.0 or (before != 0.0 and before * after < 0.0):
            self.avg_entry = price if after != 0.0 else 0.0
        elif before * delta >= 0.0:  # opening or adding
            self.avg_entry = (abs(before) * self.avg_entry + abs(delta) * price) / abs(after)
        if after == 0.0 or before * after <= 0.0:
            self.stop_price = self.take_price = None
        self.cash -= delta * price + fee
        self.units = after
        self.realized_pnl += realized
        self.fees_paid += fee
        self.traded_notional += notional
        return Fill(bar=bar, units=delta, price=price, fee=fee, reason=reason, realized_pnl=realized)
