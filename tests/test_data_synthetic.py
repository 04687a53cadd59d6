"""The synthetic planted-edge market: the edge is what the config says, causal, seeded, valid and visible to
the env; the oracle baseline beats buy-and-hold on it; bad parameters are one-line usage errors."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from r1trade.backtest.model_runs import plan_windows
from r1trade.backtest.strategies import make_targets
from r1trade.cli import main
from r1trade.config import load_config
from r1trade.data.source import load_config_candles, read_config_candles
from r1trade.data.store import validate_candles
from r1trade.data.synthetic import (
    DecisionGrid,
    decision_grid,
    interval_changes,
    measure_edge,
    oracle_targets,
    planted_edge_candles,
)
from r1trade.env.trading_env import make_envs


def generate(bars: int = 2000, **overrides) -> pd.DataFrame:
    params = {"seed": 0, "bars": bars, "interval": 4, "p": 0.8, "move": 0.01, "volatility": 0.005}
    return planted_edge_candles(**{**params, **overrides})


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- the edge


@pytest.mark.parametrize("p", [0.8, 0.5, 0.3])
def test_realised_edge_matches_p_within_sampling_error(p: float) -> None:
    candles = generate(40_000, p=p, seed=7)
    edge = measure_edge(candles)
    assert edge is not None and edge.every == 4 and edge.pairs >= 9_990
    assert abs(edge.repeat_rate - p) < 3 * math.sqrt(p * (1 - p) / edge.pairs)


def test_interval_signs_are_never_zero_and_sizes_follow_move() -> None:
    candles = generate(20_000, move=0.02)
    assert (interval_changes(candles, decision_grid(candles)) != 0).all()
    changes = np.diff(np.log(candles["close"].to_numpy()[3::4]))  # log-change of each whole interval
    assert np.mean(np.abs(changes)) == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"volatility": 0.0}, {"p": 0.0}, {"p": 1.0}, {"timeframe": "15m", "interval": 3},
     {"start": "2024-01-01 01:30", "interval": 5}, {"timeframe": "1d", "volatility": 0.03}],
)
def test_candles_are_canonical_and_valid(overrides: dict) -> None:
    candles = generate(600, **overrides)
    report = validate_candles(candles)
    assert report.ok and not report.problems and report.gaps.count == 0
    assert list(candles.columns) == ["open", "high", "low", "close", "volume"]
    assert all(candles[c].dtype == np.float64 for c in candles.columns)
    assert str(candles.index.tz) == "UTC" and candles.index.name == "timestamp"
    assert {"symbol", "timeframe", "source"} <= set(candles.attrs)
    assert candles["open"].iloc[0] == pytest.approx(100.0)
    np.testing.assert_array_equal(candles["open"].to_numpy()[1:], candles["close"].to_numpy()[:-1])
    assert (candles["volume"] > 0).all()


def test_volatility_clusters_and_volume_follows_the_move() -> None:
    candles = generate(20_000, p=0.5)
    moves = np.abs(np.diff(np.log(candles["close"].to_numpy())))
    assert np.corrcoef(moves[:-1], moves[1:])[0, 1] > 0.05  # |return| is autocorrelated (GARCH)
    assert np.corrcoef(moves, candles["volume"].to_numpy()[1:])[0, 1] > 0.3
    wicks = (candles["high"] - candles[["open", "close"]].max(axis=1)).to_numpy()
    assert (wicks > 0).mean() > 0.99


def test_interval_ends_lie_on_a_clock_grid() -> None:
    candles = generate(100)  # hourly from midnight, interval 4: intervals end at the 04:00, 08:00, ... closes
    grid = decision_grid(candles)
    assert grid == DecisionGrid(every=4, first=3)
    closes_at = candles.index[grid.first :: grid.every] + pd.Timedelta("1h")
    assert (closes_at.hour % 4 == 0).all()
    later = candles.iloc[10:]  # a piece of the data (a split) finds its own grid from the timestamps
    assert decision_grid(later) == DecisionGrid(every=4, first=1)
    assert grid.next_on_grid(4) == 7 and grid.on_grid(7) and not grid.on_grid(8)


# --------------------------------------------------------------------------- causality and seeding


@pytest.mark.parametrize("start", ["2024-01-01", "2024-01-01 02:00"])
def test_no_look_ahead_in_the_generator(start: str) -> None:
    short, longer = generate(1001, start=start), generate(1500, start=start)
    pd.testing.assert_frame_equal(short, longer.iloc[:1001])


def test_no_look_ahead_in_the_oracle() -> None:
    candles = generate(400)
    full = oracle_targets(candles)
    for t in (0, 6, 7, 8, 50, 203, 398):
        altered = candles.copy()
        altered.iloc[t + 1 :] = np.random.default_rng(t).uniform(1, 1e6, size=(len(candles) - t - 1, 5))
        pd.testing.assert_series_equal(oracle_targets(altered).iloc[: t + 1], full.iloc[: t + 1])
        pd.testing.assert_series_equal(oracle_targets(candles.iloc[: t + 1]), full.iloc[: t + 1])


def test_same_seed_same_candles_other_seed_different() -> None:
    pd.testing.assert_frame_equal(generate(500, seed=3), generate(500, seed=3))
    assert not np.allclose(generate(500, seed=3)["close"], generate(500, seed=4)["close"])


def test_oracle_is_the_planted_rule() -> None:
    candles = generate(400)
    grid = decision_grid(candles)
    target = oracle_targets(candles)
    close = candles["close"].to_numpy()
    assert (target.iloc[:7] == 0).all()  # before the first interval end with a whole interval behind it
    for t in range(7, 396, 4):
        expected = np.sign(close[t] - close[t - 4])
        assert target.iloc[t : t + 4].tolist() == [expected] * 4  # decided at t, held over the next interval
        assert np.sign(close[t + 4] - close[t]) in (-1, 1)
    assert grid.first == 3
    fading = oracle_targets(generate(400, p=0.2))
    assert set(fading.unique()) <= {-1.0, 0.0, 1.0}
    assert (oracle_targets(generate(400, p=0.5)) == 0).all()
    assert (make_targets("oracle", candles, allow_short=False) >= 0).all()
    plain = candles.copy()
    plain.attrs.clear()
    with pytest.raises(ValueError, match="planted-edge"):
        oracle_targets(plain)


# --------------------------------------------------------------------------- the config, env and backtest


def test_config_source_and_the_env_see_whole_intervals() -> None:
    config = load_config("planted_edge")
    assert config.data.source == "synthetic" and config.data.synthetic.p == 0.8
    candles, report = load_config_candles(config)
    assert report.ok and len(candles) == config.data.synthetic.bars
    assert candles.attrs["source"] == "synthetic planted_edge (p=0.8, seed=0)"
    env = make_envs(config, 1, "train")[0]
    grid = env.replay.decision_grid
    assert grid is not None and grid.every == config.env.decision_every
    every = config.env.decision_every
    for seed in range(20):
        messages, info = env.reset(seed=seed)
        start = info["start_bar"]
        assert grid.on_grid(start) and start >= config.env.warmup_bars
        # the observation's "4 bars" change is the last planted interval's change
        shown = f"{every} bars {env.replay.change_pct(start, every):+.2f}%"
        assert shown in messages[-1]["content"]
    plan = plan_windows(config, len(env.replay), grid=grid)
    assert all(grid.on_grid(start) for start in plan.starts)


def test_config_interval_defaults_to_decision_every() -> None:
    config = load_config("planted_edge", ["env.decision_every=6", "data.synthetic.bars=600"])
    assert read_config_candles(config).attrs["decision_grid"] == 6
    config = load_config("planted_edge", ["data.synthetic.interval=3", "data.synthetic.bars=600"])
    assert read_config_candles(config).attrs["decision_grid"] == 3


def test_backtest_oracle_beats_buy_and_hold(capsys, tmp_path: Path) -> None:
    args = ["backtest", "--config", "planted_edge", "--strategy", "oracle", "--out", str(tmp_path)]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "metrics.json").read_text())
    strategies = document["strategies"]
    assert list(strategies) == ["oracle", "buy_and_hold"]
    assert strategies["oracle"]["Return [%]"] > strategies["buy_and_hold"]["Return [%]"]
    assert document["data"]["source"] == "synthetic planted_edge (p=0.8, seed=0)"
    assert document["data"]["synthetic"]["p"] == 0.8 and document["data"]["path"] is None
    assert "oracle" in out and "buy_and_hold" in out


def test_oracle_on_real_data_is_a_usage_error(capsys, tmp_path: Path) -> None:
    args = ["backtest", "--config", "smoke", "--strategy", "oracle", "--out", str(tmp_path)]
    code, _, err = run(capsys, *args)
    assert code == 2 and "data.source: synthetic" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_data_info_describes_the_generated_market(capsys) -> None:
    code, out, err = run(capsys, "data-info", "--config", "planted_edge")
    assert code == 0, err
    assert "synthetic planted_edge (p=0.8, seed=0)" in out and "8,000" in out and "realised edge" in out
    edge = measure_edge(read_config_candles(load_config("planted_edge")))
    assert f"{edge.repeat_rate:.4f}" in out
    assert "sign repeats" in out and "4-bar intervals" in out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.synthetic.p=1.5", "data.synthetic.p: Input should be less than or equal to 1"),
        ("data.synthetic.p=-0.1", "data.synthetic.p: Input should be greater than or equal to 0"),
        ("data.synthetic.volatility=-0.01", "data.synthetic.volatility: Input should be greater than"),
        ("data.synthetic.kind=regime_switch", "data.synthetic.kind: Input should be 'planted_edge'"),
        ("data.source=database", "data.source: Input should be 'file' or 'synthetic'"),
        ("data.synthetic.timeframe=1x", "bad timeframe '1x'"),
    ],
)
@pytest.mark.parametrize("command", ["data-info", "backtest"])
def test_bad_parameters_are_one_line_usage_errors(capsys, command: str, override: str, message: str) -> None:
    code, _, err = run(capsys, command, "--config", "planted_edge", "--set", override)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
