"""`train.walk_forward: K`: fold ranges and each fold's training bars by hand, the resume plan, one-line errors,
and end to end through the CLI: K = 2 fold agents trained in a subprocess, resumed, then backtested each on its
own fold."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import SAMPLE, make_synthetic_candles
from rich.console import Console

from r1trade import train
from r1trade.cli import main
from r1trade.config import SplitConfig, load_config
from r1trade.data.splits import Fold, expanding_folds, fold_split, make_splits, walk_forward_folds
from r1trade.data.store import load_clean_candles
from r1trade.errors import ConfigError, UsageError
from r1trade.outputs import fold_run_dir
from r1trade.rl.checkpoint_paths import STATE_FILE
from r1trade.train import fold_configs, train_run

AGENT = "agent (per fold)"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


# --------------------------------------------------------------------------- folds by hand


def test_expanding_folds_by_hand() -> None:
    # 30 bars from bar 70, 3 folds, embargo 2: 30 - 2 × 2 = 26 bars, 9 + 9 + 8 -> windows 70–78, 81–89, 92–99
    # each agent trains on bars 0 .. first - 2 - 1: stops (exclusive) 68, 79, 90
    assert expanding_folds(70, 30, 3, 2) == [Fold(1, 68, 70, 78), Fold(2, 79, 81, 89), Fold(3, 90, 92, 99)]
    for fold in expanding_folds(1000, 7000, 5, 24):
        assert fold.train_stop - 1 < fold.test_first - 24  # no training bar within the embargo or after it
        assert fold.train_stop == fold.test_first - 24  # and every bar before it is trained on


def test_walk_forward_folds_of_both_spans_by_hand() -> None:
    # 100 bars, 0.6 / 0.2 / 0.2, embargo 3: train 0–59, validation 63–79, test 83–99 (17 bars)
    candles = make_synthetic_candles(100)
    config = SplitConfig(train=0.6, validation=0.2, test=0.2, embargo_bars=3)
    # span "split" of the test split, K = 2: 17 - 3 = 14 bars, 7 + 7 -> windows 83–89 and 93–99;
    # fold 1 trains on 0–79 (through the validation split), fold 2 on 0–89 (fold 1's window included)
    assert walk_forward_folds(candles, config, folds=2, span="split", split="test") == [
        Fold(1, 80, 83, 89), Fold(2, 90, 93, 99)
    ]
    # span "all": bars 63–99 (37), K = 3: 37 - 6 = 31 bars, 11 + 10 + 10 -> windows 63–73, 77–86, 90–99;
    # fold 1 trains on the train split exactly
    assert walk_forward_folds(candles, config, folds=3, span="all", split="test") == [
        Fold(1, 60, 63, 73), Fold(2, 74, 77, 86), Fold(3, 87, 90, 99)
    ]
    with pytest.raises(ConfigError, match="fold 1 starts at bar 0: no bar lies 3 bars"):
        walk_forward_folds(candles, config, folds=2, span="split", split="train")


def test_a_fold_split_holds_the_fold_agents_bars_and_its_window() -> None:
    candles = make_synthetic_candles(100)
    splits = make_splits(candles, fold_split(candles, Fold(2, 74, 77, 86), 3))
    pd.testing.assert_frame_equal(splits.train, candles.iloc[:74])
    assert splits.validation.empty
    pd.testing.assert_frame_equal(splits.test, candles.iloc[77:87])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.split.test_end=2019-01-01"], "test_end needs method 'dates'"),
        (["data.split.method=dates", "data.split.train_end=2019-01-02", "data.split.validation_end=2019-01-01"],
         "validation_end must not be before train_end"),
        (["data.split.method=dates", "data.split.train_end=2019-01-01", "data.split.validation_end=2019-01-01",
          "data.split.test_end=2019-01-01"], "test_end must be after validation_end"),
    ],
)
def test_split_dates_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("smoke", overrides)


# --------------------------------------------------------------------------- resuming


def fake_checkpoint(run_dir: Path, number: int, step: int, fold_config) -> None:
    """What a fold's run holds for `list_checkpoints`: its config and a complete checkpoint at `step`."""
    fold_config.save(fold_run_dir(run_dir, number))
    directory = fold_run_dir(run_dir, number) / "checkpoints" / f"step-{step}"
    directory.mkdir(parents=True)
    (directory / STATE_FILE).write_text(json.dumps({"step": step}))


def test_a_resumed_run_skips_finished_folds_and_continues_the_others(monkeypatch, tmp_path: Path) -> None:
    config = load_config("smoke", ["train.walk_forward=3", "train.updates=2"])
    folds = fold_configs(config)
    run_dir = tmp_path / "wf"
    fake_checkpoint(run_dir, 1, 2, folds[0])  # finished
    fake_checkpoint(run_dir, 2, 1, folds[1])  # one update of two; fold 3 never started
    calls = []

    def trained(fold_config, fold_dir: Path, *, resume: bool, force: bool, console: Console) -> Path:
        calls.append((fold_dir.name, resume, fold_config.data.split))
        return fold_dir

    monkeypatch.setattr(train, "_train_agent", trained)
    shown = io.StringIO()
    assert train_run(config, run_dir, resume=True, console=Console(file=shown)) == run_dir
    assert calls == [("fold-2", True, folds[1].data.split), ("fold-3", False, folds[2].data.split)]
    assert "fold 1 of 3: already trained (2 updates), skipped" in shown.getvalue()
    assert load_config(run_dir / "config.yaml") == config

    moved = load_config("smoke", ["train.walk_forward=3", "train.updates=2", "data.split.embargo_bars=12"])
    with pytest.raises(UsageError, match="cannot resume: fold 1 of .* was trained for training up to"):
        train_run(moved, run_dir, resume=True, console=Console(file=shown))

    # a fresh run refuses the folder, or with force clears every fold and trains them all
    with pytest.raises(UsageError, match="holds an earlier run: pass --resume"):
        train_run(config, run_dir, console=Console(file=shown))
    calls.clear()
    train_run(config, run_dir, force=True, console=Console(file=shown))
    assert [(name, resume) for name, resume, _ in calls] == [("fold-1", False), ("fold-2", False), ("fold-3", False)]
    assert not fold_run_dir(run_dir, 1).exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.walk_forward=1"], "train.walk_forward: Input should be greater than or equal to 2"),
        (["train.walk_forward=2", "train.walk_forward_span=later"], "train.walk_forward_span: Input should be"),
        (["train.walk_forward=5000"], "bars cannot hold 5000 folds 24 bars apart"),
        (["train.walk_forward=2", "backtest.split=train"], "fold 1 starts at bar 0: no bar lies 24 bars"),
        (["train.walk_forward=2", "data.paths=[data/sample/btc_usd_1h.parquet, other.parquet]"],
         "train.walk_forward trains on one candle file and data.paths lists 2"),
    ],
)
def test_bad_walk_forward_settings_are_one_line_errors(
    capsys, tmp_path: Path, overrides: list[str], message: str
) -> None:
    settings = [part for setting in [f"output_dir={tmp_path}", *overrides] for part in ("--set", setting)]
    code, _, err = run(capsys, "train", "--config", "smoke", *settings)
    assert code == 2 and message in err and one_line(err)
    assert not (tmp_path / "smoke").exists()


# --------------------------------------------------------------------------- end to end


FAST = ["train.updates=1", "train.epochs=1", "train.algorithm=reinforce_pp", "env.episode_decisions=1",
        "env.max_tool_calls=1", "rollout.num_envs=1", "rollout.max_new_tokens=8", "model.cpu_kernels=off"]
"""One update of one one-turn episode per fold, the plain transformers model: seconds per fold."""
QUICK_BACKTEST = ["backtest.max_decisions=2", "backtest.agent_windows=1", "backtest.bootstrap_resamples=100"]
"""Two decisions per fold, the fewest a fold may score."""


@pytest.mark.slow
def test_fold_agents_trained_resumed_and_each_backtested_on_its_own_fold(capsys, tmp_path: Path) -> None:
    settings = [f"output_dir={tmp_path}", "name=wf", "train.walk_forward=2", *FAST]
    command = [sys.executable, "-m", "r1trade.cli", "train", "--config", "smoke",
               *[part for setting in settings for part in ("--set", setting)]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "wf"
    assert load_config(run_dir / "config.yaml").train.walk_forward == 2

    # every fold trained: resuming has nothing to do; a lost fold is trained again, the finished one skipped
    code, _, err = run(capsys, "train", "--resume", str(run_dir))
    assert code == 2 and "every fold of" in err and one_line(err)
    fold_1 = fold_run_dir(run_dir, 1)
    before = (fold_1 / "metrics.jsonl").read_text(), (fold_1 / "checkpoints" / "step-1" / STATE_FILE).stat()
    shutil.rmtree(fold_run_dir(run_dir, 2))
    code, out, err = run(capsys, "train", "--resume", str(run_dir))
    assert code == 0, err
    assert "fold 1 of 2: already trained (1 updates), skipped" in out
    after = (fold_1 / "metrics.jsonl").read_text(), (fold_1 / "checkpoints" / "step-1" / STATE_FILE).stat()
    assert after == before
    assert (fold_run_dir(run_dir, 2) / "checkpoints" / "step-1").is_dir()

    # each fold's agent saw no bar at or after its test window's first bar less the embargo
    candles = load_clean_candles(SAMPLE)[0]
    embargo = load_config("smoke").data.split.embargo_bars
    windows = []
    for number in (1, 2):
        splits = json.loads((fold_run_dir(run_dir, number) / "splits.json").read_text())
        last_trained = candles.index.get_loc(pd.Timestamp(splits["train"]["end"]))
        first_tested = candles.index.get_loc(pd.Timestamp(splits["test"]["start"]))
        assert last_trained == first_tested - embargo - 1 and splits["validation"]["rows"] == 0
        windows.append((pd.Timestamp(splits["test"]["start"]), pd.Timestamp(splits["test"]["end"])))
    assert windows[0][1] < windows[1][0]

    report = tmp_path / "report"
    args = ["backtest", "--checkpoint", str(run_dir), "--strategy", "buy_and_hold", "--out", str(report),
            *[part for setting in QUICK_BACKTEST for part in ("--set", setting)]]
    done = subprocess.run([sys.executable, "-m", "r1trade.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    document = json.loads((report / "metrics.json").read_text())
    assert document["walk_forward"]["folds"] == 2 and list(document["strategies"]) == [AGENT, "buy_and_hold"]
    for number, (fold, (first, last)) in enumerate(zip(document["folds"], windows, strict=True), start=1):
        checkpoint = fold_run_dir(run_dir, number) / "checkpoints" / "step-1"
        assert fold["checkpoints"] == {AGENT: str(checkpoint)}
        assert str(checkpoint) in fold["notes"][AGENT]
        assert first <= pd.Timestamp(fold["start"]) and pd.Timestamp(fold["end"]) <= last  # its own window
        assert fold["strategies"][AGENT]["# Decisions"] == 2

    # a backtest that does not match the run is a one-line usage error, before anything runs
    mismatches = [
        (["--walk-forward", "3"], "--walk-forward 3: '" + str(run_dir) + "' trained 2 fold agents"),
        (["--walk-forward-span", "all"], "were trained for span split (train.walk_forward_span)"),
        (["--step", "7"], "--step 7: fold 1 of '" + str(run_dir) + "' has no step-7 (it has step-1)"),
        (["--set", "data.split.embargo_bars=12"], "fold 1 of '" + str(run_dir) + "' was trained for training"),
    ]
    elsewhere = tmp_path / "elsewhere"
    for extra, message in mismatches:
        code, _, err = run(capsys, "backtest", "--checkpoint", str(run_dir), "--out", str(elsewhere), *extra)
        assert code == 2 and message in err and one_line(err), err
    fold_run_dir(run_dir, 2).rename(tmp_path / "away")
    code, _, err = run(capsys, "backtest", "--checkpoint", str(run_dir), "--out", str(elsewhere))
    assert code == 2 and "has no fold-2 (train.walk_forward 2)" in err and one_line(err)
    assert not elsewhere.exists()
