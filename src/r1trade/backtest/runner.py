"""`r1trade backtest` as a function: load the held-out split, run the strategies, write the report.

Every strategy trades the same candles under the config's costs (`env.initial_cash`, `env.fee_bps`,
`env.slippage_bps`, `env.allow_short`), with the engine's fill rules; metrics are annualised by the bar
length over a 365-day year with `backtest.risk_free_rate` (CAGR, Sortino and Calmar only on spans of at least
`backtest.min_annualise_days`). The random baseline runs with seeds `seed`,
`seed + 1`, ... (`backtest.random_seeds` of them): its metrics are the mean of each seed's metrics, its equity
curve is the mean of the seeds' curves, and its trades are all seeds' trades with a `seed` column.

A trained agent (`--checkpoint`) and the untrained base model (`--baseline base-model`) play the split through
the TradingEnv by the protocol of `r1trade.backtest.model_runs`, with this config's env settings (the fold agents
of a walk-forward run each play their own fold only, `r1trade.backtest.fold_agents`); their
evaluation starts at the first bar with warm-up history (and may stop early, `backtest.max_decisions`), and
every baseline is then measured on exactly the same bars, its signals still computed from the whole split so
that indicators have their history. `Direction Accuracy [%]` scores every strategy on the same decision bars
(`ReportContext.decision_bars`: the models' decisions, or every `env.decision_every` bars of the evaluated
bars when no model runs), a baseline by the position it holds after each decision bar's fill.

Every run then gets its 95 % intervals, a model its verdict against buy-and-hold and, when several variants
were compared, deflated Sharpe ratios (`r1trade.backtest.uncertainty`), and the verdicts that count every trial:
PSR, minimum track record, SPA and StepM (`r1trade.backtest.verdicts`); a walk-forward (`--walk-forward K`)
does all of this on each fold and on the folds pooled (`r1trade.backtest.walk_forward`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from r1trade.backtest.bootstrap import DecisionSample
from r1trade.backtest.engine import BacktestResult, run_vectorized
from r1trade.backtest.fold_agents import (
    WalkForwardRun,
    check_fold_windows,
    is_walk_forward_run,
    load_walk_forward_run,
)
from r1trade.backtest.mandate import decided_at, decision_sigmas, is_mandate, with_mandate
from r1trade.backtest.metrics import SECONDS_PER_YEAR, decision_hits, held_moves
from r1trade.backtest.model_runs import WindowPlan, context_plan, run_model
from r1trade.backtest.report import write_report
from r1trade.backtest.report_runs import FoldReport, ReportContext, StrategyRun
from r1trade.backtest.strategies import (
    ALL_STRATEGIES,
    MANDATE_STRATEGIES,
    PLANTED_EDGE_STRATEGIES,
    best_constant_exposure,
    make_targets,
)
from r1trade.backtest.uncertainty import run_sample, with_uncertainty
from r1trade.backtest.verdicts import Trials, count_trials
from r1trade.backtest.volatility_forecast import fit_vol_forecast
from r1trade.backtest.walk_forward import SPANS, fold_contexts, pooled_run
from r1trade.config import Config, load_config
from r1trade.data.source import load_config_candles
from r1trade.data.splits import after_train, make_splits
from r1trade.data.store import timeframe_to_timedelta
from r1trade.env.volatility import LONG_FACTOR
from r1trade.errors import ConfigError, DataError, UsageError
from r1trade.outputs import check_report_folder

if TYPE_CHECKING:
    from r1trade.models.agent_models import AgentModels

SEEDED_STRATEGIES = frozenset({"random", "random_sizes"})
"""Baselines whose targets depend on a seed; they are averaged over `backtest.random_seeds` seeds."""


@dataclass(frozen=True)
class BacktestOutcome:
    """What a backtest produced: the runs (models first, then baselines), what they ran on, where it went;
    for a walk-forward, the runs are pooled and `folds` holds each fold's."""

    runs: list[StrategyRun]
    context: ReportContext
    out_dir: Path
    files: list[Path]
    folds: list[FoldReport] = field(default_factory=list)


def run_backtest(
    config: Config,
    *,
    strategy: str | None = None,
    checkpoint: Path | None = None,
    base_model: bool = False,
    models: Sequence[str] = (),
    out_dir: Path | None = None,
    force: bool = False,
    walk_forward: int | None = None,
    span: str | None = None,
    trials: int | None = None,
    step: int | None = None,
) -> BacktestOutcome:
    """Run `strategy` alone, or every baseline in `backtest.strategies`, beside the agent of `checkpoint`,
    (`base_model`) the model before RL: the checkpoint's base model, else `config.model`, and any other `models`
    (names or directories, e.g. the untrained model a warm start began from), all played the agent's way.

    The split is `backtest.split` of the config's candles (`data.source`); the report goes to `out_dir`, by
    default `<backtest.report_dir>/<name>-<split>` (plus `-<strategy>` when a single baseline runs, and
    `-wf<K>` for a walk-forward). A planted-edge baseline (the oracle) run alone, and a model, come with
    buy-and-hold, the reference they are read against. A folder holding a previous report is replaced only
    with `force`; a run, checkpoint or foreign folder never.

    `walk_forward` K: backtest K folds (`r1trade.backtest.walk_forward`) of the split, or with `span` "all" of
    every bar after the train split (default span: "split"); the report holds the pooled runs and each fold's.
    A `checkpoint` that is a walk-forward run (`train.walk_forward`) sets K and the span to the run's, and each
    fold's agent (its last checkpoint, or `step-N` for `step` N) plays its own fold. `trials`: the variants
    compared on this data, for the deflated Sharpe ratio (default: `count_trials`, the ladder's records of the
    config's `backtest.ladder_level` when models run).
    """
    fold_agents = _fold_agents(checkpoint, step)
    if fold_agents is not None:
        walk_forward, span = fold_agents.folds_asked(walk_forward, span)
    span = span or "split"
    if span not in SPANS:
        raise UsageError(f"--walk-forward-span {span!r}: use one of {', '.join(SPANS)}")
    if span != "split" and walk_forward is None:
        raise UsageError("--walk-forward-span needs --walk-forward K")
    if walk_forward is not None and walk_forward < 2:
        raise UsageError(f"--walk-forward {walk_forward}: use 2 or more folds")
    if trials is not None and trials < 1:
        raise UsageError(f"--trials {trials}: give the number of variants tried, 1 or more")
    out_dir = out_dir or default_report_dir(config, strategy, walk_forward=walk_forward, span=span)
    check_report_folder(out_dir, force=force)
    names = [strategy] if strategy else list(dict.fromkeys(config.backtest.strategies))
    players = model_players(config, checkpoint, base_model=base_model, models=models, fold_agents=fold_agents)
    counted = count_trials(config, models=len(players), given=trials)
    if (strategy in PLANTED_EDGE_STRATEGIES or players) and "buy_and_hold" not in names:
        names.append("buy_and_hold")
    check_strategy_names(
        names, params=config.backtest.params, planted_edge=config.data.source == "synthetic",
        mandate=is_mandate(config),
    )
    if not names:
        raise ConfigError(
            "nothing to backtest: backtest.strategies is empty and neither --checkpoint nor --baseline "
            "base-model was given"
        )
    context = load_context(config, span=span)
    contexts = [context] if walk_forward is None else fold_contexts(context, walk_forward)
    if fold_agents is not None:
        check_fold_windows(fold_agents, config)
    evaluations = [_evaluated(fold, number, players) for number, fold in enumerate(contexts, start=1)]
    fold_runs: list[list[StrategyRun]] = [[] for _ in evaluations]
    for player in players:  # each model is loaded once and plays every fold; fold agents load one per fold
        loaded = None
        for number, (runs, (fold, plan)) in enumerate(zip(fold_runs, evaluations, strict=True), start=1):
            if loaded is None or player.per_fold:
                loaded = None  # the previous fold's agent is freed before the next loads
                loaded = player.load(number)
            runs.append(player.play(loaded, fold, plan))
        del loaded  # freed before the next model loads
    model_names = {player.name for player in players}
    folds = []
    for number, (runs, (fold, _)) in enumerate(zip(fold_runs, evaluations, strict=True), start=1):
        runs += [run_baseline(name, fold) for name in names]
        samples = {run.name: sample for run in runs if (sample := run_sample(run, fold)) is not None}
        runs = with_uncertainty(
            runs, samples, fold, models=model_names, trials=counted.count, trials_source=counted.source
        )
        if is_mandate(config):
            runs = with_mandate(runs, decision_sigmas(fold), fold)
        folds.append(FoldReport(number, fold, runs))
    if walk_forward is None:
        context, runs = folds[0].context, folds[0].runs
        files = write_report(runs, context, out_dir)
        return BacktestOutcome(runs=runs, context=context, out_dir=out_dir, files=files)
    runs, context = _pooled(folds, model_names=model_names, trials=counted)
    files = write_report(runs, context, out_dir, folds)
    return BacktestOutcome(runs=runs, context=context, out_dir=out_dir, files=files, folds=folds)


def _fold_agents(checkpoint: Path | None, step: int | None) -> WalkForwardRun | None:
    """The fold agents of `checkpoint` when it is a walk-forward run (each fold's `step-N` for `step` N, else
    its last checkpoint); `step` names nothing in a single checkpoint."""
    if checkpoint is not None and is_walk_forward_run(checkpoint):
        return load_walk_forward_run(checkpoint, step=step)
    if step is not None:
        raise UsageError(
            "--step picks each fold agent's checkpoint of a walk-forward run (--checkpoint runs/<name> trained "
            "with train.walk_forward); a checkpoint directory already names its step"
        )
    return None


def default_report_dir(
    config: Config, strategy: str | None = None, *, walk_forward: int | None = None, span: str = "split"
) -> Path:
    """`<report_dir>/<name>-<split>`, plus `-<strategy>` for a single baseline (so it keeps a comparison), and
    `-wf<K>` for a walk-forward over K folds (its split named "all" for the span after the train split)."""
    split = config.backtest.split if span == "split" else span
    parts = [config.name, split, *([strategy] if strategy else [])]
    parts += [f"wf{walk_forward}"] if walk_forward else []
    return Path(config.backtest.report_dir) / "-".join(parts)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to play: its models, the opening of its note (what it is) and, for a trained agent, the
    checkpoint its policy came from."""

    models: AgentModels
    opening: str
    checkpoint: Path | None = None


@dataclass(frozen=True)
class ModelPlayer:
    """A language model played the agent's way: its name in the report, how to load it for fold k (1 without
    a walk-forward), whether each fold loads its own (a walk-forward run's fold agents) and the run whose note
    describes the protocol, if not its own."""

    name: str
    load: Callable[[int], LoadedModel]
    beside: str | None = None
    per_fold: bool = False

    def play(self, loaded: LoadedModel, context: ReportContext, plan: WindowPlan) -> StrategyRun:
        """The run on `context` (already the plan's bars); `plan`, made on the bars before, is described."""
        protocol = protocol_note(plan, context) if self.beside is None else (
            f"same protocol and windows as {self.beside}"
        )
        run = run_model(self.name, loaded.models, context, note=f"{loaded.opening}; {protocol}")
        return replace(run, checkpoint=loaded.checkpoint)


def model_players(
    config: Config,
    checkpoint: Path | None,
    *,
    base_model: bool = False,
    models: Sequence[str] = (),
    fold_agents: WalkForwardRun | None = None,
) -> list[ModelPlayer]:
    """The trained agent of `checkpoint` "agent (step-N)" (with `fold_agents`, the run's fold agents as
    "agent (per fold)"), (`base_model`) the model before RL as "base model" (the checkpoint's base model, else
    `config.model`) and each of `models` as "model NAME", in that order.

    The agent's policy comes from the checkpoint (`load_trained_agent`: a missing or incomplete checkpoint, or
    one whose config does not match its weights, is a one-line UsageError); everything the env does (costs,
    cadence, tools, decoding length) comes from `config`. A model run's trades carry the `reasoning` text of
    the turn that opened them; its extra rows hold the valid-tool-call rate and the action mix. Models are
    imported where one is loaded, so that a backtest of rules alone starts without torch.
    """
    if checkpoint is not None and not checkpoint.is_dir():
        raise UsageError(
            f"checkpoint not found: '{checkpoint}' (agent backtests need a trained checkpoint from "
            "`r1trade train`, e.g. runs/<name>/checkpoints/step-N)"
        )

    def agent(fold: int) -> LoadedModel:
        from r1trade.rl.checkpoint import load_trained_agent

        played = checkpoint if fold_agents is None else fold_agents.checkpoints[fold - 1]
        assert played is not None
        trained, loaded = load_trained_agent(played)
        return LoadedModel(loaded, f"checkpoint {played} ({trained.model.name_or_path})", played)

    def untrained(name: str | None, what: str) -> Callable[[int], LoadedModel]:
        def load(fold: int) -> LoadedModel:
            from r1trade.models.loading import load_agent_models

            model = load_config(checkpoint / "config.yaml").model if checkpoint is not None else config.model
            model = model if name is None else model.model_copy(update={"name_or_path": name})
            return LoadedModel(load_agent_models(model, seed=config.seed), f"{what}: {model.name_or_path}")
        return load

    players: list[ModelPlayer] = []
    if fold_agents is not None:
        players.append(ModelPlayer("agent (per fold)", agent, per_fold=True))
    elif checkpoint is not None:
        players.append(ModelPlayer(f"agent ({checkpoint.name})", agent))
    beside = players[0].name if players else None
    if base_model:
        what = "RL started from" if checkpoint is not None else "untrained"
        players.append(ModelPlayer("base model", untrained(None, what), beside))
        beside = beside or players[0].name
    for name in models:
        players.append(ModelPlayer(f"model {name}", untrained(name, "no RL"), beside))
        beside = beside or players[0].name
    return players


def _evaluated(
    context: ReportContext, number: int, players: Sequence[ModelPlayer]
) -> tuple[ReportContext, WindowPlan | None]:
    """The bars every strategy of a backtest (or fold `number`) is measured on: with models, those of their
    plan (which is returned, for their notes); without, the context's, except under the volatility-target
    mandate, where they are still a model's (from the end of `env.warmup_bars`): a rule that reads a trailing
    window holds cash, a penalty of 1, at every decision before it has one, so a baselines-only report would
    differ from the baselines beside a model."""
    if not players and not is_mandate(context.config):
        return context, None
    try:
        plan = context_plan(context)
    except DataError as exc:
        if context.first_bar == 0 and context.last_bar is None:
            raise
        raise UsageError(
            f"walk-forward fold {number} ({len(context.candles)} bars) is too short for a model's "
            f"{context.config.env.warmup_bars} warm-up bars and a decision every "
            f"{context.config.env.decision_every} bars: use fewer folds"
        ) from exc
    return replace(context, first_bar=plan.first_bar, last_bar=plan.last_bar), plan if players else None


def _pooled(
    folds: Sequence[FoldReport], *, model_names: set[str], trials: Trials
) -> tuple[list[StrategyRun], ReportContext]:
    """Each strategy's folds chained into one run, with intervals over all folds' decisions, and the context
    spanning the folds."""
    contexts = [fold.context for fold in folds]
    names = [run.name for run in folds[0].runs]
    runs = [pooled_run([fold.runs[i] for fold in folds], contexts) for i in range(len(names))]
    samples = {}
    for i, name in enumerate(names):
        parts = [run_sample(fold.runs[i], fold.context) for fold in folds]
        if all(part is not None for part in parts):
            samples[name] = DecisionSample.concat(parts)
    context = replace(contexts[0], last_bar=contexts[-1].first_bar + len(contexts[-1].candles) - 1)
    pooled = with_uncertainty(
        runs, samples, context, models=model_names, trials=trials.count, trials_source=trials.source
    )
    if is_mandate(context.config):
        pooled = with_mandate(pooled, np.concatenate([decision_sigmas(fold) for fold in contexts]), context)
    return pooled, context


def check_strategy_names(
    names: list[str], *, params: dict[str, dict[str, Any]], planted_edge: bool, mandate: bool = False
) -> None:
    """Refuse unknown baselines (in the request or in `backtest.params`), listing the valid names, the
    planted-edge baselines (the oracle) unless the data is generated with a planted edge (`planted_edge`), and
    the mandate's (best_constant and vol_forecast, which the backtest chooses on the train split) unless the
    env holds the volatility-target mandate (`mandate`)."""
    valid = ", ".join(ALL_STRATEGIES)
    for name in names:
        if name not in ALL_STRATEGIES:
            raise UsageError(f"unknown strategy '{name}': use one of {valid}")
        if name in PLANTED_EDGE_STRATEGIES and not planted_edge:
            raise UsageError(
                f"strategy '{name}' is the rule planted in synthetic data and needs data.source: synthetic "
                "(e.g. --config planted_edge); it does not exist for real candles"
            )
        if name in MANDATE_STRATEGIES and not mandate:
            raise UsageError(
                f"strategy '{name}' is chosen for the volatility-target mandate and needs env.mandate: "
                "vol_target (e.g. --config btc_voltarget)"
            )
    for name in params:
        if name not in ALL_STRATEGIES:
            raise ConfigError(f"backtest.params has unknown strategy '{name}': use one of {valid}")
        if name in MANDATE_STRATEGIES:
            raise ConfigError(f"backtest.params.{name}: it is chosen on the train split, not set")


def load_context(config: Config, *, span: str = "split") -> ReportContext:
    """Validated candles of `data` (file or generated), split by `data.split`; the bar length gives the
    annualisation. Span "all" evaluates every bar after the train split and its embargo instead of a split."""
    candles, _ = load_config_candles(config)
    splits = make_splits(candles, config.data.split)
    split = config.backtest.split
    evaluated = after_train(candles, splits, config.data.split.embargo_bars) if span == "all" else None
    bars = len(splits.get(split) if evaluated is None else evaluated)
    if bars < 2:
        where = f"the {split} split" if evaluated is None else "the span after the train split"
        raise DataError(f"{where} has {bars} bars: adjust data.split to backtest it")
    bars_per_year = SECONDS_PER_YEAR / timeframe_to_timedelta(candles.attrs["timeframe"]).total_seconds()
    if evaluated is not None:
        return ReportContext(config, splits, "all", bars_per_year, span=evaluated)
    return ReportContext(config=config, splits=splits, split=split, bars_per_year=bars_per_year)


def run_baseline(name: str, context: ReportContext) -> StrategyRun:
    """Backtest the registered baseline `name` with its `backtest.params`; seeded baselines average seeds.

    Under the volatility-target mandate, every baseline decides at the decision bars only (`decided_at`) and
    records the size it holds after each; vol_target and random_sizes default to the mandate's target and
    sizes, and best_constant holds the size chosen on the train split (`mandate_params`)."""
    params, note = context.config.backtest.params.get(name, {}), ""
    if is_mandate(context.config):
        defaults, note = mandate_params(name, context)
        params = {**defaults, **params}
    if name not in SEEDED_STRATEGIES:
        result = _simulate(name, params, context)
        metrics = _metrics(result, context)
        hits = _hits(result, context)
        return StrategyRun(name=name, equity=result.equity, trades=result.trades, metrics=metrics, hits=hits,
                           note=note, exposures=_exposures([result], context))
    first = context.config.seed
    seeds = range(first, first + context.config.backtest.random_seeds)
    results = {seed: _simulate(name, {**params, "seed": seed}, context) for seed in seeds}
    return _average_over_seeds(name, results, context)


def mandate_params(name: str, context: ReportContext) -> tuple[dict[str, Any], str]:
    """A baseline's parameters under the volatility-target mandate (before `backtest.params`), and a note on
    them: vol_target sizes for `rewards.vol_target` from `env.exposures` (traded at every change, its cap the
    largest size), random_sizes draws from those sizes, best_constant holds the size whose mean miss was lowest
    on the train split, and vol_forecast sizes from a forecast fitted there on the two volatilities
    `get_volatility` shows. Both read the train split's decisions, every `env.decision_every` bars from
    `env.warmup_bars` as in training."""
    sizes, target = list(context.config.env.exposures), context.config.rewards.vol_target
    if name == "vol_target":
        return {"target": target, "sizes": sizes, "max_leverage": max(sizes), "band": 0.0}, ""
    if name == "random_sizes":
        return {"sizes": sizes}, ""
    if name not in MANDATE_STRATEGIES:
        return {}, ""
    train = context.splits.train
    dates = f"{train.index[0]:%Y-%m-%d} to {train.index[-1]:%Y-%m-%d}"
    try:
        if name == "vol_forecast":
            return _vol_forecast_params(context, dates)
        return _best_constant_params(context, dates)
    except ValueError as exc:
        raise DataError(f"{name}: the train split ({len(train)} bars) is too short: {exc}") from exc


def _best_constant_params(context: ReportContext, dates: str) -> tuple[dict[str, Any], str]:
    env, target = context.config.env, context.config.rewards.vol_target
    size, misses = best_constant_exposure(context.splits.train, sizes=env.exposures, target_vol=target,
                                          every=env.decision_every, first=env.warmup_bars)
    shown = ", ".join(f"{level:g}: {miss:.3f}" for level, miss in misses.items())
    return {"size": size}, (f"holds {size:g} of equity, the size with the lowest mean mandate penalty on the "
                            f"train split ({dates}; {shown})")


def _vol_forecast_params(context: ReportContext, dates: str) -> tuple[dict[str, Any], str]:
    env, target = context.config.env, context.config.rewards.vol_target
    short, long = env.volatility_bars, LONG_FACTOR * env.volatility_bars
    fit = fit_vol_forecast(context.splits.train, every=env.decision_every, first=env.warmup_bars, short=short,
                           long=long)
    params = {"intercept": fit.intercept, "short_coef": fit.short_coef, "long_coef": fit.long_coef,
              "residual_var": fit.residual_var, "target": target, "sizes": list(env.exposures), "short": short,
              "long": long}
    note = (
        f"holds the size with the lowest expected penalty under the forecast log σ = {fit.intercept:.3f} + "
        f"{fit.short_coef:.3f} log σ_{short} + {fit.long_coef:.3f} log σ_{long} (residual sd "
        f"{math.sqrt(fit.residual_var):.3f}, R² {fit.r_squared:.2f}) fitted on the train split ({dates}; "
        f"{fit.decisions} decisions)"
    )
    return params, note


def _exposures(results: Sequence[BacktestResult], context: ReportContext) -> np.ndarray | None:
    """Under the mandate, each result's size at the decision bars: (D,) for one result, (seeds, D) for
    several."""
    if not is_mandate(context.config):
        return None
    sizes = np.stack([result.target.to_numpy()[context.decision_bars] for result in results])  # (S, D)
    return sizes[0] if len(results) == 1 else sizes


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
    start = (
        f"the first {where} with {env.warmup_bars} bars of history"
        if plan.first_bar < env.warmup_bars + plan.every else f"the first {where} of its walk-forward fold"
    )
    random_slippage = (
        f" The model's fills also pay the env's random slippage ({env.slippage_vol_frac:g} × recent "
        "volatility × |z|), which the rule baselines do not."
        if env.slippage_vol_frac > 0 else ""
    )
    return (
        f"greedy decoding; a decision every {plan.every} bars from bar {plan.first_bar} of the split (the "
        f"{first} UTC bar, {start}) to bar {plan.last_bar} "
        f"({last} UTC): {scope}. They are played as {len(plan.starts)} contiguous windows of {size} decisions in one "
        f"batch, window k with slippage seed {seed} + k. Each window starts flat with the initial cash; a "
        "position still open at a window's end is not closed but marked at that bar's close without exit fee "
        "or slippage (exit reason 'window end'), and the next window starts flat again. The equity curve "
        "compounds the windows' returns; later windows' units, fees and PnL are scaled to that compounded "
        f"equity.{random_slippage} The baselines are measured on the same bars (their signals see the "
        "split's earlier bars as history)."
    )


def _simulate(name: str, params: dict[str, Any], context: ReportContext) -> BacktestResult:
    """Targets of baseline `name` from the whole split, traded on the evaluated bars with the config's costs.

    Trading starts flat at the first evaluated bar; targets there may use earlier bars (indicator history).
    """
    env = context.config.env
    limit = max(1.0, env.max_position_frac)  # the largest position the backtest holds (above 1: on margin)
    try:
        if params.get("max_leverage", 0.0) > limit:
            raise ValueError(f"max_leverage {params['max_leverage']:g} is above the largest position held "
                             f"here, {limit:g} (env.max_position_frac)")
        target = make_targets(name, context.split_candles, **params).iloc[context.bars]
        if is_mandate(context.config):
            target = decided_at(target, context.decision_bars)
        return run_vectorized(
            context.candles, target, initial_cash=env.initial_cash, fee_bps=env.fee_bps,
            slippage_bps=env.slippage_bps, allow_short=env.allow_short, max_exposure=limit,
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


def _hits(result: BacktestResult, context: ReportContext) -> np.ndarray:
    """Per scored decision, whether the position held after its fill points the way the market moved."""
    bars, candles = context.decision_bars, context.candles
    moves = held_moves(
        candles["open"].to_numpy(), candles["close"].to_numpy(), bars, context.config.env.decision_every
    )
    return decision_hits(result.position.to_numpy()[bars + 1], moves)


def _average_over_seeds(name: str, results: dict[int, BacktestResult], context: ReportContext) -> StrategyRun:
    """One run from several seeds: mean metrics (NaN skipped), the mean equity curve, every seed's trades, and
    per decision the share of seeds that were right."""
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
        hits=np.mean([_hits(result, context) for result in results.values()], axis=0),
        exposures=_exposures(list(results.values()), context),
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
