"""The volatility-target baseline: a worked example by hand, no look-ahead, its fills, its parameters, and the
risk-aware rung's config."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import make_synthetic_candles
from env_fixtures import daily

from r1trade.backtest.engine import run_vectorized
from r1trade.backtest.strategies import STRATEGIES, make_targets, vol_target
from r1trade.cli import main
from r1trade.data.store import save_candles

A = 0.8 / math.sqrt(730)
"""A log-return whose alternating pair has an annualised volatility of 0.8: std A·√2 a day, times √365."""


def test_worked_example_by_hand() -> None:
    candles = daily([A, -A, -A, A, A])  # returns r1..r5 end at bars 1..5
    # bar 0: no return, bar 1: one: flat. Bar 2: (r1, r2) = (+A, -A), std A·√2, annualised A·√730 = 0.8, so
    # 0.4 / 0.8 = 0.5. Bar 3: (-A, -A), std 0: capped at max_leverage. Bar 4: (-A, +A): 0.5.
    # Bar 5: (+A, +A): the cap again.
    sized = vol_target(candles, target=0.4, lookback=2, band=0.0)
    assert sized.tolist() == pytest.approx([0.0, 0.0, 0.5, 1.0, 0.5, 1.0])
    capped = vol_target(candles, target=0.4, lookback=2, max_leverage=0.75, band=0.0)
    assert capped.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.75, 0.5, 0.75])
    # band 0.6: 0.5 is within 0.6 of flat, so no trade; 1.0 is not; then 0.5 is within 0.6 of 1.0: kept at 1.0
    banded = vol_target(candles, target=0.4, lookback=2, band=0.6)
    assert banded.tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])


def test_fills_at_the_next_open_with_fees() -> None:
    candles = daily([A, -A, -A, A, A])
    target = vol_target(candles, target=0.4, lookback=2, band=0.0)
    result = run_vectorized(candles, target, initial_cash=1000.0, fee_bps=10, slippage_bps=5,
                            allow_short=False)
    fills = result.fills
    # decided at bar 2's close, filled at bar 3's open with 5 bps slippage; 10 bps fee on the notional
    assert fills["bar"].tolist() == [3, 4, 5]
    first = fills.iloc[0]
    assert first["price"] == pytest.approx(candles["open"].iloc[3] * 1.0005)
    assert first["notional"] == pytest.approx(0.5 * 1000.0)  # half the equity, flat before: 500 of cash
    assert first["fee"] == pytest.approx(0.001 * first["notional"])
    assert result.fees_paid == pytest.approx(0.001 * fills["notional"].sum())


def test_never_uses_a_future_bar() -> None:
    rng = np.random.default_rng(0)
    candles = daily(list(rng.normal(0, 0.03, 199)))
    full = vol_target(candles, target=0.5, lookback=10, band=0.05)
    assert full.iloc[10:].gt(0).all() and full.nunique() > 5  # it trades, at many sizes
    for t in (9, 10, 50, 120, 198):
        altered = candles.copy()
        altered.iloc[t + 1 :] = rng.uniform(1, 1e4, size=(len(candles) - t - 1, 5))
        pd.testing.assert_series_equal(vol_target(altered, target=0.5, lookback=10, band=0.05).iloc[: t + 1],
                                       full.iloc[: t + 1])


def test_registered_with_overridable_parameters() -> None:
    defaults = {"target": 0.5, "lookback": 168, "max_leverage": 1.0, "band": 0.1, "sizes": None}
    assert STRATEGIES["vol_target"].defaults == defaults
    candles = daily([A, -A, -A, A, A])
    assert make_targets("vol_target", candles, target=0.4, lookback=2, band=0.0).tolist() == pytest.approx(
        [0.0, 0.0, 0.5, 1.0, 0.5, 1.0]
    )
    with pytest.raises(ValueError, match="max_leverage"):
        vol_target(candles, max_leverage=0.0)


def test_backtest_params_reach_it_and_bad_ones_are_one_line(capsys, tmp_path) -> None:
    data = save_candles(make_synthetic_candles(600), tmp_path / "candles.parquet")
    args = ["backtest", "--config", "smoke", "--strategy", "vol_target", "--data", str(data),
            "--set", "backtest.bootstrap_resamples=100", "--set", "backtest.params.vol_target.lookback=24"]
    assert main([*args, "--set", "backtest.params.vol_target.target=0.3", "--out", str(tmp_path / "a")]) == 0
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())["strategies"]["vol_target"]
    # a random walk of 1 % hourly steps has about 94 % volatility a year: a 30 % target holds about a third
    assert 10 < metrics["Exposure Time [%]"] and 0 < metrics["Volatility (Ann.) [%]"] < 60
    capsys.readouterr()
    code = main([*args, "--set", "backtest.params.vol_target.max_leverage=2", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "baseline vol_target" in err and "max_leverage" in err


def test_btc_risk_config(capsys) -> None:
    assert main(["show-config", "--config", "btc_risk"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["data"]["path"] == "data/sample/btc_usd_1h.parquet"
    assert config["model"]["name_or_path"] == "smollm2-135m-instruct" and config["model"]["lora"]["enabled"]
    assert config["env"]["volatility_tool"] is True
    rewards = config["rewards"]
    assert rewards["variance"] < 0 and rewards["drawdown"] < 0 and rewards["pnl"] > 0
    assert {"buy_and_hold", "vol_target"} <= set(config["backtest"]["strategies"])
