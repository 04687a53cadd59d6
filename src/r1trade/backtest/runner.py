"""`r1trade backtest` as a function: load the held-out split, run the strategies, write the report.

Every strategy trades the same candles under the config's costs (`env.initial_cash`, `env.fee_bps`,
`env.slippage_bps`, `env.allow_short`), with the engine's fill rules; metrics are annualised by the bar
length over a 365-day year with `backtest.risk_free_rate` (CAGR, Sortino and Calmar only on spans of at least
`backtest.min_annualise_days`). The random baseline runs with seeds `seed`,
`seed + 1`, ... (`backtest.random_seeds` of them): its metrics are the mean of each seed's metrics, its equity
curve is the mean of the seeds' curves, and its trades are all seeds' trades with a `seed` column.

A trained agent (`--checkpoint`) and the untrained base model (`--baseline base-model`) play the split through
the TradingEnv by the protocol of `r1trade.backtest.model_runs`, with this config's env settings; their
evaluation starts at the first bar with warm-up history (and may stop early, `backtest.max_decisions`), and
every baseline is then measured on exactly the same bars, its signals still computed from the whole split so
that indicators have their history. `Direction Accuracy [%]` scores every strategy on the same decision bars
(`ReportContext.decision_bars`: the models' decisions, or every `env.decision_every` bars of the evaluated
bars when no model runs), a baseline by the position it holds after each decision bar's fill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from r1trade.backtest.engine import BacktestResult, run_vectorized
from r1trade.backtest.metrics import SECONDS_PER_YEAR
from r1trade.backtest.model_runs import WindowPlan, context_plan, run_model
from r1trade.backtest.report import ReportContext, StrategyRun, write_report
from r1trade.backtest.strategies import ALL_STRATEGIES, PLANTED_EDGE_STRATEGIES, make_targets
from r1trade.config import Config, ModelConfig, load_config
from r1trade.data.source import load_config_candles
from r1trade.data.splits import make_splits
from r1trade.data.store import timeframe_to_timedelta
from r1trade.errors import ConfigError, DataError, UsageError

SEEDED_STRATEGIES = frozenset({"random"})
"""Baselines whose targets depend on a seed; they are averaged over `backtest.random_seeds` seeds."""


@dataclass(frozen=True)
class BacktestOutcome:
    """What a backtest produced: the runs (models first, then baselines), what they ran on, where it went."""

    runs: list[StrategyRun]
    context: ReportContext
    out_dir: Path
    files: list[Path]


def run_backtest(
    config: Config,
    *,
    strategy: str | None = None,
    checkpoint: Path | None = None,
    base_model: bool = False,
    models: Sequence[str] = (),
    out_dir: Path | None = None,
) -> BacktestOutcome:
    """Run `strategy` alone, or every baseline in `backtest.strategies`, beside the agent of `checkpoint`,
    (`base_model`) the model before RL: the checkpoint's base model, else `config.model`, and any other `models`
    (names or directories, e.g. the untrained model a warm start began from), all played the agent's way.

    The split is `backtest.split` of the config's candles (`data.source`); the report goes to `out_dir`, by
    default `<backtest.report_dir>/<name>-<split>` (plus `-<strategy>` when a single baseline runs). A
    planted-edge baseline (the oracle) run alone comes with buy-and-hold, the reference it is read against.
    """
    names = [strategy] if strategy else list(dict.fromkeys(config.backtest.strategies))
    if strategy in PLANTED_EDGE_STRATEGIES:
        names.append("buy_and_hold")
    check_strategy_names(names, params=config.backtest.params, planted_edge=config.data.source == "synthetic")
    if not names and checkpoint is None and not base_model and not models:
        raise ConfigError(
            "nothing to backtest: backtest.strategies is empty and neither --checkpoint nor --baseline "
            "base-model was given"
        )
    context = load_context(config)
    runs: list[StrategyRun] = []
    if checkpoint is not None or base_model or models:
        plan = context_plan(context)
        context = replace(context, first_bar=plan.first_bar, last_bar=plan.last_bar)
        if checkpoint is not None:
            runs.append(run_agent(checkpoint, context))
        model = load_config(checkpoint / "config.yaml").model if checkpoint is not None else config.model
        if base_model:
            before_rl = "RL started from" if checkpoint is not None else "untrained"
            runs.append(run_base_model(model, context, beside=runs[0].name if runs else None, what=before_rl))
        for name in models:
            other = model.model_copy(update={"name_or_path": name})
            runs.append(run_base_model(other, context, beside=runs[0].name if runs else None,
                                       label=f"model {name}", what="no RL"))
    runs += [run_baseline(name, context) for name in names]
    out_dir = out_dir or default_report_dir(config, strategy)
    files = write_report(runs, context, out_dir)
    return BacktestOutcome(runs=runs, context=context, out_dir=out_dir, files=files)


def default_report_dir(config: Config, strategy: str | None = None) -> Path:
    """`<report_dir>/<name>-<split>`, plus `-<strategy>` for a single baseline (so it keeps a comparison)."""
    parts = [config.name, config.backtest.split, *([strategy] if strategy else [])]
    return Path(config.backtest.report_dir) / "-".join(parts)


def check_strategy_names(names: list[str], *, params: dict[str, dict[str, Any]], planted_edge: bool) -> None:
    """Refuse unknown baselines (in the request or in `backtest.params`), listing the valid names, and the
    planted-edge baselines (the oracle) unless the data is generated with a planted edge (`planted_edge`)."""
    valid = ", ".join(ALL_STRATEGIES)
    for name in names:
        if name not in ALL_STRATEGIES:
            raise UsageError(f"unknown strategy '{name}': use one of {valid}")
        if name in PLANTED_EDGE_STRATEGIES and not planted_edge:
            raise UsageError(
                f"strategy '{name}' is the rule planted in synthetic data and needs data.source: synthetic "
                "(e.g. --config planted_edge); it does not exist for real candles"
            )
    for name in params:
        if name not in ALL_STRATEGIES:
            raise ConfigError(f"backtest.params has unknown strategy '{name}': use one of {valid}")


def load_context(config: Config) -> ReportContext:
    """Validated candles of `data` (file or generated), split by `data.split`; the bar length gives the
    annualisation."""
    candles, _ = load_config_candles(config)
    splits = make_splits(candles, config.data.split)
    split = config.backtest.split
    bars = len(splits.get(split))
    if bars < 2:
        raise DataError(f"the {split} split has {bars} bars: adjust data.split to backtest it")
    bars_per_year = SECONDS_PER_YEAR / timeframe_to_timedelta(candles.attrs["timeframe"]).total_seconds()
    return ReportContext(config=config, splits=splits, split=split, bars_per_year=bars_per_year)


def run_baseline(name: str, context: ReportContext) -> StrategyRun:
    """Backtest the registered baseline `name` with its `backtest.params`; seeded baselines average seeds."""
    params = context.config.backtest.params.get(name, {})
    if name not in SEEDED_STRATEGIES:
        result = _simulate(name, params, context)
        metrics = _metrics(result, context)
        return StrategyRun(name=name, equity=result.equity, trades=result.trades, metrics=metrics)
    first = context.config.seed
    seeds = range(first, first + context.config.backtest.random_seeds)
    results = {seed: _simulate(name, {**params, "seed": seed}, context) for seed in seeds}
    return _average_over_seeds(name, results, context)


def run_agent(checkpoint: Path, context: ReportContext) -> StrategyRun:
    """The trained agent "agent (step-N)": greedy decoding through the TradingEnv with the context's config.

    The policy comes from the checkpoint (`load_trained_agent`: a missing or incomplete checkpoint, or one
    whose config does not match its weights, is a one-line UsageError); everything the env does (costs,
    cadence, tools, decoding length) comes from `context.config`. The run's trades carry the `reasoning` text
    of the turn that opened them; its extra rows hold the valid-tool-call rate and the action mix.
    """
    from r1trade.rl.checkpoint import load_trained_agent

    if not checkpoint.is_dir():
        raise UsageError(
            f"checkpoint not found: '{checkpoint}' (agent backtests need a trained checkpoint from "
            "`r1trade train`, e.g. runs/<name>/checkpoints/step-N)"
        )
    trained, models = load_trained_agent(checkpoint)
    note = f"checkpoint {checkpoint} ({trained.model.name_or_path}); {protocol_note(_plan(context), context)}"
    return run_model(f"agent ({checkpoint.name})", models, context, note=note)


def run_base_model(
    model: ModelConfig,
    context: ReportContext,
    *,
    beside: str | None = None,
    label: str = "base model",
    what: str = "untrained",
) -> StrategyRun:
    """`model` without RL (as `label`, default "base model"), by the agent's protocol, so the effect of training
    shows. `what` says what it is in the note ("untrained", "RL started from").

    `beside`: the run it is compared with (its note describes the protocol, this one refers to it).
    """
    from r1trade.agent.model import load_agent_models

    models = load_agent_models(model, seed=context.config.seed)
    protocol = f"same protocol and windows as {beside}" if beside else protocol_note(_plan(context), context)
    return run_model(label, models, context, note=f"{what}: {model.name_or_path}; {protocol}")


def protocol_note(plan: WindowPlan, context: ReportContext) -> str:
    """How a model run was evaluated, for the report (see `r1trade.backtest.model_runs`)."""
    env, seed, index = context.config.env, context.config.seed, context.split_candles.index
    first, last = (f"{index[bar]:%Y-%m-%d %H:%M}" for bar in (plan.first_bar, plan.last_bar))
    if plan.total < plan.available:
        scope = (
            f"the first {plan.total:,} of the {plan.available:,} decisions that fit "
            "(backtest.max_decisions), so only the first part of the split is evaluated"
        )
    else:
        scope = f"all {plan.total:,} decisions that fit in the split"
    sizes = sorted(set(plan.decisions))
    size = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    where = "planted interval end" if context.config.data.source == "synthetic" else "bar"
    random_slippage = (
        f" The model's fills also pay the env's random slippage ({env.slippage_vol_frac:g} × recent "
        "volatility × |z|), which the rule baselines do not."
        if env.slippage_vol_frac > 0 else ""
    )
    return (
        f"greedy decoding; a decision every {plan.every} bars from bar {plan.first_bar} of the split (the "
        f"{first} UTC bar, the first {where} with {env.warmup_bars} bars of history) to bar {plan.last_bar} "
        f"({last} UTC): {scope}. They are played as {len(plan.starts)} contiguous windows of {size} decisions in one "
        f"batch, window k with slippage seed {seed} + k. Each window starts flat with the initial cash; a "
        "position still open at a window's end is not closed but marked at that bar's close without exit fee "
        "or slippage (exit reason 'window end'), and the next window starts flat again. The equity curve "
        "compounds the windows' returns; later windows' units, fees and PnL are scaled to that compounded "
        f"equity.{random_slippage} The baselines are measured on the same bars (their signals see the "
        "split's earlier bars as history)."
    )


def _plan(context: ReportContext) -> WindowPlan:
    return context_plan(context)


def _simulate(name: str, params: dict[str, Any], context: ReportContext) -> BacktestResult:
    """Targets of baseline `name` from the whole split, traded on the evaluated bars with the config's costs.

    Trading starts flat at the first evaluated bar; targets there may use earlier bars (indicator history).
    """
    env = context.config.env
    try:
        target = make_targets(name, context.split_candles, **params)
        return run_vectorized(
            context.candles, target.iloc[context.bars], initial_cash=env.initial_cash, fee_bps=env.fee_bps,
            slippage_bps=env.slippage_bps, allow_short=env.allow_short,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"baseline {name} with parameters {params}: {exc}") from exc


def _metrics(result: BacktestResult, context: ReportContext) -> dict[str, Any]:
    """The metrics table of one result, annualised and risk-adjusted as the context says."""
    settings = context.config.backtest
    return result.metrics(
        bars_per_year=context.bars_per_year,
        risk_free_rate=settings.risk_free_rate,
        min_annualise_days=settings.min_annualise_days,
        decision_bars=context.decision_bars,
        candles=context.candles,
        decision_every=context.config.env.decision_every,
    )


def _average_over_seeds(name: str, results: dict[int, BacktestResult], context: ReportContext) -> StrategyRun:
    """One run from several seeds: mean metrics (NaN skipped), the mean equity curve, every seed's trades."""
    tables = [_metrics(result, context) for result in results.values()]
    returns = np.array([table["Return [%]"] for table in tables])
    trades = [result.trades.assign(seed=seed) for seed, result in results.items()]
    seeds = list(results)
    return StrategyRun(
        name=name,
        equity=pd.concat([r.equity for r in results.values()], axis=1).mean(axis=1).rename("equity"),
        trades=pd.concat([t for t in trades if not t.empty] or trades[:1], ignore_index=True),
        metrics=_mean_metrics(tables),
        extra={
            "Seeds": float(len(seeds)),
            "Return Std over Seeds [%]": float(returns.std(ddof=1)) if len(returns) > 1 else math.nan,
        },
        note=(
            f"seeds {seeds[0]}–{seeds[-1]}: metrics are the mean of each seed's metrics; the equity curve is "
            "the mean of the seeds' curves"
        ),
    )


def _mean_metrics(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-row mean over seeds, skipping NaN; non-numbers (Start, End: the same for every seed) kept as is."""
    merged: dict[str, Any] = {}
    for row, first in tables[0].items():
        if not isinstance(first, float):
            merged[row] = first
            continue
        values = [table[row] for table in tables if not math.isnan(table[row])]
        merged[row] = sum(values) / len(values) if values else math.nan
    return merged
