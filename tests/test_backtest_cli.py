"""`r1trade backtest` end to end on the shipped sample: report files, a hand-checked buy-and-hold, errors."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SAMPLE, make_synthetic_candles, run_in_a_fresh_process

from r1trade.cli import main
from r1trade.config import BacktestConfig, load_config
from r1trade.data.source import load_config_candles
from r1trade.data.splits import make_splits
from r1trade.data.store import load_clean_candles, save_candles
from r1trade.data.synthetic import decision_grid

DEFAULT_STRATEGIES = BacktestConfig().strategies
REPORT_FILES = (
    "metrics.json", "trades.csv", "equity.csv", "hits.csv", "equity.png", "report.html", "metrics.md", "config.yaml",
)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_buy_and_hold_alone_matches_a_hand_computation(capsys, tmp_path: Path) -> None:
    args = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold", "--out", str(tmp_path)]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert all((tmp_path / name).is_file() for name in REPORT_FILES)
    document = json.loads((tmp_path / "metrics.json").read_text())
    assert list(document["strategies"]) == ["buy_and_hold"]

    config = load_config("smoke")
    candles, _ = load_clean_candles(SAMPLE)
    test = make_splits(candles, config.data.split).test
    fee, slippage = config.env.fee_bps / 1e4, config.env.slippage_bps / 1e4
    # decided at the first close, filled at the next open with slippage; the fee is paid from cash on entry
    fill = test["open"].iloc[1] * (1 + slippage)
    expected = 100 * (test["close"].iloc[-1] / fill - fee - 1)
    metrics = document["strategies"]["buy_and_hold"]
    assert metrics["Return [%]"] == pytest.approx(expected, rel=1e-12)
    assert metrics["Fees Paid"] == pytest.approx(fee * config.env.initial_cash)
    assert metrics["# Trades"] == 1
    assert document["period"] == {
        "start": test.index[0].isoformat(), "end": test.index[-1].isoformat(), "bars": len(test)
    }
    assert "Return [%]" in out and "report.html" in out and str(tmp_path) in out
    # scored every 4 bars (env.decision_every) from the first bar: long from the first fill, so right where
    # the price rose from the next open to the close 4 bars after the decision
    every = config.env.decision_every
    bars = np.arange(0, len(test) - every, every)
    up = test["close"].to_numpy()[bars + every] > test["open"].to_numpy()[bars + 1]
    assert metrics["Direction Accuracy [%]"] == pytest.approx(100 * up.mean(), rel=1e-12)
    assert metrics["Action Entropy [nats]"] is None
    assert document["decisions"]["count"] == len(bars) and document["decisions"]["first_bar"] == 0
    assert "Direction Accuracy [%]" in out and "Action Entropy [nats]" in out
    assert "| Direction Accuracy [%] |" in (tmp_path / "metrics.md").read_text()
    assert "<th>Direction Accuracy [%]</th>" in (tmp_path / "report.html").read_text()


def test_oracle_direction_accuracy_is_the_planted_edge(capsys, tmp_path: Path) -> None:
    # On the planted-edge market (p = 0.8) the oracle's position points the way of the next interval about
    # 80 % of the time, and buy-and-hold's is the share of rising intervals (about half). Both exactly: each
    # decision sits on an interval end and its move (next open = this close, to the close 4 bars later) is
    # the next interval's change.
    args = ["backtest", "--config", "planted_edge", "--strategy", "oracle", "--out", str(tmp_path)]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "metrics.json").read_text())
    oracle, buy_and_hold = (document["strategies"][name] for name in ("oracle", "buy_and_hold"))

    config = load_config("planted_edge")
    test = make_splits(load_config_candles(config)[0], config.data.split).test
    grid, every = decision_grid(test), config.env.decision_every
    bars = np.arange(grid.first, len(test) - every, every)
    close = test["close"].to_numpy()
    assert np.array_equal(test["open"].to_numpy()[1:], close[:-1])  # a bar opens at the previous close
    nxt = np.sign(close[bars + every] - close[bars])  # the interval each decision's position is held over
    last = np.where(bars >= every, np.sign(close[bars] - close[np.maximum(bars - every, 0)]), 0.0)
    assert document["decisions"]["count"] == len(bars) > 200
    assert document["decisions"]["first_bar"] == grid.first
    assert oracle["Direction Accuracy [%]"] == pytest.approx(100 * np.mean(last * nxt > 0), rel=1e-12)
    assert buy_and_hold["Direction Accuracy [%]"] == pytest.approx(100 * np.mean(nxt > 0), rel=1e-12)
    assert 75 <= oracle["Direction Accuracy [%]"] <= 85
    # rising intervals come in runs (p = 0.8), so their share over ~290 intervals varies by about ±6 points
    assert 40 <= buy_and_hold["Direction Accuracy [%]"] <= 62
    assert oracle["Action Entropy [nats]"] is None and buy_and_hold["Action Entropy [nats]"] is None


def test_all_baselines_into_the_default_report_dir(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "backtest", "--config", "smoke")
    assert code == 0, err
    report = tmp_path / "reports" / "smoke-test"
    assert all((report / name).is_file() for name in REPORT_FILES)
    document = json.loads((report / "metrics.json").read_text())
    assert list(document["strategies"]) == DEFAULT_STRATEGIES
    assert document["strategies"]["random"]["Seeds"] == load_config("smoke").backtest.random_seeds
    assert document["splits"]["test"]["rows"] == document["period"]["bars"]
    assert document["bars_per_year"] == 8760
    equity = pd.read_csv(report / "equity.csv", index_col=0)
    assert list(equity.columns) == DEFAULT_STRATEGIES
    assert set(pd.read_csv(report / "trades.csv")["strategy"]) == set(DEFAULT_STRATEGIES)
    assert "random: seeds 0–1" in out


def test_a_backtest_of_rules_alone_imports_no_model_library(tmp_path: Path) -> None:
    """torch, transformers and peft take seconds to import and a rule needs none of them."""
    args = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold", "--out", str(tmp_path)]
    codes, imported, err = run_in_a_fresh_process([args])
    assert codes == [0] and imported == [], err


def test_data_and_split_flags(capsys, tmp_path: Path) -> None:
    data = save_candles(make_synthetic_candles(600), tmp_path / "synthetic.csv")
    args = ["backtest", "--config", "smoke", "--strategy", "sma_crossover", "--data", str(data),
            "--split", "validation", "--out", str(tmp_path / "out")]
    code, _, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert document["data"]["symbol"] == "TEST/USD" and document["split"] == "validation"
    assert document["period"]["bars"] == document["splits"]["validation"]["rows"]
    saved = load_config(tmp_path / "out" / "config.yaml")
    assert saved.data.path == str(data) and saved.backtest.split == "validation"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--strategy", "moon"], 2, "unknown strategy 'moon': use one of buy_and_hold, sma_crossover"),
        (["--checkpoint", "runs/x/step-1"], 2, "checkpoint not found: 'runs/x/step-1' (agent backtests need"),
        (["--split", "future"], 2, "backtest.split: Input should be 'train', 'validation' or 'test'"),
    ],
)
def test_errors_are_one_line(capsys, tmp_path: Path, args: list[str], code: int, message: str) -> None:
    returned, _, err = run(capsys, "backtest", "--config", "smoke", "--out", str(tmp_path / "out"), *args)
    assert returned == code
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_empty_checkpoint_directory_is_refused_in_one_line(capsys, tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()
    out = tmp_path / "out"
    args = ["backtest", "--config", "smoke", "--checkpoint", str(checkpoint), "--out", str(out)]
    code, _, err = run(capsys, *args)
    assert code == 2
    assert f"incomplete checkpoint '{checkpoint}': missing policy, critic" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_min_annualise_days_blanks_cagr_and_says_why(capsys, tmp_path: Path) -> None:
    # the smoke test split spans about 125 days: a 200-day minimum leaves CAGR, Sortino and Calmar out
    args = ["backtest", "--config", "smoke", "--strategy", "buy_and_hold", "--out", str(tmp_path),
            "--set", "backtest.min_annualise_days=200"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    metrics = json.loads((tmp_path / "metrics.json").read_text())["strategies"]["buy_and_hold"]
    assert all(metrics[row] is None for row in ("CAGR [%]", "Sortino Ratio", "Calmar Ratio"))
    assert metrics["Sharpe Ratio"] is not None
    assert "are not shown (—)" in out and "backtest.min_annualise_days (200)" in out
