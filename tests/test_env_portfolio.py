"""Portfolio arithmetic worked out by hand: fills, fees, slippage, average entry, PnL, stops and gaps."""

from __future__ import annotations

import math

import pytest
from env_fixtures import close, hold, long, make_env, ohlc_candles, random_candles, short
from hypothesis import given, settings
from hypothesis import strategies as st

from r1trade.env import MarketReplay, Portfolio


def portfolio(cash: float = 10_000.0, fee_bps: float = 0.0) -> Portfolio:
    return Portfolio(initial_cash=cash, fee_rate=fee_bps / 1e4)


def test_long_round_trip_with_fee_and_slippage_through_the_env() -> None:
    candles = ohlc_candles([
        (100, 100, 100, 100), (100, 100, 100, 100), (100, 100, 100, 100),
        (101, 104.5, 100.5, 104), (104, 106.5, 103.5, 106), (105, 105.5, 104.5, 105), (105, 105, 105, 105),
    ])
    env = make_env(candles, fee_bps=10, slippage_bps=20)
    env.reset(options={"start": 2, "decisions": 3})
    _, _, _, _, info = env.step(long(0.5, stop_loss=50))
    # Buy at the open of bar 3: 101 × (1 + 0.002) = 101.202; units = 0.5 × 10 000 / 101.202;
    # fee = 0.1 % × 5 000.
    units = 5_000 / 101.202
    (fill,) = info["fills"]
    assert (fill["bar"], fill["side"], fill["reason"]) == (3, "buy", "order")
    assert fill["price"] == pytest.approx(101.202)
    assert fill["units"] == pytest.approx(units)
    assert fill["fee"] == pytest.approx(5.0)
    # Cash 10 000 − 5 000 − 5, the position marked at the close.
    assert info["equity"] == pytest.approx(4_995 + units * 104)
    env.step(hold())
    assert env.portfolio.unrealized_pnl(106) == pytest.approx(units * (106 - 101.202))
    _, _, _, truncated, info = env.step(close())
    # Sell at the open of bar 5: 105 × (1 − 0.002) = 104.79; fee 0.1 % of the proceeds.
    proceeds = units * 104.79
    (fill,) = info["fills"]
    assert (fill["side"], fill["price"]) == ("sell", pytest.approx(104.79))
    assert fill["fee"] == pytest.approx(proceeds / 1e3)
    assert fill["realized_pnl"] == pytest.approx(units * (104.79 - 101.202))
    final = 10_000 + units * (104.79 - 101.202) - 5.0 - proceeds / 1e3
    assert info["equity"] == pytest.approx(final)
    assert final == pytest.approx(10_167.0920, abs=1e-4)
    assert truncated and info["episode"]["fees"] == pytest.approx(5.0 + proceeds / 1e3)
    assert env.equity_curve().tolist() == pytest.approx(
        [10_000, 4_995 + units * 104, 4_995 + units * 106, final]
    )


def test_short_round_trip_with_fee_and_slippage_through_the_env() -> None:
    candles = ohlc_candles([
        (100, 100, 100, 100), (100, 100, 100, 100), (100, 100, 100, 100),
        (100, 100.5, 97, 98), (98, 98, 94, 95), (90, 91, 89, 90), (90, 90, 90, 90),
    ])
    env = make_env(candles, fee_bps=10, slippage_bps=20)
    env.reset(options={"start": 2, "decisions": 3})
    _, _, _, _, info = env.step(short(1.0, stop_loss=50))
    # Sell short at 100 × 0.998 = 99.8: units = −10 000 / 99.8, proceeds 10 000, fee 10 → cash 19 990.
    units = 10_000 / 99.8
    assert info["fills"][0]["units"] == pytest.approx(-units)
    assert env.portfolio.cash == pytest.approx(19_990)
    assert info["equity"] == pytest.approx(19_990 - units * 98)
    env.step(hold())
    _, _, _, _, info = env.step(close())
    # Cover at 90 × 1.002 = 90.18: PnL = units × (99.8 − 90.18), fees 10 + 0.1 % × units × 90.18.
    cover_fee = units * 90.18 / 1e3
    assert info["fills"][0]["price"] == pytest.approx(90.18)
    assert info["equity"] == pytest.approx(10_000 + units * (99.8 - 90.18) - 10 - cover_fee)
    assert info["equity"] == pytest.approx(10_944.8918, abs=1e-4)
    assert env.portfolio.realized_pnl == pytest.approx(units * (99.8 - 90.18))


def test_average_entry_partial_close_and_flip() -> None:
    book = portfolio()
    book.rebalance(0.5, bar=1, open_price=100, slippage=0)  # 50 units at 100
    book.rebalance(1.0, bar=2, open_price=120, slippage=0)  # equity 11 000 → 110 000/120 ≈ 91.67 units
    units = 11_000 / 120
    assert book.units == pytest.approx(units)
    assert book.avg_entry == pytest.approx((50 * 100 + (units - 50) * 120) / units)
    entry = book.avg_entry
    book.rebalance(0.5, bar=3, open_price=130, slippage=0)  # reduce: same entry, PnL realized on the sale
    sold = units - 0.5 * book.equity(130) / 130
    assert book.avg_entry == pytest.approx(entry)
    assert book.realized_pnl == pytest.approx(sold * (130 - entry))
    book.rebalance(-0.5, bar=4, open_price=110, slippage=0)  # flip: close the rest, open a short at 110
    assert book.units < 0 and book.avg_entry == pytest.approx(110)
    assert book.realized_pnl == pytest.approx(sold * (130 - entry) + (units - sold) * (110 - entry))


@given(
    st.lists(
        st.tuples(st.sampled_from([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0]), st.floats(50, 200), st.floats(0, 0.01)),
        min_size=1,
        max_size=12,
    ),
    st.floats(0, 50),
)
@settings(max_examples=200, deadline=None)
def test_books_balance_after_any_fills(orders: list[tuple[float, float, float]], fee_bps: float) -> None:
    book = portfolio(fee_bps=fee_bps)
    for bar, (target, price, slippage) in enumerate(orders):
        fill = book.rebalance(target, bar=bar, open_price=price, slippage=slippage)
        assert fill is None or fill.fee >= 0
        mark = price * 1.01
        expected = book.initial_cash + book.realized_pnl + book.unrealized_pnl(mark) - book.fees_paid
        assert book.equity(mark) == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_unchanged_target_sends_no_order() -> None:
    book = portfolio()
    assert book.rebalance(0.5, bar=1, open_price=100, slippage=0) is not None
    assert book.rebalance(0.5, bar=2, open_price=150, slippage=0) is None  # no drift rebalancing


# ----------------------------------------------------------------------------------- stops


def long_with_exits(stop: float | None, take: float | None, slippage: float = 0.0) -> Portfolio:
    book = portfolio()
    book.rebalance(1.0, bar=1, open_price=100, slippage=0)
    book.set_exits(stop_loss_pct=stop, take_profit_pct=take)
    return book


def test_stop_loss_fills_at_the_level_with_slippage() -> None:
    book = long_with_exits(5, None)
    assert book.stop_price == pytest.approx(95)
    assert book.check_exits(bar=2, open_price=98, high=99, low=95.5, slippage=0.001) is None
    fill = book.check_exits(bar=3, open_price=97, high=97, low=94, slippage=0.001)
    assert fill is not None and fill.reason == "stop_loss"
    assert fill.price == pytest.approx(95 * 0.999)
    assert book.units == 0 and book.target == 0 and book.stop_price is None


def test_gap_through_the_stop_fills_at_the_open() -> None:
    book = long_with_exits(5, None)
    fill = book.check_exits(bar=2, open_price=90, high=92, low=88, slippage=0.0)
    assert fill is not None and fill.price == 90  # not the 95 stop: the market never traded there
    assert book.equity(90) == pytest.approx(10_000 * 0.9)


def test_take_profit_fills_at_the_level_or_a_better_gap_without_slippage() -> None:
    book = long_with_exits(None, 5)
    fill = book.check_exits(bar=2, open_price=101, high=107, low=100, slippage=0.01)
    assert fill is not None and (fill.reason, fill.price) == ("take_profit", 105)
    gapped = long_with_exits(None, 5)
    fill = gapped.check_exits(bar=2, open_price=108, high=109, low=107, slippage=0.01)
    assert fill is not None and fill.price == 108


def test_bar_touching_both_levels_fills_the_stop_first() -> None:
    book = long_with_exits(5, 5)
    fill = book.check_exits(bar=2, open_price=100, high=106, low=94, slippage=0.0)
    assert fill is not None and (fill.reason, fill.price) == ("stop_loss", 95)


def test_short_stop_and_take_profit_levels() -> None:
    book = portfolio()
    book.rebalance(-1.0, bar=1, open_price=100, slippage=0)
    book.set_exits(stop_loss_pct=5, take_profit_pct=10)
    assert (book.stop_price, book.take_price) == (pytest.approx(105), pytest.approx(90))
    fill = book.check_exits(bar=2, open_price=104, high=106, low=103, slippage=0.002)
    assert fill is not None and fill.reason == "stop_loss" and fill.price == pytest.approx(105 * 1.002)
    book.rebalance(-1.0, bar=3, open_price=100, slippage=0)
    book.set_exits(stop_loss_pct=5, take_profit_pct=10)
    fill = book.check_exits(bar=4, open_price=85, high=86, low=84, slippage=0.002)
    assert fill is not None and fill.reason == "take_profit" and fill.price == 85


def test_stop_loss_gap_through_the_env() -> None:
    candles = ohlc_candles([
        (100, 100, 100, 100), (100, 100, 100, 100), (100, 100, 100, 100),
        (100, 101, 99, 100), (90, 91, 88, 89), (89, 89, 89, 89),
    ])
    env = make_env(candles)
    env.reset(options={"start": 2, "decisions": 2})
    env.step(long(1.0, stop_loss=5))
    messages, _, _, _, info = env.step(hold())
    (fill,) = info["fills"]
    assert (fill["reason"], fill["bar"], fill["price"]) == ("stop_loss", 4, 90)
    assert "Stop-loss filled sell" in messages[0]["content"]
    assert info["equity"] == pytest.approx(9_000)  # flat after the stop: the fall to 89 no longer hurts


def test_take_profit_through_the_env_and_place_order_replaces_levels() -> None:
    candles = ohlc_candles([
        (100, 100, 100, 100), (100, 100, 100, 100), (100, 100, 100, 100),
        (100, 101, 99, 100), (100, 112, 99, 111), (111, 111, 111, 111),
    ])
    env = make_env(candles)
    env.reset(options={"start": 2, "decisions": 2})
    env.step(long(1.0, stop_loss=5, take_profit=20))
    assert env.portfolio.take_price == pytest.approx(120)
    env_step = env.step(long(1.0, take_profit=10))  # same target: no trade, but the levels are replaced
    info = env_step[4]
    assert env.portfolio.units == 0 and info["fills"][0]["reason"] == "take_profit"
    assert info["fills"][0]["price"] == pytest.approx(110)


# ----------------------------------------------------------------------------------- fees


@given(
    seed=st.integers(0, 10_000),
    targets=st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0, None]), min_size=4, max_size=10),
    stop=st.one_of(st.none(), st.floats(0.5, 5)),
)
@settings(max_examples=40, deadline=None)
def test_fees_never_increase_profit(seed: int, targets: list[float | None], stop: float | None) -> None:
    candles = random_candles(40, seed=seed, sigma=0.03)
    replay = MarketReplay.build(candles, indicators=["rsi_3"])
    curves = []
    for fee_bps in (0.0, 10.0):
        env = make_env(replay, fee_bps=fee_bps, slippage_bps=5, slippage_vol_frac=0.5,
                       indicators=["rsi_3"], observe_indicators=[])
        env.reset(seed=seed, options={"start": 2, "decisions": len(targets)})
        for target in targets:
            if target is None:
                text = hold()
            elif target == 0:
                text = close()
            else:
                order = long if target > 0 else short
                text = order(abs(target), stop_loss=stop) if stop else order(abs(target))
            _, _, terminated, truncated, _ = env.step(text)
            if terminated or truncated:
                break
        curves.append(env.equity_curve().tolist())
    free, paid = curves
    assert len(paid) <= len(free)
    for with_fee, without in zip(paid, free, strict=False):
        assert with_fee <= without + 1e-9 * abs(without)


def test_fee_is_charged_on_every_fill_and_a_flat_round_trip_loses_exactly_the_costs() -> None:
    book = portfolio(fee_bps=10)
    book.rebalance(1.0, bar=1, open_price=100, slippage=0.001)
    book.rebalance(0.0, bar=2, open_price=100, slippage=0.001)
    bought = 10_000 / 100.1
    assert book.fees_paid == pytest.approx(10 + bought * 99.9 / 1e3)
    assert book.equity(100) == pytest.approx(10_000 - bought * 0.2 - book.fees_paid)
    assert math.isclose(book.realized_pnl, bought * (99.9 - 100.1))
