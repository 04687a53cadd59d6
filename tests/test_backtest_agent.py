"""The agent path of `r1trade backtest`: windows, chained equity, trades with reasoning, turn statistics, the
CLI with a trained tiny checkpoint and the untrained base model, and one-line errors for bad checkpoints."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from env_fixtures import call, close, hold, long, short

from r1trade.backtest.model_runs import (
    WINDOW_END,
    WindowPlan,
    chain_equity,
    model_run,
    plan_windows,
    play_windows,
)
from r1trade.backtest.runner import load_context, run_baseline
from r1trade.cli import main
from r1trade.config import BacktestConfig, load_config
from r1trade.env.trading_env import FixedStart, make_envs
from r1trade.errors import DataError
from r1trade.rollout.loop import Trajectory, Turn

DEFAULT_STRATEGIES = BacktestConfig().strategies

MALFORMED = "I think it goes up <tool_call>{not json</tool_call>"
Script = Callable[[int, int], list[str]]
"""(window, decision) → the turns the scripted agent takes for that decision."""


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint trained for one update (shared: training takes a while)."""
    out = tmp_path_factory.mktemp("runs")
    fast = ["env.episode_decisions=2", "rollout.max_new_tokens=12", "train.epochs=1", "train.updates=1"]
    args = ["train", "--config", "smoke", *(f"--set={item}" for item in [*fast, f"output_dir={out}"])]
    assert main(args) == 0
    return out / "smoke" / "checkpoints" / "step-1"


class ScriptedPlayer:
    """Plays each env from a fixed script instead of a model, returning what RolloutEngine.run returns."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def run(self, envs: Sequence, seeds: Sequence[int | None]) -> list[Trajectory]:
        return [self._play(k, env, seed) for k, (env, seed) in enumerate(zip(envs, seeds, strict=True))]

    def _play(self, k: int, env, seed: int | None) -> Trajectory:
        env.reset(seed)
        trajectory = Trajectory(seed=seed, group=k)
        decision, done = 0, False
        while not done:
            for text in self.script(k, decision):
                _, reward, terminated, truncated, info = env.step(text)
                trajectory.turns.append(Turn(0, 0, 0, text, reward, False, info))
                done = terminated or truncated
                if info["decision_done"]:
                    break
            assert info["decision_done"], "the script must end every decision"
            decision += 1
        return trajectory


def tagged(k: int, d: int, turn: str) -> str:
    return f"w{k}d{d}: {turn}"


def round_trip_script(k: int, d: int) -> list[str]:
    """Long, hold (window 1 looks at two candles first), flip short; window 0 closes, window 1 is forced to hold
    (its short stays open)."""
    turns = {
        0: [MALFORMED, call("get_portfolio"), long(1.0)],
        1: [hold()] if k == 0 else [call("get_candles", n=2), hold()],
        2: [short(0.5)],
        3: [close()] if k == 0 else [MALFORMED] * 3,
    }[d]
    return [tagged(k, d, turn) for turn in turns]


def scripted_run(script: Script, *overrides: str):
    config = load_config("smoke", ["backtest.max_decisions=8", *overrides])
    context = load_context(config)
    plan = plan_windows(config, len(context.split_candles))
    plays = play_windows(ScriptedPlayer(script), context, plan)
    return model_run("agent", plays, context, plan, note=""), context, plan


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- pure pieces


def test_chain_equity_compounds_window_returns_by_hand() -> None:
    times = pd.date_range("2024-01-01", periods=5, freq="1h", tz="UTC")
    first = pd.Series([100.0, 110.0, 99.0], index=times[:3])  # -1 %
    second = pd.Series([100.0, 120.0, 90.0], index=times[2:])  # starts flat again where the first ends
    chained = chain_equity([first, second])
    np.testing.assert_allclose(chained.to_numpy(), [100.0, 110.0, 99.0, 118.8, 89.1], rtol=1e-12)
    assert chained.index.equals(times)

    ruined = pd.Series([100.0, -5.0], index=times[:2])  # ruin is final: later windows are left out
    assert chain_equity([ruined, pd.Series([100.0, 200.0], index=times[1:3])]).tolist() == [100.0, -5.0]
    with pytest.raises(ValueError, match="window 1 starts"):
        chain_equity([first, pd.Series([100.0, 101.0], index=times[3:])])


def test_plan_windows_cuts_whole_decisions_into_contiguous_windows() -> None:
    config = load_config("smoke", ["backtest.agent_windows=3", "env.warmup_bars=10", "env.decision_every=4"])
    plan = plan_windows(config, 100)  # (100 - 1 - 10) // 4 = 22 decisions fit
    assert plan == WindowPlan(starts=(10, 42, 70), decisions=(8, 7, 7), every=4, available=22)
    assert (plan.first_bar, plan.last_bar, plan.total) == (10, 98, 22)

    config.backtest.max_decisions = 2
    assert plan_windows(config, 100) == WindowPlan(starts=(10, 14), decisions=(1, 1), every=4, available=22)
    with pytest.raises(DataError, match="too few for 10 warm-up bars"):
        plan_windows(config, 14)


def test_plan_windows_caps_each_window_at_the_episode_length_the_model_trained_on() -> None:
    config = load_config(
        "smoke", ["backtest.agent_window_decisions=5", "env.warmup_bars=10", "env.decision_every=4"]
    )
    plan = plan_windows(config, 100)  # 22 decisions in the fewest windows of at most 5: 5, 5, 4, 4, 4
    assert plan == WindowPlan(starts=(10, 30, 50, 66, 82), decisions=(5, 5, 4, 4, 4), every=4, available=22)

    config.backtest.agent_window_decisions = 2  # 22 decisions: 11 windows of 2, whatever agent_windows says
    assert plan_windows(config, 100).decisions == (2,) * 11
    config.backtest.max_decisions = 3  # a cap below the window length: windows of 2 and 1
    assert plan_windows(config, 100) == WindowPlan(starts=(10, 18), decisions=(2, 1), every=4, available=22)


# --------------------------------------------------------------------------- scripted agent


def test_scripted_windows_give_trades_with_reasoning_and_consistent_books() -> None:
    run, context, plan = scripted_run(round_trip_script, "backtest.agent_windows=2")
    assert plan.decisions == (4, 4)
    cash = context.config.env.initial_cash

    # the chained curve, by hand from the two windows played alone
    curves, units = [], []
    for k, (start, decisions) in enumerate(zip(plan.starts, plan.decisions, strict=True)):
        (env,) = make_envs(context.config, 1, context.split)
        ScriptedPlayer(lambda _, d, k=k: round_trip_script(k, d)).run([FixedStart(env, start, decisions)], [k])
        curves.append(env.equity_curve().to_numpy())
        units.append(env.fills[0].units)
    growth = curves[0][-1] / cash
    np.testing.assert_allclose(run.equity.to_numpy(), np.r_[curves[0], growth * curves[1][1:]], rtol=1e-12)
    assert run.equity.index.equals(context.split_candles.index[plan.first_bar : plan.last_bar + 1])

    trades = run.trades
    assert trades["window"].tolist() == [0, 0, 1, 1]
    assert trades["direction"].tolist() == [1, -1, 1, -1]
    assert trades["exit_reason"].tolist() == ["order", "order", "order", WINDOW_END]
    assert trades["is_open"].tolist() == [False, False, False, True]
    assert [text[:4] for text in trades["reasoning"]] == ["w0d0", "w0d2", "w1d0", "w1d2"]
    assert trades["reasoning"].iloc[0].endswith(long(1.0))
    assert trades["exit_bar"].iloc[-1] == len(run.equity) - 1
    # window 1's money is scaled to the compounded equity, so the books add up with the curve
    assert trades["units"].iloc[2] == pytest.approx(units[1] * growth, rel=1e-12)
    assert trades["pnl"].sum() == pytest.approx(run.equity.iloc[-1] - cash, rel=1e-9)
    assert trades["fees"].sum() == pytest.approx(run.metrics["Fees Paid"], rel=1e-12)
    assert run.metrics["# Trades"] == 4 and run.metrics["Return [%]"] == pytest.approx(
        100 * (run.equity.iloc[-1] / cash - 1)
    )

    # decisions at bars 60, 64, ..., 88 of the split; the position after each one's fill, by the script:
    # window 0 long, hold (still long), short, close (flat); window 1 long, hold, short, forced hold (short)
    assert plan.starts == (60, 76) and context.first_bar == 0
    bars = np.arange(60, 92, 4)
    held = np.array([1, 1, -1, 0, 1, 1, -1, -1])
    candles = context.split_candles
    move = candles["close"].to_numpy()[bars + 4] - candles["open"].to_numpy()[bars + 1]
    right = held * np.sign(move) > 0
    assert run.metrics["Direction Accuracy [%]"] == pytest.approx(100 * np.mean(right))
    # actions long 2, short 2, hold 3 (a forced hold is a hold), close 1, of 8
    shares = np.array([2, 2, 3, 1]) / 8
    assert run.metrics["Action Entropy [nats]"] == pytest.approx(-(shares * np.log(shares)).sum(), rel=1e-12)

    assert run.extra == pytest.approx({
        "# Decisions": 8,
        "Valid Tool Calls [%]": 100 * 10 / 15,  # 15 turns; 5 malformed
        "Malformed Turns [%]": 100 * 5 / 15,
        "Action Mix: Long [%]": 25.0,
        "Action Mix: Short [%]": 25.0,
        "Action Mix: Close [%]": 12.5,
        "Action Mix: Hold [%]": 25.0,
        "Action Mix: Forced Hold [%]": 12.5,
        "Info Calls [%]": 12.5,  # one of 8 decisions traded after an information call (get_portfolio is not one)
        "Tool Calls: get_candles [%]": 12.5,
        "Tool Calls: get_indicators [%]": 0.0,  # offered and never called
        "Tool Calls: get_sentiment [%]": 0.0,
        # each decision index over the two windows (decisions k and k + 4 of the eight)
        **{f"Direction Accuracy, decision {k + 1} [%]": 100 * np.mean(right[[k, k + 4]]) for k in range(4)},
    })


def test_one_window_of_long_and_hold_is_buy_and_hold() -> None:
    """Without random slippage the env fills like the vectorized engine: going long once is buy-and-hold."""
    def script(k: int, d: int) -> list[str]:
        return [long(1.0) if d == 0 else hold()]

    run, context, plan = scripted_run(script, "backtest.agent_windows=1", "env.slippage_vol_frac=0")
    same_bars = replace(context, first_bar=plan.first_bar, last_bar=plan.last_bar)
    baseline = run_baseline("buy_and_hold", same_bars)
    np.testing.assert_allclose(run.equity.to_numpy(), baseline.equity.to_numpy(), rtol=1e-12)
    columns = ["entry_bar", "exit_bar", "direction", "units", "entry_price", "exit_price", "fees", "pnl"]
    pd.testing.assert_frame_equal(run.trades[columns], baseline.trades[columns], rtol=1e-12)
    for row in ("Return [%]", "Max. Drawdown [%]", "Fees Paid", "Turnover", "Exposure Time [%]"):
        assert run.metrics[row] == pytest.approx(baseline.metrics[row], rel=1e-9)
    # scored on the same decisions the same way: always long, like buy-and-hold
    assert 0 < run.metrics["Direction Accuracy [%]"] == baseline.metrics["Direction Accuracy [%]"] < 100
    assert run.metrics["Action Entropy [nats]"] == pytest.approx(
        -(1 / 8 * np.log(1 / 8) + 7 / 8 * np.log(7 / 8))  # one long, seven holds
    )
    assert np.isnan(baseline.metrics["Action Entropy [nats]"])


# --------------------------------------------------------------------------- the CLI


def test_checkpoint_and_base_model_beside_the_baselines(capsys, checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    code, stdout, err = run_cli(
        capsys, "backtest", "--checkpoint", str(checkpoint), "--set", "backtest.max_decisions=8",
        "--set", "backtest.agent_windows=2", "--baseline", "base-model", "--model", "tiny-random",
        "--out", str(out),
    )
    assert code == 0, err
    document = json.loads((out / "metrics.json").read_text())
    agent = "agent (step-1)"
    assert list(document["strategies"]) == [agent, "base model", "model tiny-random", *DEFAULT_STRATEGIES]
    rows = document["strategies"][agent]
    assert rows["# Decisions"] == 8 and 0 <= rows["Valid Tool Calls [%]"] <= 100
    mix = [rows[f"Action Mix: {kind} [%]"] for kind in ("Long", "Short", "Close", "Hold", "Forced Hold")]
    assert sum(mix) == pytest.approx(100.0)
    assert {"Malformed Turns [%]", "Sharpe Ratio", "Fees Paid"} <= set(rows)
    assert 0 <= rows["Direction Accuracy [%]"] <= 100
    assert 0 <= rows["Action Entropy [nats]"] <= np.log(4) + 1e-12
    assert document["decisions"]["count"] == 8  # every strategy is scored on the agent's 8 decisions
    assert all(document["strategies"][name]["Action Entropy [nats]"] is None for name in DEFAULT_STRATEGIES)
    # every strategy is measured on the agent's bars: 8 decisions of 4 bars from the first warm bar
    assert document["period"]["bars"] == 8 * 4 + 1 and document["evaluated_bars"]["first"] == 60
    assert {table["Start"] for table in document["strategies"].values()} == {document["period"]["start"]}
    assert "max_decisions" in document["notes"][agent] and "window" in document["notes"][agent]
    assert document["notes"]["base model"] == f"RL started from: tiny-random; same protocol and windows as {agent}"
    assert document["notes"]["model tiny-random"] == f"no RL: tiny-random; same protocol and windows as {agent}"
    # the same untrained weights, so the same decisions
    assert document["strategies"]["model tiny-random"] == document["strategies"]["base model"]
    trades = pd.read_csv(out / "trades.csv")
    assert "reasoning" in trades.columns
    agent_trades = trades[trades["strategy"] == agent]
    assert agent_trades["reasoning"].notna().all()
    assert list(pd.read_csv(out / "equity.csv", index_col=0).columns)[:2] == [agent, "base model"]
    assert agent in (out / "report.html").read_text() and agent in stdout


def test_base_model_without_a_checkpoint(capsys, tmp_path: Path) -> None:
    out = tmp_path / "report"
    code, _, err = run_cli(
        capsys, "backtest", "--config", "smoke", "--baseline", "base-model", "--strategy", "buy_and_hold",
        "--set", "backtest.max_decisions=2", "--set", "backtest.agent_windows=2", "--out", str(out),
    )
    assert code == 0, err
    document = json.loads((out / "metrics.json").read_text())
    assert list(document["strategies"]) == ["base model", "buy_and_hold"]
    assert document["strategies"]["base model"]["# Decisions"] == 2
    assert document["notes"]["base model"].startswith("untrained: tiny-random; greedy decoding")


def drop_critic(path: Path) -> None:
    shutil.rmtree(path / "critic")


def change_model_seed(path: Path) -> None:
    """The checkpoint's config now names other weights than the ones it holds."""
    saved = yaml.safe_load((path / "config.yaml").read_text())
    saved["model"]["tiny_seed"] = 1
    (path / "config.yaml").write_text(yaml.safe_dump(saved))


def change_model_shape(path: Path) -> None:
    """The checkpoint's config now names a deeper tiny model than the one it holds."""
    saved = yaml.safe_load((path / "config.yaml").read_text())
    saved["model"]["tiny_layers"] = 3
    (path / "config.yaml").write_text(yaml.safe_dump(saved))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (drop_critic, "incomplete checkpoint '{path}': missing critic"),
        (change_model_seed, "{path}/policy holds a policy for another model config (tiny_seed 0 vs 1)"),
        (change_model_shape, "{path}/policy holds a policy for another model config (tiny_shape None vs [3, 64])"),
    ],
    ids=["incomplete", "incompatible-config", "incompatible-shape"],
)
def test_bad_checkpoints_are_one_line_usage_errors(
    capsys, checkpoint: Path, tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / "step-1"
    shutil.copytree(checkpoint, path)
    damage(path)
    out = tmp_path / "report"
    code, _, err = run_cli(capsys, "backtest", "--checkpoint", str(path), "--out", str(out))
    assert code == 2
    assert message.format(path=path) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_unknown_baseline_is_a_usage_error(capsys, tmp_path: Path) -> None:
    args = ["backtest", "--config", "smoke", "--baseline", "gpt", "--out", str(tmp_path / "out")]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "unknown --baseline 'gpt': use base-model" in err
