"""Report files are written and well-formed; seeds average as documented; the agent's reasoning is escaped."""

import base64
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_synthetic_candles
from rich.console import Console

from r1trade.backtest.engine import TRADE_COLUMNS
from r1trade.backtest.report import trades_frame, write_report
from r1trade.backtest.report_runs import ReportContext, StrategyRun, format_value
from r1trade.backtest.report_text import best_strategies, comparison_tables, markdown_table
from r1trade.backtest.runner import run_backtest, run_baseline
from r1trade.backtest.strategies import make_targets
from r1trade.config import Config
from r1trade.data.splits import split_by_fraction
from r1trade.errors import ConfigError

HOSTILE = "<script>alert('x')</script> RSI & MACD agree"


@pytest.fixture
def context() -> ReportContext:
    config = Config(name="unit")
    config.backtest.random_seeds = 3
    splits = split_by_fraction(make_synthetic_candles(1200), train=0.5, validation=0.25)
    return ReportContext(config=config, splits=splits, split="test", bars_per_year=8760.0)


def agent_like_run(context: ReportContext) -> StrategyRun:
    """What the agent path hands the report: trades with reasoning text and extra rows."""
    base = run_baseline("sma_crossover", context)
    trades = base.trades.assign(reasoning=[HOSTILE] + ["hold on\nsecond line"] * (len(base.trades) - 1))
    return StrategyRun(
        name="agent", equity=base.equity, trades=trades, metrics=base.metrics,
        extra={"Valid Tool Calls [%]": 87.5, "Actions: buy [%]": 40.0},
    )


def test_report_files_are_well_formed(context: ReportContext, tmp_path: Path) -> None:
    runs = [agent_like_run(context), run_baseline("buy_and_hold", context), run_baseline("random", context)]
    assert len(runs[0].trades) >= 2
    files = write_report(runs, context, tmp_path / "out")
    assert sorted(f.name for f in files) == sorted(
        ["metrics.json", "trades.csv", "equity.csv", "hits.csv", "equity.png", "report.html", "metrics.md",
         "config.yaml"]
    )
    assert all(f.is_file() and f.stat().st_size > 0 for f in files)

    def strict(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    document = json.loads((tmp_path / "out" / "metrics.json").read_text(), parse_constant=strict)
    assert list(document["strategies"]) == ["agent", "buy_and_hold", "random"]
    assert document["strategies"]["agent"]["Valid Tool Calls [%]"] == 87.5
    assert document["strategies"]["random"]["Seeds"] == 3
    for name in ("agent", "buy_and_hold", "random"):  # every strategy is scored; entropy is a model's only
        assert 0 <= document["strategies"][name]["Direction Accuracy [%]"] <= 100
        assert document["strategies"][name]["Action Entropy [nats]"] is None
    assert document["decisions"]["count"] == len(context.decision_bars) > 0
    assert document["decisions"]["every"] == context.config.env.decision_every
    assert "flat" in document["decisions"]["note"]
    assert document["splits"] == context.splits.describe()
    assert document["period"]["bars"] == len(context.candles) and document["split"] == "test"
    assert document["costs"] == {"initial_cash": 10_000.0, "fee_bps": 10.0, "slippage_bps": 2.0}
    assert "random" in document["notes"]

    trades = pd.read_csv(tmp_path / "out" / "trades.csv")
    assert list(trades.columns[: 1 + len(TRADE_COLUMNS)]) == ["strategy", *TRADE_COLUMNS]
    assert {"reasoning", "seed"} <= set(trades.columns)
    assert set(trades["strategy"]) == {"agent", "buy_and_hold", "random"}
    assert sorted(trades["seed"].dropna().unique()) == [0, 1, 2]
    assert trades.loc[trades["strategy"] == "agent", "reasoning"].iloc[0] == HOSTILE

    equity = pd.read_csv(tmp_path / "out" / "equity.csv", index_col=0, parse_dates=True)
    assert list(equity.columns) == ["agent", "buy_and_hold", "random"]
    assert len(equity) == len(context.candles) and (equity.iloc[0] == 10_000.0).all()

    hits = pd.read_csv(tmp_path / "out" / "hits.csv", index_col=0, parse_dates=True)
    assert list(hits.columns) == ["buy_and_hold", "random"]  # the agent-like run here carries no hits
    assert list(hits.index) == list(context.candles.index[context.decision_bars])
    for name in hits.columns:  # the accuracy is the share of its decisions' hits
        assert 100 * hits[name].mean() == pytest.approx(document["strategies"][name]["Direction Accuracy [%]"])
    assert set(hits["buy_and_hold"].unique()) <= {0.0, 1.0}

    assert (tmp_path / "out" / "equity.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "name: unit" in (tmp_path / "out" / "config.yaml").read_text()


def test_html_is_self_contained_and_escapes_reasoning(context: ReportContext, tmp_path: Path) -> None:
    runs = [agent_like_run(context), run_baseline("buy_and_hold", context)]
    write_report(runs, context, tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; RSI &amp; MACD agree" in page
    assert '<table class="metrics">' in page and "<th>Return [%]</th>" in page
    assert "<th>Valid Tool Calls [%]</th>" in page and "<th>Reasoning</th>" in page
    assert "<th>Direction Accuracy [%]</th>" in page and "<th>Action Entropy [nats]</th>" in page
    assert "<b>Decisions</b>: Direction Accuracy [%] scores" in page
    (encoded,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert base64.b64decode(encoded) == (tmp_path / "equity.png").read_bytes()
    assert not re.search(r'(src|href)="(?!data:)', page) and "<link" not in page
    assert "fee 10 bps of notional per fill; slippage 2 bps" in page and "test (evaluated)" in page


def test_random_baseline_averages_its_seeds(context: ReportContext) -> None:
    averaged = run_baseline("random", context)
    singles = []
    for seed in (0, 1, 2):
        context.config.backtest.random_seeds = 1
        context.config.seed = seed
        singles.append(run_baseline("random", context))
    for row in ("Return [%]", "Sharpe Ratio", "Max. Drawdown [%]", "# Trades"):
        assert averaged.metrics[row] == pytest.approx(np.mean([run.metrics[row] for run in singles]))
    mean_curve = pd.concat([run.equity for run in singles], axis=1).mean(axis=1)
    np.testing.assert_allclose(averaged.equity, mean_curve)
    returns = [run.metrics["Return [%]"] for run in singles]
    spread = pytest.approx(np.std(returns, ddof=1))
    assert averaged.extra == {"Seeds": 3.0, "Return Std over Seeds [%]": spread}
    assert len(averaged.trades) == sum(len(run.trades) for run in singles)
    assert "mean" in averaged.note


def test_baselines_are_scored_on_the_decision_grid_by_hand(context: ReportContext, tmp_path: Path) -> None:
    # real-like candles (no planted grid), nothing but baselines: decisions at bars 0, e, 2e, ... of the
    # evaluated bars (e = env.decision_every) while a whole interval follows. Buy-and-hold is long from the
    # open of bar 1 on, so it is right exactly where close[d + e] > open[d + 1].
    every, candles = context.config.env.decision_every, context.candles
    bars = np.arange(0, len(candles) - every, every)
    np.testing.assert_array_equal(context.decision_bars, bars)
    opens, closes = candles["open"].to_numpy(), candles["close"].to_numpy()
    up = closes[bars + every] > opens[bars + 1]
    runs = [run_baseline("buy_and_hold", context), run_baseline("sma_crossover", context)]
    assert runs[0].metrics["Direction Accuracy [%]"] == pytest.approx(100 * up.mean(), rel=1e-12)
    # the crossover: long (target 1) or flat (0) at each decision bar; flat is wrong
    target = make_targets("sma_crossover", context.split_candles).to_numpy()[bars]
    assert runs[1].metrics["Direction Accuracy [%]"] == pytest.approx(100 * ((target > 0) & up).mean())
    assert all(math.isnan(run.metrics["Action Entropy [nats]"]) for run in runs)

    write_report(runs, context, tmp_path)
    markdown = (tmp_path / "metrics.md").read_text()
    accuracies = [format_value("", run.metrics["Direction Accuracy [%]"]) for run in runs]
    (row,) = [line for line in markdown.splitlines() if line.startswith("| Direction Accuracy [%] |")]
    assert row.replace("**", "").split(" | ")[1:] == [*accuracies[:-1], f"{accuracies[-1]} |"]
    assert "| Action Entropy [nats] | — | — |" in markdown


def test_best_values_ignore_nan_and_share_ties() -> None:
    def run(name: str, metrics: dict[str, float]) -> StrategyRun:
        index = pd.date_range("2024-01-01", periods=2, freq="1h", tz="UTC")
        equity = pd.Series(1.0, index=index)
        return StrategyRun(name=name, equity=equity, trades=pd.DataFrame(), metrics=metrics)

    runs = [
        run("a", {"Sharpe Ratio": 1.0, "Volatility (Ann.) [%]": 30.0, "Exposure Time [%]": 50.0}),
        run("b", {"Sharpe Ratio": 1.0, "Volatility (Ann.) [%]": 20.0, "Exposure Time [%]": 90.0}),
        run("c", {"Sharpe Ratio": math.nan, "Volatility (Ann.) [%]": math.nan, "Profit Factor": math.inf}),
    ]
    best = best_strategies(runs)
    assert best["Sharpe Ratio"] == {"a", "b"}
    assert best["Volatility (Ann.) [%]"] == {"b"}
    assert "Exposure Time [%]" not in best and "Profit Factor" not in best  # no score / a single value


def test_format_value() -> None:
    assert format_value("Sharpe Ratio", math.nan) == "—"
    assert format_value("Profit Factor", math.inf) == "∞"
    assert format_value("# Trades", 37.0) == "37" and format_value("# Trades", 36.5) == "36.50"
    assert format_value("Equity Final", 12345.678) == "12,345.68"
    assert format_value("Start", pd.Timestamp("2024-01-02 03:04", tz="UTC")) == "2024-01-02 03:04"


def test_comparison_table_keeps_bracketed_units(context: ReportContext) -> None:
    console = Console(record=True, width=200)
    runs = [run_baseline("buy_and_hold", context), run_baseline("sma_crossover", context)]
    (table,) = comparison_tables(runs, title="t")
    console.print(table)
    text = console.export_text()
    assert "Max. Drawdown Duration [bars]" in text and "Duration [days]" in text
    assert "buy_and_hold" in text and "sma_crossover" in text


def test_comparison_tables_split_whole_columns_to_fit_a_narrow_terminal(context: ReportContext) -> None:
    runs = [run_baseline(name, context) for name in ("buy_and_hold", "sma_crossover", "rsi_mean_reversion", "random")]
    console = Console(record=True, width=80)
    tables = comparison_tables(runs, title="t", width=80)
    assert len(tables) > 1
    for table in tables:
        console.print(table)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    start = f"{context.candles.index[0]:%Y-%m-%d %H:%M}"
    assert sum(line.count(start) for line in lines) == len(runs)  # no timestamp folded over two lines
    for name in ("buy_and_hold", "sma_crossover", "rsi_mean_reversion", "random"):
        assert sum(name in line for line in lines) == 1


def test_markdown_table_has_a_row_per_metric_and_bolds_the_best() -> None:
    index = pd.date_range("2024-01-01", periods=2, freq="1h", tz="UTC")
    flat = pd.Series(1.0, index=index)
    runs = [
        StrategyRun(name="a|b", equity=flat, trades=pd.DataFrame(), metrics={"Return [%]": 1.5, "# Trades": 2}),
        StrategyRun(name="c", equity=flat, trades=pd.DataFrame(), metrics={"Return [%]": -0.25, "# Trades": 4}),
    ]
    assert markdown_table(runs).splitlines() == [
        "| Metric | a\\|b | c |",
        "|---|---:|---:|",
        "| Return [%] | **1.50** | -0.25 |",
        "| # Trades | 2 | 4 |",
    ]


def test_trades_frame_with_no_trades_keeps_the_columns() -> None:
    index = pd.date_range("2024-01-01", periods=2, freq="1h", tz="UTC")
    empty = pd.DataFrame(columns=TRADE_COLUMNS)
    run = StrategyRun(name="flat", equity=pd.Series(1.0, index=index), trades=empty, metrics={})
    assert list(trades_frame([run]).columns) == ["strategy", *TRADE_COLUMNS]


def test_bad_baseline_parameters_are_config_errors(context: ReportContext, tmp_path: Path) -> None:
    context.config.backtest.params = {"sma_crossover": {"fats": 3}}
    with pytest.raises(ConfigError, match=r"no parameter\(s\) \['fats'\]"):
        run_baseline("sma_crossover", context)
    context.config.backtest.params = {"sma_crosover": {"fast": 3}}
    with pytest.raises(ConfigError, match="unknown strategy 'sma_crosover'"):
        run_backtest(context.config, out_dir=tmp_path)


def test_short_span_leaves_out_extrapolated_figures_with_a_note(
    context: ReportContext, tmp_path: Path
) -> None:
    assert context.span_days < 30  # 300 hourly bars: 12.5 days
    write_report([run_baseline("buy_and_hold", context)], context, tmp_path / "short")
    document = json.loads((tmp_path / "short" / "metrics.json").read_text())
    metrics = document["strategies"]["buy_and_hold"]
    assert all(metrics[row] is None for row in ("CAGR [%]", "Sortino Ratio", "Calmar Ratio"))
    assert isinstance(metrics["Sharpe Ratio"], float) and isinstance(metrics["Return [%]"], float)
    assert document["min_annualise_days"] == 30
    assert "are not shown (—)" in document["annualisation"] and "sqrt(8,760)" in document["annualisation"]
    markdown = (tmp_path / "short" / "metrics.md").read_text()
    assert "| CAGR [%] | — |" in markdown and markdown.rstrip().endswith(document["annualisation"])
    page = (tmp_path / "short" / "report.html").read_text()
    assert "backtest.min_annualise_days (30)" in page

    context.config.backtest.min_annualise_days = 0
    write_report([run_baseline("buy_and_hold", context)], context, tmp_path / "all")
    document = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert isinstance(document["strategies"]["buy_and_hold"]["CAGR [%]"], float)
    assert "not shown" not in document["annualisation"]
    markdown = (tmp_path / "all" / "metrics.md").read_text()
    assert markdown.rstrip().splitlines()[-1].startswith("| ")  # no note below the table
