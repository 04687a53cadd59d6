"""Several candle files in one config (`data.paths`): validation, training across them, a backtest per asset
and pooled, and a foreign file through `backtest --data`. Every asset here is generated."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from r1trade.cli import main
from r1trade.config import SyntheticConfig, load_config
from r1trade.data.source import asset_configs, asset_labels, load_config_candles, load_config_splits
from r1trade.data.store import save_candles
from r1trade.data.synthetic import synthetic_candles
from r1trade.env.trading_env import TradingEnv, load_replay, make_envs
from r1trade.errors import ConfigError, UsageError
from r1trade.train import _record_splits

FAST = ["--set", "backtest.bootstrap_resamples=100", "--set", "backtest.random_seeds=1"]


def generated(path: Path, *, seed: int, symbol: str, bars: int = 1200, timeframe: str = "1h") -> Path:
    synthetic = SyntheticConfig(seed=seed, symbol=symbol, bars=bars, timeframe=timeframe, p=0.5)
    return save_candles(synthetic_candles(synthetic, interval=4), path)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("assets")
    return [generated(root / "aaa.parquet", seed=1, symbol="AAA/USD"),
            generated(root / "bbb.parquet", seed=2, symbol="BBB/USD", bars=900)]


def write_config(tmp_path: Path, paths: list[Path], **sections: dict) -> Path:
    document = {"name": "multi", "data": {"paths": [str(p) for p in paths]},
                "backtest": {"strategies": ["buy_and_hold", "vol_target"],
                             "params": {"vol_target": {"lookback": 24}},
                             "report_dir": str(tmp_path / "reports")},
                **sections}
    path = tmp_path / "multi.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- config


def test_path_and_paths_are_one_or_the_other(capsys, tmp_path, assets) -> None:
    config = load_config(write_config(tmp_path, assets))
    assert config.data.path == str(assets[0])  # path names the first, so a saved config reloads as it was
    assert load_config(config.save(tmp_path / "saved")).data.paths == [str(p) for p in assets]
    code, _, err = run(capsys, "show-config", "--config", str(tmp_path / "multi.yaml"),
                       "--set", "data.path=x.csv")
    assert code == 2 and err.count("\n") == 1 and "data.path (one candle file) or data.paths (several)" in err
    with pytest.raises(ConfigError, match="needs data.source: file"):
        load_config(None, ["data.source=synthetic", f"data.paths=[{assets[0]}]"])
    with pytest.raises(ConfigError, match="names a file twice"):
        load_config(None, [f"data.paths=[{assets[0]}, {assets[0]}]"])


def test_one_config_and_label_per_file(tmp_path, assets) -> None:
    config = load_config(write_config(tmp_path, assets))
    parts = asset_configs(config)
    assert [part.data.path for part in parts] == [str(p) for p in assets]
    assert all(part.data.paths == [] for part in parts) and asset_labels(parts) == ["aaa", "bbb"]
    twin = tmp_path / "other" / "aaa.parquet"
    twin.parent.mkdir()
    twin.write_bytes(assets[0].read_bytes())
    same_stem = asset_configs(load_config(None, [f"data.paths=[{assets[0]}, {twin}]"]))
    assert asset_labels(same_stem) == ["1-aaa", "2-aaa"]
    assert asset_configs(load_config("smoke")) == [load_config("smoke")]


def test_commands_that_read_one_file_refuse_several(capsys, tmp_path, assets) -> None:
    config = load_config(write_config(tmp_path, assets))
    with pytest.raises(UsageError, match="data.paths lists 2 candle files"):
        load_config_candles(config)
    with pytest.raises(UsageError):
        load_replay(config)
    code, _, err = run(capsys, "data-info", "--config", str(tmp_path / "multi.yaml"))
    assert code == 2 and err.count("\n") == 1 and "backtest --data FILE" in err


# --------------------------------------------------------------------------- training across assets


def test_episodes_are_drawn_across_assets(tmp_path, assets) -> None:
    config = load_config(write_config(tmp_path, assets, env={"episode_decisions": 4}))
    envs = make_envs(config, 2)
    assert [market.symbol for market in envs[0].markets] == ["AAA/USD", "BBB/USD"]
    drawn = Counter()
    for seed in range(400):
        first, _ = envs[0].reset(seed=seed)
        second, _ = envs[1].reset(seed=seed)
        assert first == second  # a group (same seed) plays the same market and window
        drawn[envs[0].replay.symbol] += 1
        assert first[0]["content"] == envs[0].system_prompt and envs[0].replay.symbol in first[0]["content"]
    # each market as likely as its windows: train splits of 840 and 630 bars less 100 warm-up and 16 bars
    rooms = {"AAA/USD": 840 - 116, "BBB/USD": 630 - 116}
    share = rooms["AAA/USD"] / sum(rooms.values())
    assert abs(drawn["AAA/USD"] / 400 - share) < 0.08  # about 3 standard errors of 0.025
    # a fixed start plays the first market
    envs[0].reset(options={"start": 100, "decisions": 2})
    assert envs[0].replay.symbol == "AAA/USD"


def test_one_market_in_a_list_plays_as_before(tmp_path, assets) -> None:
    config = load_config(None, [f"data.path={assets[0]}", "env.episode_decisions=3"])
    replay = load_replay(config)
    alone = TradingEnv(replay, config.env, config.rewards)
    listed = TradingEnv([replay], config.env, config.rewards)
    order = '{"side": "long", "size": 0.5, "view": "bullish"}'
    turn = f'<tool_call>{{"name": "place_order", "arguments": {order}}}</tool_call>'
    for env in (alone, listed):
        env.reset(seed=7)
    for _ in range(3):
        assert alone.step(turn)[:4] == listed.step(turn)[:4]


def test_a_run_records_each_assets_splits(tmp_path, assets) -> None:
    config = load_config(write_config(tmp_path, assets))
    _record_splits(config, load_config_splits(config), tmp_path)
    splits = json.loads((tmp_path / "splits.json").read_text())
    assert list(splits) == ["aaa", "bbb"] and splits["aaa"]["train"]["rows"] == 840


# --------------------------------------------------------------------------- backtest per asset and pooled


def test_backtest_per_asset_and_pooled(capsys, tmp_path, assets) -> None:
    code, out, err = run(capsys, "backtest", "--config", str(write_config(tmp_path, assets)), *FAST)
    assert code == 0, err
    reports = tmp_path / "reports"
    assert sorted(p.name for p in reports.iterdir()) == ["multi-test", "multi-test-aaa", "multi-test-bbb"]
    assert (reports / "multi-test-aaa" / "report.html").is_file()
    pooled = json.loads((reports / "multi-test" / "metrics.json").read_text())
    per_asset = [json.loads((reports / f"multi-test-{label}" / "metrics.json").read_text())
                 for label in ("aaa", "bbb")]
    for name in ("buy_and_hold", "vol_target"):
        returns = [doc["strategies"][name]["Return [%]"] / 100 for doc in per_asset]
        rows = pooled["pooled"]["strategies"][name]
        # chained: the assets' returns compounded one after the other
        assert rows["Return [%]"] == pytest.approx(100 * ((1 + returns[0]) * (1 + returns[1]) - 1))
        days = sum(doc["strategies"][name]["Duration [days]"] for doc in per_asset)
        assert rows["Duration [days]"] == pytest.approx(days)
        low, high = rows["ci95"]["Return [%]"]  # over both assets' decisions
        assert low <= high
        assert rows["# Trades"] == sum(d["strategies"][name]["# Trades"] for d in per_asset)
    assert [a["label"] for a in pooled["assets"]] == ["aaa", "bbb"]
    assert pooled["assets"][1]["symbol"] == "BBB/USD"
    assert "pooled over 2 assets" in out and "multi · aaa · test split" in out


def test_walk_forward_over_assets_pools_every_fold(capsys, tmp_path, assets) -> None:
    config = write_config(tmp_path, assets)
    code, _, err = run(capsys, "backtest", "--config", str(config), "--walk-forward", "2",
                         "--walk-forward-span", "all", *FAST)
    assert code == 0, err
    pooled = json.loads((tmp_path / "reports" / "multi-all-wf2" / "metrics.json").read_text())
    assert pooled["pooled"]["notes"]["buy_and_hold"] == "pooled over 2 assets (4 walk-forward folds)"
    asset = json.loads((tmp_path / "reports" / "multi-all-wf2-bbb" / "metrics.json").read_text())
    assert len(asset["folds"]) == 2


def test_assets_of_different_bar_lengths_are_not_pooled(capsys, tmp_path, assets) -> None:
    daily = generated(tmp_path / "daily.parquet", seed=3, symbol="DDD/USD", bars=800, timeframe="1d")
    config = write_config(tmp_path, [assets[0], daily], env={"warmup_bars": 20})
    code, out, err = run(capsys, "backtest", "--config", str(config), *FAST)
    assert code == 0, err
    pooled = json.loads((tmp_path / "reports" / "multi-test" / "metrics.json").read_text())
    assert "strategies" not in pooled["pooled"] and "bar lengths differ" in out
    daily_report = json.loads((tmp_path / "reports" / "multi-test-daily" / "metrics.json").read_text())
    assert daily_report["bars_per_year"] == 365


def test_data_flag_backtests_one_foreign_file(capsys, tmp_path, assets) -> None:
    foreign = generated(tmp_path / "foreign.parquet", seed=4, symbol="FFF/USD", bars=700)
    args = ["backtest", "--config", str(write_config(tmp_path, assets)), "--data", str(foreign),
            "--out", str(tmp_path / "foreign"), *FAST]
    code, _, err = run(capsys, *args)
    assert code == 0, err
    document = json.loads((tmp_path / "foreign" / "metrics.json").read_text())
    assert document["data"]["symbol"] == "FFF/USD" and document["data"]["path"] == str(foreign)


HEADER = "timestamp,open,high,low,close,volume\n"
HOUR0, HOUR1 = "2024-01-01T00:00:00Z,1,2,0.5,1.5,1\n", "2024-01-01T01:00:00Z,1,2,0.5,1.5,1\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "candle file not found"),
        ("this is not a candle file\n", "is not a canonical candle file"),
        (HEADER + HOUR1 + HOUR0, "non-monotonic timestamps"),
        (HEADER + HOUR0.replace("1.5", "-1.5") + HOUR1, "non-positive prices"),
    ],
    ids=["missing", "not-candles", "unordered", "negative-price"],
)
def test_bad_data_files_are_one_line_errors(capsys, tmp_path, content, message) -> None:
    bad = tmp_path / "bad.csv"
    if content is not None:
        bad.write_text(content)
    code, _, err = run(capsys, "backtest", "--config", "smoke", "--data", str(bad),
                       "--out", str(tmp_path / "out"))
    assert code in (1, 2) and err.startswith("error:") and err.count("\n") == 1, err
    assert message in err and not (tmp_path / "out").exists()
