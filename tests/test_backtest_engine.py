import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1trade.backtest.engine import FILL_COLUMNS, TRADE_COLUMNS, BacktestResult, run_vectorized
from r1trade.backtest.strategies import sma_crossover


def candles(opens: list[float], closes: list[float]) -> pd.DataFrame:
    index = pd.date_range("2024-01-01", periods=len(opens), freq="1h", tz="UTC", name="timestamp")
    o, c = np.asarray(opens, dtype=float), np.asarray(closes, dtype=float)
    return pd.DataFrame(
        {"open": o, "high": np.maximum(o, c), "low": np.minimum(o, c), "close": c, "volume": 1.0}, index=index
    )


def random_walk(n: int, seed: int, step: float = 0.01) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    closes = 100 * np.exp(np.cumsum(rng.normal(0, step, n)))
    opens = np.r_[100.0, closes[:-1]] * np.exp(rng.normal(0, step / 5, n))
    return candles(list(opens), list(closes))


def run(data: pd.DataFrame, target: list[float], **costs: float) -> BacktestResult:
    costs = {"initial_cash": 1000.0, "fee_bps": 0.0, "slippage_bps": 0.0, **costs}
    return run_vectorized(data, pd.Series(target, index=data.index, dtype=float), **costs)


def test_long_round_trip_with_fee_and_slippage() -> None:
    data = candles([100, 100, 110, 120], [100, 105, 115, 125])
    result = run(data, [1, 1, 0, 0], fee_bps=10, slippage_bps=100)
    # bar 1 open 100 → buy at 101: units = 1000 / 101, cost 1000, fee 0.1 % × 1000 = 1 → cash -1
    units = 1000 / 101
    # bar 3 open 120 → sell at 118.8: proceeds 118.8 × units, fee 0.1 % of that
    proceeds = 118.8 * units
    final_cash = -1 + proceeds - 0.001 * proceeds
    np.testing.assert_allclose(result.equity, [1000, -1 + 105 * units, -1 + 115 * units, final_cash])
    np.testing.assert_allclose(result.position, [0, units, units, 0])
    np.testing.assert_allclose(result.cash, [1000, -1, -1, final_cash])
    assert result.fees_paid == pytest.approx(1 + 0.001 * proceeds)
    assert result.fills["side"].tolist() == [1, -1]
    assert result.fills["price"].tolist() == pytest.approx([101, 118.8])
    (trade,) = result.trades.itertuples()
    assert (trade.entry_time, trade.exit_time) == (data.index[1], data.index[3])
    assert (trade.direction, trade.is_open) == (1, False)
    assert (trade.entry_price, trade.exit_price) == pytest.approx((101, 118.8))
    assert trade.pnl == pytest.approx(final_cash - 1000)


def test_short_with_costs_and_the_last_decision_never_fills() -> None:
    data = candles([100, 100, 90, 80], [100, 95, 85, 80])
    result = run(data, [-1, -1, -1, 0], fee_bps=10, slippage_bps=100)
    # bar 1 open 100 → sell at 99: units = -1000 / 99, proceeds 1000, fee 1 → cash 1999
    units = -1000 / 99
    np.testing.assert_allclose(result.equity, [1000, 1999 + 95 * units, 1999 + 85 * units, 1999 + 80 * units])
    assert len(result.fills) == 1  # the flat decision on the last bar is ignored
    (trade,) = result.trades.itertuples()
    # still open: marked at the last close, no exit costs
    assert (trade.direction, trade.is_open, trade.exit_price) == (-1, True, 80)
    assert trade.pnl == pytest.approx((99 - 80) * 1000 / 99 - 1)


def test_flip_is_one_fill_and_two_trades() -> None:
    data = candles([100, 100, 120, 110, 100], [100, 110, 115, 105, 100])
    result = run(data, [1, -1, -1, -1, 1], fee_bps=10)
    # bar 1: buy 10 at 100, fee 1 → cash -1
    # bar 2: equity at 120 = -1 + 1200 = 1199 → target units -1199 / 120; sell 10 + 1199 / 120 at 120
    short_units = 1199 / 120
    notional = (10 + short_units) * 120
    cash = -1 + notional - 0.001 * notional
    np.testing.assert_allclose(result.position, [0, 10, -short_units, -short_units, -short_units])
    np.testing.assert_allclose(result.equity.iloc[-1], cash - short_units * 100)
    assert len(result.fills) == 2
    long, short = result.trades.itertuples()
    close_fee = 0.001 * notional * 10 / (10 + short_units)
    assert long.pnl == pytest.approx(10 * (120 - 100) - 1 - close_fee)
    assert (short.entry_time, short.direction, short.is_open) == (data.index[2], -1, True)
    assert short.units == pytest.approx(short_units)
    assert short.pnl == pytest.approx(short_units * (120 - 100) - (0.001 * notional - close_fee))
    assert result.trades["pnl"].sum() == pytest.approx(result.equity.iloc[-1] - 1000)


def test_flat_target_trades_nothing() -> None:
    data = random_walk(6, seed=0)
    result = run(data, [0] * 6, fee_bps=10, slippage_bps=5)
    np.testing.assert_array_equal(result.equity, 1000.0)
    assert result.fills.empty and result.trades.empty
    assert list(result.trades.columns) == TRADE_COLUMNS
    stats = result.metrics()
    assert stats["# Trades"] == 0 and stats["Fees Paid"] == 0 and stats["Exposure Time [%]"] == 0


def test_scaling_in_and_out_stays_one_trade() -> None:
    data = candles([100, 100, 100, 100, 100, 100], [100, 100, 100, 100, 100, 100])
    result = run(data, [0.5, 1, 0.5, 0, 0, 0])
    assert result.fills["units"].tolist() == pytest.approx([5, 5, -5, -5])
    assert len(result.trades) == 1 and result.trades["units"].iloc[0] == pytest.approx(10)


def test_unchanged_target_is_not_rebalanced() -> None:
    data = candles([100, 100, 200, 50], [100, 200, 50, 100])
    result = run(data, [0.5, 0.5, 0.5, 0.5])
    assert len(result.fills) == 1


def test_equity_up_to_t_ignores_targets_after_t() -> None:
    data = random_walk(30, seed=1)
    rng = np.random.default_rng(2)
    base = rng.choice([-1.0, 0.0, 0.5, 1.0], size=30)
    changed = np.r_[base[:13], rng.uniform(-1, 1, size=17)]
    left, right = (
        run(data, list(base), fee_bps=10, slippage_bps=5),
        run(data, list(changed), fee_bps=10, slippage_bps=5),
    )
    np.testing.assert_array_equal(left.equity[:13], right.equity[:13])


def test_trade_pnl_sums_to_equity_change() -> None:
    data = random_walk(300, seed=3)
    result = run_vectorized(
        data,
        sma_crossover(data, fast=5, slow=20, allow_short=True),
        initial_cash=1000,
        fee_bps=10,
        slippage_bps=5,
    )
    assert len(result.trades) > 5
    assert list(result.fills.columns) == FILL_COLUMNS and list(result.trades.columns) == TRADE_COLUMNS
    assert result.trades["pnl"].sum() == pytest.approx(result.equity.iloc[-1] - 1000, rel=1e-9)
    assert result.fills["fee"].sum() == pytest.approx(result.trades["fees"].sum())


@pytest.mark.parametrize(
    "target, message",
    [([0, np.nan, 0, 0], "NaN"), ([0, 1.5, 0, 0], r"\[0, 1\]"), ([0, -0.5, 0, 0], r"\[0, 1\]")],
)
def test_invalid_targets_are_rejected(target: list[float], message: str) -> None:
    data = random_walk(4, seed=0)
    with pytest.raises(ValueError, match=message):
        run_vectorized(
            data,
            pd.Series(target, index=data.index),
            initial_cash=1,
            fee_bps=0,
            slippage_bps=0,
            allow_short=False,
        )


def test_target_must_share_the_candles_index() -> None:
    data = random_walk(4, seed=0)
    with pytest.raises(ValueError, match="index"):
        run_vectorized(data, pd.Series([0.0] * 4), initial_cash=1, fee_bps=0, slippage_bps=0)


@settings(max_examples=60, deadline=None)
@given(
    targets=st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.3, 0.5, 1.0]), min_size=2, max_size=40),
    seed=st.integers(0, 2**16),
    fee_bps=st.floats(0.1, 100.0),
    slippage_bps=st.floats(0.0, 50.0),
)
def test_fees_never_increase_equity(
    targets: list[float], seed: int, fee_bps: float, slippage_bps: float
) -> None:
    # ±1 % moves over ≤ 40 bars keep even a full short solvent, where a lower equity means a smaller loss
    data = random_walk(len(targets), seed=seed, step=0.01)
    with_fees = run(data, targets, fee_bps=fee_bps, slippage_bps=slippage_bps)
    without = run(data, targets, slippage_bps=slippage_bps)
    assert (with_fees.equity <= without.equity * (1 + 1e-12)).all()
    assert with_fees.trades["pnl"].sum() == pytest.approx(with_fees.equity.iloc[-1] - 1000, abs=1e-6)


def vectorbt_replay(
    data: pd.DataFrame, target: pd.Series, *, fee_bps: float, slippage_bps: float, cash: float
):
    """The same orders through vectorbt: order at row t + 1 at that open, valued at the fill price."""
    vbt = pytest.importorskip("vectorbt")
    values = target.to_numpy()
    previous = np.r_[0.0, values[:-1]]
    decided = np.flatnonzero(values[:-1] != previous[:-1])  # the last bar's decision never fills
    size, side = np.full(len(values), np.nan), np.zeros(len(values))
    size[decided + 1] = values[decided]
    side[decided + 1] = np.sign(values[decided] - previous[decided])  # exact for levels {-a, 0, a}, a ≤ 1
    slippage = slippage_bps / 1e4
    return vbt.Portfolio.from_orders(
        data["close"],
        size=size,
        size_type="targetpercent",
        direction="both",
        price=data["open"],
        val_price=np.where(side != 0, data["open"] * (1 + side * slippage), np.inf),
        fees=fee_bps / 1e4,
        slippage=slippage,
        init_cash=cash,
        freq="1h",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "scale, fee_bps, slippage_bps",
    # vectorbt caps a buy at the cash on hand, so 100 % targets are compared without fees
    [(0.5, 10.0, 5.0), (1.0, 0.0, 5.0), (0.8, 25.0, 0.0)],
)
def test_matches_vectorbt(scale: float, fee_bps: float, slippage_bps: float) -> None:
    data = random_walk(400, seed=7)
    target = sma_crossover(data, fast=5, slow=20, allow_short=True) * scale
    ours = run_vectorized(data, target, initial_cash=10_000, fee_bps=fee_bps, slippage_bps=slippage_bps)
    pf = vectorbt_replay(data, target, fee_bps=fee_bps, slippage_bps=slippage_bps, cash=10_000)
    stats = ours.metrics()
    assert stats["# Trades"] == len(pf.positions) > 10
    np.testing.assert_allclose(ours.equity, pf.value(), rtol=1e-9)
    assert stats["Return [%]"] == pytest.approx(100 * pf.total_return(), rel=1e-9)
    assert stats["Max. Drawdown [%]"] == pytest.approx(100 * pf.max_drawdown(), rel=1e-9)
    assert stats["Fees Paid"] == pytest.approx(pf.orders.fees.sum(), rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(ours.trades["pnl"], pf.positions.pnl.values, rtol=1e-9)
