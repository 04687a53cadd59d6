"""Language models as backtest strategies: greedy decoding through the TradingEnv, windows played in a batch.

An LM decides slowly on a CPU, so a long split is cut into windows that are decoded together. Protocol:
- The model decides every `env.decision_every` bars, from the split's first bar with `env.warmup_bars` bars of
  history (on generated data with a planted edge: the first end of a planted interval with that history) up to
  the last decision whose bars fit in the split; `backtest.max_decisions` keeps only the first ones (then only
  the first part of the split is evaluated).
- The decisions are cut into `backtest.agent_windows` contiguous windows of whole decisions (sizes differ by
  at most one), or into the fewest windows of at most `backtest.agent_window_decisions` decisions, and played
  as one batch: one TradingEnv per window with the run's env settings (fees, fixed and random slippage,
  cadence, tools), reset at the window's first bar with seed `seed + k` for window k (the seed drives the
  random slippage; decoding is greedy, so nothing else is random).
- Each window starts flat with `env.initial_cash`. Nothing is closed at a window's end: a position still open
  is marked at that bar's close, without exit fee or slippage, and dropped; the next window starts flat again,
  so re-entering pays the entry costs again. Such a trade is listed with exit reason "window end".
- `chain_equity` compounds the windows' returns into one equity curve over the whole period. The units, fees,
  PnL and notional of window k are scaled by the chained equity at its start over the initial cash, so the
  trades, fees and turnover add up with that curve.
- `Direction Accuracy [%]` scores each decision by the position held after its order's fill at the next open
  against the move from that open to the close `decision_every` bars later (as the baselines are scored on
  the same bars); `Action Entropy [nats]` is the entropy of the decisions' trade actions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from r1trade.backtest.engine import TRADE_COLUMNS, round_trips
from r1trade.backtest.metrics import compute_metrics, decision_hits, held_moves
from r1trade.backtest.report_runs import ReportContext, StrategyRun
from r1trade.config import Config
from r1trade.data.splits import train_then_test
from r1trade.data.synthetic import DecisionGrid, decision_grid
from r1trade.env.information import (
    SIGNAL_TOOL,
    accuracy_by_decision,
    action_mix,
    decision_kind,
    information_use,
)
from r1trade.errors import DataError

if TYPE_CHECKING:
    from r1trade.models.agent_models import AgentModels
    from r1trade.rollout.loop import TextEnv, Trajectory

TRADE_ACTION = {"Long": "long", "Short": "short", "Close": "close", "Hold": "hold", "Forced Hold": "hold"}
"""Each kind's trade action, for `Action Entropy [nats]` (a forced hold leaves the position as a hold)."""

AGENT_TRADE_COLUMNS = [*TRADE_COLUMNS, "window", "exit_reason", "reasoning"]
"""Trades of a model run: the engine's columns, the window, how the trade ended and the entry turn's text."""

WINDOW_END = "window end"


class Player(Protocol):
    """Plays one episode per env, all as one batch (`r1trade.rollout.loop.RolloutEngine` is one)."""

    def run(self, envs: Sequence[TextEnv], seeds: Sequence[int | None]) -> list[Trajectory]: ...


@dataclass(frozen=True)
class WindowPlan:
    """Decision windows in bar positions of the split: window k decides at bars starts[k] + i × every for
    i < decisions[k]."""

    starts: tuple[int, ...]
    decisions: tuple[int, ...]
    every: int
    available: int
    """Decisions that fit in the split from its first bar with warm-up history (above `total` if capped)."""

    @property
    def total(self) -> int:
        return sum(self.decisions)

    @property
    def first_bar(self) -> int:
        """The first decision bar."""
        return self.starts[0]

    @property
    def last_bar(self) -> int:
        """The last bar the windows walk through (the last decision's bars included)."""
        return self.starts[-1] + self.every * self.decisions[-1]


@dataclass(frozen=True)
class WindowPlay:
    """One window's episode: its first bar, the equity per bar from there, each turn's text and step info."""

    start: int
    equity: pd.Series
    turns: list[tuple[str, dict[str, Any]]]

    @property
    def last_bar(self) -> int:
        """The window's last marked bar (earlier than planned only if the episode ended in bankruptcy)."""
        return self.start + len(self.equity) - 1


def plan_windows(
    config: Config, bars: int, *, grid: DecisionGrid | None = None, earliest: int = 0
) -> WindowPlan:
    """The decision windows of a split of `bars` bars under `config.env` and `config.backtest`.

    `grid`: where the planted intervals of generated data end; the first decision is then the first interval
    end after the warm-up, so that every decision sees whole intervals, as in training. `earliest`: the first
    bar a decision may take (a walk-forward fold's first bar); the windows end by bar `bars` - 1.
    """
    env, backtest = config.env, config.backtest
    first = max(env.warmup_bars, earliest)
    first = first if grid is None else grid.next_on_grid(first)
    available = (bars - 1 - first) // env.decision_every
    if available < 1:
        raise DataError(
            f"the {backtest.split} split has {bars} bars: too few for {env.warmup_bars} warm-up bars and a "
            f"decision every {env.decision_every} bars (adjust data.split or env.warmup_bars)"
        )
    total = min(available, backtest.max_decisions or available)
    per_window = backtest.agent_window_decisions
    count = min(backtest.agent_windows if per_window is None else math.ceil(total / per_window), total)
    base, extra = divmod(total, count)
    decisions = tuple(base + (k < extra) for k in range(count))
    before = accumulate(decisions[:-1], initial=0)  # decisions in the earlier windows
    starts = tuple(first + env.decision_every * done for done in before)
    return WindowPlan(starts=starts, decisions=decisions, every=env.decision_every, available=available)


def context_plan(context: ReportContext) -> WindowPlan:
    """`plan_windows` for the context's evaluated bars of its split (on the planted intervals' grid for
    generated data); planning again on the bars of a plan gives the same windows."""
    candles = context.split_candles
    end = len(candles) if context.last_bar is None else context.last_bar + 1
    return plan_windows(context.config, end, grid=decision_grid(candles), earliest=context.first_bar)


def chain_equity(curves: Sequence[pd.Series]) -> pd.Series:
    """One equity curve from consecutive windows' curves, compounding each window's returns.

    Window k's curve starts at the bar where window k-1's ends; from there the chained value is
    chained[start_k] × curve_k[t] / curve_k[start_k]. Ruin is final: once the chained equity is at or below
    zero, later windows are left out.
    """
    pieces: list[pd.Series] = []
    level = float(curves[0].iloc[0])
    for k, curve in enumerate(curves):
        if k and curve.index[0] != curves[k - 1].index[-1]:
            raise ValueError(f"window {k} starts at {curve.index[0]}, not where window {k - 1} ends")
        piece = curve * (level / float(curve.iloc[0]))
        pieces.append(piece if k == 0 else piece.iloc[1:])
        level = float(piece.iloc[-1])
        if level <= 0.0:
            break
    return pd.concat(pieces).rename("equity")


def turn_stats(infos: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Extra report rows from the env's step infos: decisions, valid and malformed turn rates, action mix.

    A valid tool call parsed and was accepted by its tool; a malformed turn did not parse (no call, bad JSON,
    unknown tool, bad arguments); a call the tool refused is neither. The action mix is over decisions, and so are
    the information rows (`r1trade.env.information`): the share of decisions whose trade followed an information
    call, each offered tool's share (0 % included), and, where `get_changes` is offered, direction accuracy with
    and without it; with windows of several decisions, direction accuracy at each decision index.
    """
    decisions = [info for info in infos if info["decision_done"]]
    mix = action_mix(decisions)
    valid = sum(info["parse_error"] is None and info["tool_error"] is None for info in infos)
    malformed = sum(info["parse_error"] is not None for info in infos)
    use = information_use(decisions)
    by_index = {f"Direction Accuracy, decision {k + 1} [%]": 100.0 * share
                for k, share in accuracy_by_decision(decisions).items()}
    split = {
        f"Direction Accuracy, {SIGNAL_TOOL} {when} [%]": None if share is None else 100.0 * share
        for when, share in (("called", use["accuracy_with_signal"]), ("not called", use["accuracy_without_signal"]))
    }
    return {
        "# Decisions": float(len(decisions)),
        "Valid Tool Calls [%]": 100.0 * valid / len(infos),
        "Malformed Turns [%]": 100.0 * malformed / len(infos),
        **{f"Action Mix: {kind} [%]": 100.0 * share for kind, share in mix.items()},
        "Info Calls [%]": 100.0 * use["info_call_rate"],
        **{f"Tool Calls: {name} [%]": 100.0 * rate for name, rate in use["tool_rates"].items()},
        **(split if SIGNAL_TOOL in use["tool_rates"] else {}),
        **(by_index if len(by_index) > 1 else {}),
    }


# --------------------------------------------------------------------------- playing


def run_model(name: str, models: AgentModels, context: ReportContext, *, note: str) -> StrategyRun:
    """`models`' policy as a strategy on the context's split, by the module's protocol (greedy decoding)."""
    from r1trade.rollout.backend import sampling_from_config
    from r1trade.rollout.build import transformers_engine

    sampling = sampling_from_config(context.config.rollout, greedy=True)
    engine = transformers_engine(models.policy, models.tokenizer, sampling)
    plan = context_plan(context)
    return model_run(name, play_windows(engine, context, plan), context, plan, note=note)


def play_windows(player: Player, context: ReportContext, plan: WindowPlan) -> list[WindowPlay]:
    """Play every window of `plan` as one batch, window k seeded `seed + k`; one result per window."""
    from r1trade.env.trading_env import FixedStart, make_envs

    config = context.config
    replayed, split = _replay_source(context)
    envs = make_envs(replayed, len(plan.starts), split)
    if not envs[0].replay.index.equals(context.split_candles.index):
        raise DataError(f"the env's {context.split} split differs from the backtest's: check data.path")
    windows = [FixedStart(env, s, n) for env, s, n in zip(envs, plan.starts, plan.decisions, strict=True)]
    trajectories = player.run(windows, [config.seed + k for k in range(len(windows))])
    return [
        WindowPlay(start, env.equity_curve(), [(turn.text, turn.info) for turn in trajectory.turns])
        for start, env, trajectory in zip(plan.starts, envs, trajectories, strict=True)
    ]


def _replay_source(context: ReportContext) -> tuple[Config, str]:
    """The config and split whose market replay holds the context's candles: its own, or, for a span (every bar
    after the train split), its config with a split whose test split is that span (`train_then_test`), since
    envs replay whole splits."""
    config = context.config
    if context.span is None:
        return config, context.split
    split = train_then_test(
        train_end=context.splits.train.index[-1], test_end=context.span.index[-1],
        embargo_bars=config.data.split.embargo_bars,
    )
    return config.model_copy(update={"data": config.data.model_copy(update={"split": split})}), "test"


# --------------------------------------------------------------------------- the run


def model_run(
    name: str, plays: Sequence[WindowPlay], context: ReportContext, plan: WindowPlan, *, note: str
) -> StrategyRun:
    """The StrategyRun of `plan`'s played windows: chained equity, scaled trades, metrics, turn statistics.

    The run covers the plan's bars (`plan.first_bar` to `plan.last_bar`) whatever bars `context` evaluates;
    the runner restricts the baselines to those same bars.
    """
    context = replace(context, first_bar=plan.first_bar, last_bar=plan.last_bar)
    candles, initial_cash = context.candles, context.config.env.initial_cash
    chained = chain_equity([play.equity for play in plays])
    trades: list[pd.DataFrame] = []
    positions: list[pd.Series] = []
    infos: list[dict[str, Any]] = []
    decisions: list[_Decisions] = []
    fees = notional = 0.0
    for k, play in enumerate(plays):
        start_time = play.equity.index[0]
        if start_time not in chained.index or chained[start_time] <= 0.0:
            break  # after ruin
        window = _window_books(k, play, context, scale=float(chained[start_time]) / initial_cash)
        trades.append(window.trades)
        positions.append(window.positions if k == 0 else window.positions.iloc[1:])
        fees += window.fees
        notional += window.notional
        infos += [info for _, info in play.turns]
        decisions.append(_decisions(play, context))
    equity = chained.reindex(candles.index).ffill()  # held after ruin
    all_trades = pd.concat([t for t in trades if not t.empty] or trades[:1], ignore_index=True)
    decision_bars = np.concatenate([d.bars for d in decisions])
    decision_positions = np.concatenate([d.positions for d in decisions])
    moves = held_moves(candles["open"].to_numpy(), candles["close"].to_numpy(), decision_bars, plan.every)
    actions = [action for d in decisions for action in d.actions]
    metrics = compute_metrics(
        equity,
        trades=all_trades,
        positions=pd.concat(positions).reindex(candles.index, fill_value=0.0),
        fees_paid=fees,
        traded_notional=notional,
        bars_per_year=context.bars_per_year,
        risk_free_rate=context.config.backtest.risk_free_rate,
        min_annualise_days=context.config.backtest.min_annualise_days,
        decision_positions=decision_positions,
        decision_moves=moves,
        actions=actions,
    )
    taken = np.searchsorted(context.decision_bars, decision_bars)
    hits = np.zeros(len(context.decision_bars))  # decisions never taken (after ruin) hold nothing: wrong
    hits[taken] = decision_hits(decision_positions, moves)
    exposures = None
    if context.config.env.mandate == "vol_target":
        exposures = np.zeros(len(context.decision_bars))  # after ruin: cash
        exposures[taken] = np.concatenate([d.sizes for d in decisions])
    return StrategyRun(
        name=name, equity=equity, trades=all_trades, metrics=metrics, extra=turn_stats(infos), note=note,
        hits=hits, actions=tuple(actions), exposures=exposures,
    )


@dataclass(frozen=True)
class _Decisions:
    """One window's decisions: bars (positions among the evaluated bars), the position held after each
    decision's fill, its trade action (`TRADE_ACTION`) and the size (target fraction of equity) it held, which
    a hold keeps (read under the volatility-target mandate, whose orders set no stop that could close it)."""

    bars: np.ndarray
    positions: np.ndarray
    actions: list[str]
    sizes: np.ndarray


def _decisions(play: WindowPlay, context: ReportContext) -> _Decisions:
    """Window `play`'s decisions, scored like the baselines': the decision at bar d holds, from the open of
    bar d + 1, the units after its order's fill (a hold keeps the units held then, which an earlier stop may
    have closed); stop or take-profit exits later in the interval do not change what the decision is scored
    on."""
    every = context.config.env.decision_every
    bars, positions, actions, sizes, units, size = [], [], [], [], 0.0, 0.0
    for _, info in play.turns:
        units += sum(fill["units"] for fill in info["fills"] if fill["reason"] == "order")
        if info["decision_done"]:
            bars.append(play.start + info["decision_index"] * every - context.first_bar)
            positions.append(units)
            actions.append(TRADE_ACTION[decision_kind(info)])
            size = size if info["order"]["target"] is None else info["order"]["target"]  # a hold keeps it
            sizes.append(size)
        units += sum(fill["units"] for fill in info["fills"] if fill["reason"] != "order")
    return _Decisions(np.array(bars, dtype=np.int64), np.array(positions, dtype=float), actions,
                      np.array(sizes, dtype=float))


@dataclass(frozen=True)
class _Books:
    """One window's accounts, money already scaled."""

    trades: pd.DataFrame
    positions: pd.Series  # units held at each of the window's bars
    fees: float
    notional: float


def _window_books(k: int, play: WindowPlay, context: ReportContext, *, scale: float) -> _Books:
    """Window k's round trips and per-bar positions from its fills, money scaled by `scale`.

    Bars are positions among the context's evaluated bars, like the baselines' trades. A trade's `reasoning`
    is the text of the turn whose order opened it.
    """
    fills = [(fill, text) for text, info in play.turns for fill in info["fills"]]
    bars = np.array([fill["bar"] for fill, _ in fills], dtype=np.int64) - context.first_bar
    units = np.array([fill["units"] for fill, _ in fills], dtype=float)
    prices = np.array([fill["price"] for fill, _ in fills], dtype=float)
    fees = np.array([fill["fee"] for fill, _ in fills], dtype=float)
    position = np.cumsum(units)
    last = play.last_bar - context.first_bar
    trades = round_trips(
        pd.DataFrame({"bar": bars, "units": units, "price": prices, "fee": fees, "position": position}),
        context.candles.index[: last + 1],
        last_close=float(context.candles["close"].iloc[last]),
    )
    before = np.r_[0.0, position[:-1]]
    flips = np.sign(position) != np.sign(before)
    opens, closes = np.flatnonzero(flips & (position != 0)), np.flatnonzero(flips & (before != 0))
    exit_reasons = [fills[i][0]["reason"] for i in closes] + [WINDOW_END] * int(trades["is_open"].sum())
    trades = trades.assign(window=k, exit_reason=exit_reasons, reasoning=[fills[i][1] for i in opens])
    trades[["units", "fees", "pnl"]] *= scale
    window_bars = np.arange(play.start - context.first_bar, last + 1)
    held = np.r_[0.0, position][np.searchsorted(bars, window_bars, side="right")]
    return _Books(
        trades=trades[AGENT_TRADE_COLUMNS],
        positions=pd.Series(held * scale, index=context.candles.index[window_bars]),
        fees=float(fees.sum()) * scale,
        notional=float(np.abs(units * prices).sum()) * scale,
    )
