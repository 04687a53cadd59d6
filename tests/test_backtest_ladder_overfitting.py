"""`r1trade overfitting`: per-decision returns read back from report folders equal the ones the backtest cut,
and the PBO over a ladder's runs, through the CLI in a subprocess."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import make_synthetic_candles

from r1trade.backtest.bootstrap import DecisionSample
from r1trade.backtest.ladder_overfitting import report_folder, report_returns
from r1trade.backtest.overfitting import backtest_overfitting
from r1trade.backtest.report import write_report
from r1trade.backtest.report_runs import ReportContext
from r1trade.backtest.runner import run_backtest, run_baseline
from r1trade.backtest.uncertainty import run_sample
from r1trade.config import Config, load_config
from r1trade.data.splits import split_by_fraction

VARIANTS = {  # the "agents" of the ladder: rule baselines with different settings, written as agent rows
    "fast trend": ("sma_crossover", {"fast": 5, "slow": 20}),
    "slow trend": ("sma_crossover", {"fast": 20, "slow": 60}),
    "reversion": ("rsi_mean_reversion", {}),
}


@pytest.fixture
def context() -> ReportContext:
    config = Config(name="unit")
    config.backtest.risk_free_rate = 0.05  # the returns read back are in excess of it
    splits = split_by_fraction(make_synthetic_candles(1200), train=0.5, validation=0.25)
    return ReportContext(config=config, splits=splits, split="test", bars_per_year=8760.0)


def _agent_report(context: ReportContext, folder: Path, strategy: str, params: dict) -> np.ndarray:
    """A report whose agent row is a rule baseline; returns the per-decision excess returns it was cut into."""
    config = context.config.model_copy(deep=True)
    config.backtest.params = {strategy: params}
    run = replace(run_baseline(strategy, replace(context, config=config)), name="agent (step-1)")
    write_report([run, run_baseline("buy_and_hold", context)], context, folder)
    rf_per_bar = (1.05) ** (1 / 8760.0) - 1
    return run_sample(run, context).excess_returns(rf_per_bar)


def test_returns_read_back_from_a_report_are_the_decisions_it_cut(context: ReportContext, tmp_path: Path) -> None:
    expected = _agent_report(context, tmp_path, "sma_crossover", {})
    found = report_returns(tmp_path)
    assert found.row == "agent (step-1)"
    assert found.returns == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert len(found.returns) == len(context.decision_bars)


def test_returns_read_back_from_a_walk_forward_report_chain_its_folds(tmp_path: Path) -> None:
    config = load_config("smoke")
    config.backtest.bootstrap_resamples = 100
    outcome = run_backtest(config, strategy="sma_crossover", walk_forward=3, out_dir=tmp_path / "wf")
    expected = DecisionSample.concat([
        run_sample(fold.runs[0], fold.context) for fold in outcome.folds
    ]).excess_returns()
    found = report_returns(tmp_path / "wf", row="sma_crossover")
    assert found.returns == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert len(found.decisions[3]) == 3  # each fold's first decision and count


def test_the_report_folder_is_the_last_backtests_out() -> None:
    command = ("r1trade train --config demo --set name=demo-o; r1trade backtest --checkpoint runs/x/step-3 "
               "--out reports/first --force; r1trade backtest --config demo -o reports/second --force")
    assert report_folder(command) == Path("reports/second")
    assert report_folder("r1trade backtest --out=reports/x") == Path("reports/x")
    assert report_folder("r1trade train --out reports/x") is None  # not a backtest
    assert report_folder("r1trade backtest --checkpoint runs/x") is None


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "r1trade.cli", "overfitting", *args], cwd=tmp_path,
                          check=False, capture_output=True, text=True, timeout=120)


def test_pbo_over_a_ladders_runs_through_the_cli(context: ReportContext, tmp_path: Path) -> None:
    records, columns = [], []
    for number, (variant, (strategy, params)) in enumerate(VARIANTS.items()):
        folder = f"reports/run{number}"
        columns.append(_agent_report(context, tmp_path / folder, strategy, params))
        command = f"r1trade train --set name=run{number}; r1trade backtest --checkpoint x --out {folder} --force"
        records.append({"level": "btc", "variant": f"trend/{variant}", "seed": number, "command": command})
    records.append({"level": "tool_gated", "variant": "trend/other market", "command": "r1trade backtest"})
    (tmp_path / "ladder.json").write_text(json.dumps(records))
    expected = backtest_overfitting(np.column_stack(columns), blocks=4)

    result = _cli(tmp_path, "--ladder", "ladder.json", "--level", "btc", "--blocks", "4")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert f"PBO = {expected.probability:.3f}: over the C(4, 2) = 6 splits" in out
    assert f"splits of the last {expected.periods:,} decisions into 4 blocks" in out
    assert expected.periods == len(context.decision_bars) // 4 * 4
    assert "trend/fast trend" in out and "reports/run2" in out and "other market" not in out

    # a record whose report folder is not there: one line naming it, exit 2
    records[1]["command"] = "r1trade backtest --checkpoint x --out reports/gone"
    (tmp_path / "ladder.json").write_text(json.dumps(records))
    result = _cli(tmp_path, "--ladder", "ladder.json", "--level", "btc", "--blocks", "4")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "1 of the 3 btc records lack per-decision returns" in result.stderr
    assert "'trend/slow trend (seed 1)': reports/gone has no metrics.json or equity.csv" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--level", "moon"], "--level must be one of planted_edge, btc, tool_gated, multi_decision, vol_target, not 'moon'"),
        (["--level", "btc", "--ladder", "absent.json"], "no such file: absent.json"),
        (["--level", "btc", "--prefix", "zzz"], "has 0 btc records whose variant starts with 'zzz'"),
        (["--level", "tool_gated"], "has 1 tool_gated record whose variant starts with ''"),
        (["--level", "btc", "--blocks", "3"], "--blocks 3: the blocks must be an even number"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path: Path, args: list[str], message: str) -> None:
    records = [{"level": "btc", "variant": f"v{k}", "command": f"r1trade backtest --out r{k}"} for k in range(2)]
    records.append({"level": "tool_gated", "variant": "t", "command": "r1trade backtest"})
    (tmp_path / "ladder.json").write_text(json.dumps(records))
    for k in range(2):  # two identical reports of one agent row over 8 decisions
        folder = tmp_path / f"r{k}"
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps({
            "strategies": {"agent (step-1)": {}}, "risk_free_rate": 0.0, "bars_per_year": 8760.0,
            "period": {"start": "2024-01-01T00:00:00+00:00", "end": "2024-01-01T16:00:00+00:00", "bars": 17},
            "evaluated_bars": {"first": 0, "last": 16}, "decisions": {"first_bar": 0, "every": 2, "count": 8},
        }))
        equity = 100.0 * np.cumprod(1 + 0.01 * np.sin(np.arange(17)))
        rows = "".join(f"2024-01-01 {hour:02d}:00,{value}\n" for hour, value in enumerate(equity))
        (folder / "equity.csv").write_text("timestamp,agent (step-1)\n" + rows)
    result = _cli(tmp_path, "--ladder", "ladder.json", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert message in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
