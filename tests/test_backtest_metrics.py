import math

import numpy as np
import pandas as pd
import pytest

from r1trade.backtest.metrics import (
    EXTRAPOLATED,
    action_entropy,
    annualisation_note,
    compute_metrics,
    direction_accuracy,
    drawdown,
    held_moves,
    infer_bars_per_year,
    longest_underwater_bars,
    per_bar_rate,
    sharpe_ratio,
    simple_returns,
    sortino_ratio,
    trade_stats,
)


def series(values: list[float], freq: str = "1D") -> pd.Series:
    index = pd.date_range("2024-01-01", periods=len(values), freq=freq, tz="UTC", name="timestamp")
    return pd.Series(values, index=index, dtype=float)


def test_golden_metrics_table() -> None:
    # Six daily points with returns r = +10 %, -10 %, +10 %, +10 %, -5 %:
    #   100 → 110 → 99 → 108.9 → 119.79 → 113.8005
    # mean(r) = 0.15 / 5 = 0.03; deviations 0.07, -0.13, 0.07, 0.07, -0.08, squares sum to 0.038,
    #   std(ddof=1) = sqrt(0.038 / 4) = sqrt(0.0095) = 0.0974679434...
    # bars_per_year = 365 (daily index), sqrt(365) = 19.1049731745...
    # Sharpe = 0.03 / 0.0974679434 * 19.1049731745 = 5.8803866683
    # Volatility = 100 * 0.0974679434 * 19.1049731745 = 186.2122444954 %
    # Sortino: downside min(r, 0) = 0, -0.1, 0, 0, -0.05 → mean of squares (0.01 + 0.0025) / 5 = 0.0025,
    #   DD = 0.05 → 0.03 / 0.05 * 19.1049731745 = 11.4629839047
    # Return = 13.8005 %; elapsed 5 days = 5/365 years → CAGR = 1.138005 ** 73 - 1 = 12545.5529793687 (×100 %)
    # Max drawdown: peak 110 → 99 = -10 % (the later 119.79 → 113.8005 is only -5 %); Calmar = CAGR / 0.10
    # Underwater bars: 99 and 108.9 (below 110), then 113.8005 (below 119.79) → longest run 2 bars
    # Trades pnl 5, -2, 3, 0 → 4 trades, 2 winners = 50 %, profit factor (5 + 3) / 2 = 4
    # Positions 0, 1, 1, 0, 1, 1 → exposure 4 / 6; traded notional = sum(equity) = 6 × mean → turnover 6
    # Three scored decisions: long before a +0.5 move (right), short before -0.2 (right), flat before +0.1
    #   (flat is wrong) → direction accuracy 2 / 3; actions long, hold → entropy ln 2
    # The 5-day span is under the 30-day minimum, so by default CAGR, Sortino and Calmar are NaN ("—");
    # min_annualise_days=0 computes them, which checks the formulas above.
    equity = series([100, 110, 99, 108.9, 119.79, 113.8005])
    trades = pd.DataFrame({"pnl": [5.0, -2.0, 3.0, 0.0]})
    positions = pd.Series([0, 1, 1, 0, 1, 1], index=equity.index, dtype=float)
    scored = {
        "decision_positions": np.array([1.0, -1.0, 0.0]),
        "decision_moves": np.array([0.5, -0.2, 0.1]),
        "actions": ["long", "hold"],
    }
    stats = compute_metrics(
        equity, trades=trades, positions=positions, fees_paid=1.5, traded_notional=651.4905,
        min_annualise_days=0, **scored,
    )
    cagr = 1.138005**73 - 1
    expected = {
        "Start": pd.Timestamp("2024-01-01", tz="UTC"),
        "End": pd.Timestamp("2024-01-06", tz="UTC"),
        "Duration [days]": 5.0,
        "Exposure Time [%]": 100 * 4 / 6,
        "Equity Final": 113.8005,
        "Equity Peak": 119.79,
        "Return [%]": 13.8005,
        "CAGR [%]": 100 * cagr,
        "Volatility (Ann.) [%]": 186.21224449536072,
        "Sharpe Ratio": 5.880386668274549,
        "Sortino Ratio": 11.462983904725679,
        "Calmar Ratio": cagr / 0.10,
        "Max. Drawdown [%]": -10.0,
        "Max. Drawdown Duration [bars]": 2.0,
        "# Trades": 4.0,
        "Win Rate [%]": 50.0,
        "Profit Factor": 4.0,
        "Fees Paid": 1.5,
        "Turnover": 6.0,
        "Direction Accuracy [%]": 100 * 2 / 3,
        "Action Entropy [nats]": math.log(2),
    }
    assert list(stats) == list(expected)
    for key, value in expected.items():
        assert stats[key] == (value if isinstance(value, pd.Timestamp) else pytest.approx(value, rel=1e-9)), (
            key
        )
    short = compute_metrics(
        equity, trades=trades, positions=positions, fees_paid=1.5, traded_notional=651.4905, **scored
    )
    assert list(short) == list(expected)
    for key, value in expected.items():
        if key in ("CAGR [%]", "Sortino Ratio", "Calmar Ratio"):
            assert math.isnan(short[key]), key
        else:
            assert short[key] == stats[key], key


def test_direction_accuracy_worked_example() -> None:
    # Nine bars, a decision every 2 bars at bars 0, 2, 4, 6. The decision at bar d fills at open[d + 1] and is
    # held to close[d + 2], so its move is close[d + 2] - open[d + 1]:
    #   d = 0: close[2] - open[1] = 102 - 101 = +1     long  (+2.0)  → right
    #   d = 2: close[4] - open[3] =  98 - 102 = -4     flat  ( 0.0)  → wrong (flat counts as wrong)
    #   d = 4: close[6] - open[5] = 101 - 102 = -1     short (-1.0)  → right (the gap up to open[5] = 102 is
    #          not held: close to close, 98 → 101, would have been +3 and called it wrong)
    #   d = 6: close[8] - open[7] = 101 - 101 =  0     long  (+1.0)  → wrong (a zero move counts as wrong)
    # → 2 right of 4 = 50 %.
    opens = np.array([100, 101, 103, 102, 99, 102, 100, 101, 100], dtype=float)
    closes = np.array([101, 103, 102, 99, 98, 100, 101, 100, 101], dtype=float)
    moves = held_moves(opens, closes, np.array([0, 2, 4, 6]), 2)
    np.testing.assert_array_equal(moves, [1.0, -4.0, -1.0, 0.0])
    assert direction_accuracy(np.array([2.0, 0.0, -1.0, 1.0]), moves) == 50.0
    assert direction_accuracy(np.array([1.0, -1.0, -0.5, -1.0]), moves) == 75.0  # only the zero move is wrong
    assert direction_accuracy(np.zeros(4), moves) == 0.0  # always flat: always wrong
    assert math.isnan(direction_accuracy(np.array([]), np.array([])))
    with pytest.raises(ValueError, match="one value per decision"):
        direction_accuracy(np.array([1.0]), moves)
    with pytest.raises(ValueError, match="no whole interval"):  # d = 7 would need close[9]
        held_moves(opens, closes, np.array([7]), 2)


def test_action_entropy_worked_example() -> None:
    # long, long, short, hold: shares 1/2, 1/4, 1/4 → -(1/2 ln 1/2 + 2 × 1/4 ln 1/4) = 1/2 ln 2 + ln 2
    assert action_entropy(["long", "long", "short", "hold"]) == pytest.approx(1.5 * math.log(2), rel=1e-12)
    assert action_entropy(["long", "short", "hold", "close"]) == pytest.approx(math.log(4), rel=1e-12)
    assert action_entropy(["hold"] * 5) == 0.0 and str(action_entropy(["hold"])) == "0.0"
    assert math.isnan(action_entropy([]))


def test_rows_without_decisions_are_nan() -> None:
    stats = compute_metrics(series([100.0, 101.0, 102.0]))
    assert math.isnan(stats["Direction Accuracy [%]"]) and math.isnan(stats["Action Entropy [nats]"])


def test_short_window_rule_worked_example() -> None:
    # 33 hourly bars, +1 % each hour except a -2 % hour at bar 10: the span is 32 hours = 1.333 days.
    # Return = 1.01 ** 31 * 0.98 - 1 = 33.4101 %; compounded over a year, 1.334101 ** (365 / 1.3333) - 1
    # = 1.334101 ** 273.75 - 1 ≈ 1.86e34, a CAGR of ~1.9e36 %: meaningless. Under 30 days (the default
    # backtest.min_annualise_days) CAGR, Sortino and Calmar are NaN; Return, Sharpe and volatility stay.
    steps = [1.01] * 32
    steps[9] = 0.98
    equity = series(list(100 * np.cumprod([1.0, *steps])), "1h")
    stats = compute_metrics(equity)
    assert stats["Duration [days]"] == pytest.approx(32 / 24)
    assert stats["Return [%]"] == pytest.approx(100 * (1.01**31 * 0.98 - 1))
    for key in EXTRAPOLATED:
        assert math.isnan(stats[key]), key
    returns = np.array(steps) - 1
    assert stats["Sharpe Ratio"] == pytest.approx(returns.mean() / returns.std(ddof=1) * math.sqrt(8760))
    assert stats["Volatility (Ann.) [%]"] == pytest.approx(100 * returns.std(ddof=1) * math.sqrt(8760))
    # the rule's threshold is configurable: 1 day lets the 1.33-day window through
    lenient = compute_metrics(equity, min_annualise_days=1)
    assert lenient["CAGR [%]"] == pytest.approx(100 * ((1.01**31 * 0.98) ** (365 / (32 / 24)) - 1))
    assert lenient["CAGR [%]"] > 1e36
    # exactly at the minimum the figures are shown: 30 daily bars span 29 days, 31 span 30
    assert math.isnan(compute_metrics(series([100.0 + i for i in range(30)]))["CAGR [%]"])
    assert not math.isnan(compute_metrics(series([100.0 + i for i in range(31)]))["CAGR [%]"])


def test_annualisation_note_explains_the_dashes() -> None:
    short = annualisation_note(32 / 24, bars_per_year=8760, min_annualise_days=30)
    assert "CAGR [%], Sortino Ratio and Calmar Ratio are not shown (—)" in short
    assert "1.33 days" in short and "backtest.min_annualise_days (30)" in short
    assert "sqrt(8,760)" in short and "Sharpe Ratio" in short
    long = annualisation_note(90, bars_per_year=8760, min_annualise_days=30)
    assert "not shown" not in long and "sqrt(8,760)" in long


def test_flat_equity_without_trades() -> None:
    stats = compute_metrics(
        series([100.0] * 5), trades=pd.DataFrame({"pnl": []}), fees_paid=0.0, min_annualise_days=0
    )
    assert stats["Return [%]"] == 0.0
    assert stats["CAGR [%]"] == 0.0
    assert stats["Volatility (Ann.) [%]"] == 0.0
    assert stats["Max. Drawdown [%]"] == 0.0
    assert stats["Max. Drawdown Duration [bars]"] == 0.0
    assert stats["# Trades"] == 0.0
    for key in ["Sharpe Ratio", "Sortino Ratio", "Calmar Ratio", "Win Rate [%]", "Profit Factor", "Turnover"]:
        assert math.isnan(stats[key]), key


def test_single_bar() -> None:
    stats = compute_metrics(series([100.0]))
    assert stats["Return [%]"] == 0.0
    assert stats["Duration [days]"] == 0.0
    for key in [
        "CAGR [%]",
        "Volatility (Ann.) [%]",
        "Sharpe Ratio",
        "Sortino Ratio",
        "# Trades",
        "Fees Paid",
    ]:
        assert math.isnan(stats[key]), key


def test_bars_per_year_uses_a_365_day_year() -> None:
    assert infer_bars_per_year(series([1.0] * 3, "1h").index) == pytest.approx(8760)
    assert infer_bars_per_year(series([1.0] * 3, "1D").index) == pytest.approx(365)
    assert infer_bars_per_year(series([1.0] * 3, "4h").index) == pytest.approx(2190)
    assert math.isnan(infer_bars_per_year(series([1.0]).index))


def test_explicit_bars_per_year_overrides_inference() -> None:
    equity = series([100, 101, 99, 102], "1h")
    inferred = compute_metrics(equity)["Sharpe Ratio"]
    assert compute_metrics(equity, bars_per_year=8760)["Sharpe Ratio"] == pytest.approx(inferred)
    assert compute_metrics(equity, bars_per_year=365)["Sharpe Ratio"] == pytest.approx(
        inferred / math.sqrt(24)
    )


def test_risk_free_rate_is_compounded_per_bar() -> None:
    returns = np.array([0.01, -0.005, 0.02, 0.0])
    rf = per_bar_rate(0.05, 365)
    assert (1 + rf) ** 365 == pytest.approx(1.05)
    excess = returns - rf
    expected = excess.mean() / excess.std(ddof=1) * math.sqrt(365)
    assert sharpe_ratio(returns, bars_per_year=365, rf_per_bar=rf) == pytest.approx(expected)
    equity = series(list(100 * np.cumprod(np.r_[1.0, 1 + returns])))
    assert compute_metrics(equity, risk_free_rate=0.05)["Sharpe Ratio"] == pytest.approx(expected)


def test_sortino_counts_every_bar_in_the_downside_deviation() -> None:
    # mean 0.005; downside squares 0 and 0.0001 averaged over both bars → DD = sqrt(0.00005); sqrt(4) = 2
    assert sortino_ratio(np.array([0.02, -0.01]), bars_per_year=4) == pytest.approx(
        0.005 / math.sqrt(0.00005) * 2
    )
    assert math.isnan(sortino_ratio(np.array([0.01, 0.02]), bars_per_year=365))


def test_drawdown_helpers() -> None:
    equity = series([100, 120, 90, 120, 130, 117, 110, 130])
    np.testing.assert_allclose(drawdown(equity), [0, 0, -0.25, 0, 0, -0.1, 110 / 130 - 1, 0])
    assert longest_underwater_bars(equity) == 2
    assert longest_underwater_bars(series([100, 90, 80])) == 2
    assert longest_underwater_bars(series([100, 101])) == 0
    np.testing.assert_allclose(simple_returns(series([100, 110, 99])), [0.1, -0.1])


def test_trade_stats_edge_cases() -> None:
    assert trade_stats(np.array([1.0, 2.0]))["Profit Factor"] == math.inf
    assert math.isnan(trade_stats(np.array([0.0]))["Profit Factor"])
    assert trade_stats(np.array([-1.0]))["Profit Factor"] == 0.0
    empty = trade_stats(np.array([]))
    assert (
        empty["# Trades"] == 0.0 and math.isnan(empty["Win Rate [%]"]) and math.isnan(empty["Profit Factor"])
    )
    assert all(math.isnan(v) for v in trade_stats(None).values())


def test_ruin_gives_minus_100_percent_cagr() -> None:
    stats = compute_metrics(series([100, 50, -10]), min_annualise_days=0)
    assert stats["CAGR [%]"] == -100.0
    assert stats["Max. Drawdown [%]"] == pytest.approx(-110.0)


def test_equity_needs_a_datetime_index() -> None:
    with pytest.raises(TypeError):
        compute_metrics(pd.Series([1.0, 2.0]))
