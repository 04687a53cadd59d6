"""TradingEnv: a Gymnasium-style text environment where a language model trades one market through tools."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from r1trade.config import Config, EnvConfig, RewardsConfig
from r1trade.data.source import asset_configs, load_config_candles, source_key
from r1trade.data.splits import Splits, make_splits
from r1trade.env import rewards
from r1trade.env.market import MarketReplay
from r1trade.env.parsing import ParseError, parse_tool_call
from r1trade.env.portfolio import Fill, Portfolio
from r1trade.env.prompts import describe_fill, render_observation, render_summary, render_system_prompt
from r1trade.env.sentiment import load_sentiment_csv
from r1trade.env.tools import DexToolkit, MarketDataToolkit, Order, ToolRegistry
from r1trade.env.volatility import bars_per_year, realised_volatility
from r1trade.errors import ConfigError, DataError

Message = dict[str, str]
_RECENT_ACTIONS = 4
_SHOCK_BLOCK = 256


@dataclass
class _Episode:
    """Mutable state of one episode."""

    start: int
    decisions: int
    bar: int
    portfolio: Portfolio
    context: list[Message]
    turn_starts: list[int] = field(default_factory=list)  # context index of each assistant message
    decision: int = 0
    calls: int = 0
    valid_paid: bool = False
    looked: list[str] = field(default_factory=list)  # information tools called so far in this decision
    sharpe_mean: float = 0.0
    sharpe_mean_sq: float = 0.0
    equity_peak: float = 0.0  # highest equity mark so far (the drawdown penalty's state)
    deepest_drawdown: float = 0.0  # largest log(peak / equity) so far
    notional: deque[float] = field(default_factory=deque)  # order notional of the recent decisions
    actions: list[str] = field(default_factory=list)
    fills: list[Fill] = field(default_factory=list)
    marks: list[tuple[int, float]] = field(default_factory=list)  # (bar, equity at its close)
    direction_right: list[bool] = field(default_factory=list)  # per decision: position and next move agree
    move_signs: list[int] = field(default_factory=list)  # per decision: sign of the move it was held over
    done: bool = False


class TradingEnv:
    """A language model trades one market (long, short or flat) through tool calls, one decision at a time.

    ## Observation
    Chat messages. `reset` returns `[system, user]`: the system prompt (rules, the tool-call format with an
    example, every tool's signature) and the first observation — decision time, price, recent changes in %,
    the `observe_indicators`, the position and equity. Everything shown at decision bar t comes from bars
    0..t. `env.prompt: compact` states the same rules and signatures in under half the tokens, and leaves out
    of observations and fills what they repeat (`r1trade.env.prompts`).

    ## Actions
    The model's raw turn: free reasoning, then exactly one
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (strict JSON, schema-checked arguments).
    Information tools (`get_candles`, `get_indicators`, `get_sentiment`, `get_portfolio`; `get_changes` with
    `observation: price_only`, `get_volatility` with `volatility_tool`) answer and the decision continues.
    Trade tools (`place_order(side, size, stop_loss?, take_profit?, view)`, `close_position(view)`,
    `hold(view)`) end the decision. Under the volatility-target mandate `place_order(side: long, size, view)`
    takes one of `env.exposures` and sets no exits, and the system prompt states the target and the sizes.
    After `max_tool_calls` turns without a trade tool the env holds for the agent (forced hold, penalized). A
    malformed turn counts as a call and is answered with what was wrong.

    ## Transitions
    A trade decided at the close of bar t fills at the open of bar t+1, at open × (1 ± s) with a fee of
    fee_bps on the notional; s = slippage_bps / 1e4 + slippage_vol_frac × σ_t × |z|, z ~ N(0, 1) from the
    episode's seeded generator and σ_t the recent volatility of log-returns (the stochastic part of the MDP).
    `size` is the target fraction of equity to hold (same rules as `r1trade.backtest.engine`; with
    slippage_vol_frac = 0 the two give identical fills). Then the market moves `decision_every` bars;
    stop-loss and take-profit levels are checked on each bar's open (gaps fill at the open) and high/low (a
    bar touching both fills the stop first), and equity is marked at each close.

    ## Messages returned by `step`
    Normally the messages to append after the assistant turn: `[tool]` after an information call or a
    malformed turn, `[tool, user]` when a decision ended (the trade's result and fills, then the next
    observation), and `[tool]` on the final step. Bounded history: when a decision ends and the context holds
    more than `max_context_turns` assistant turns, `step` instead returns a complete new context with
    `info["context_reset"] = True`: `[system, user (compact state summary), <last history_turns turns in full,
    the turn just taken included>, ..., user (new observation)]`. It replaces the previous context; a rollout
    starts a new token segment from it.

    ## Rewards
    Each step's reward is Σ weight × raw component (weights in `RewardsConfig`); every component is reported
    in `info["reward_components"]` at every step, 0 when not applicable. Outcome: `pnl` (log-return of equity
    over the decision), `sharpe` (differential Sharpe), the risk penalties `variance` (the decision's squared
    log-return) and `drawdown` (how far it deepened the episode's maximum drawdown), `terminal` (episode
    log-return, optionally minus buy-and-hold's) and `bankruptcy`. Process: `valid_call` (first accepted call
    of a decision), `format`,
    `tool_error`, `forced_hold`, `pattern` (stated view vs the forward return over `pattern_horizon_bars`,
    known only after the fact and never shown), `risk_no_stop`, `risk_oversize`, `risk_turnover`. Under the
    volatility-target mandate (`env.mandate: vol_target`), `mandate`: ((w × σ − σ*) / σ*)² with w the long
    size held over the decision, σ the market's realised volatility over the bars it was held (ddof 1,
    annualised over a 365-day year, from bars after the decision bar only) and σ* `rewards.vol_target`; cash
    misses by 1 (`rewards.vol_target_miss`).

    ## Starting state
    Flat with `initial_cash`, at a uniformly drawn bar with at least `warmup_bars` of history and room for the
    whole episode; on generated data with a planted edge, a bar where one of its intervals ends
    (`MarketReplay.decision_grid`), so decisions see whole intervals. `reset(options={"start": bar,
    "decisions": n})` fixes both (backtests). With several markets (assets or bar lengths), an episode first
    draws its market, each as likely as the start bars it offers, so every window of every market is equally
    likely.

    ## Episode end
    Terminated when equity reaches zero or below (bankruptcy penalty); truncated after `episode_decisions`
    decisions. The terminal reward is paid on the last step either way.

    ## Arguments
    `candles`: canonical candles of one split, or a prebuilt `MarketReplay` (share one across many envs), or
    several prebuilt replays (one per market);
    `env_config`, `reward_config`: the `env:` and `rewards:` config sections; `sentiment`: an optional 0–100
    series (e.g. Fear & Greed, indexed by publication time); without one a market-derived proxy is used.
    """

    def __init__(
        self,
        candles: pd.DataFrame | MarketReplay | Sequence[MarketReplay],
        env_config: EnvConfig,
        reward_config: RewardsConfig,
        *,
        sentiment: pd.Series | None = None,
    ) -> None:
        if isinstance(candles, pd.DataFrame):
            markets = [MarketReplay.build(
                candles,
                indicators=env_config.indicators,
                volatility_bars=env_config.volatility_bars,
                sentiment=sentiment,
            )]
        else:
            markets = [candles] if isinstance(candles, MarketReplay) else list(candles)
            if sentiment is not None:
                raise ValueError("pass sentiment to MarketReplay.build, not with a prebuilt replay")
            if not markets:
                raise ValueError("no market replay given")
            for market in markets:
                missing = [name for name in env_config.indicators if name not in market.indicators]
                if missing:
                    raise ConfigError(f"the market replay lacks indicator(s) {', '.join(missing)}")
        self.markets = markets
        """Every market the env trades; an episode plays one of them (`reset`)."""
        self.replay = markets[0]
        self.env_config = env_config
        self.reward_config = reward_config
        self._weights = rewards.component_weights(reward_config)
        market_tools = MarketDataToolkit(
            indicators=env_config.indicators, max_candles=env_config.max_candles,
            changes=env_config.observation == "price_only", decision_every=env_config.decision_every,
            volatility=env_config.volatility_tool, volatility_bars=env_config.volatility_bars,
        ).tools()
        self.info_tools = frozenset(tool.name for tool in market_tools)
        """The tools that tell about the market (get_portfolio tells only what the observation shows)."""
        self.registry = ToolRegistry(
            [
                *market_tools,
                *DexToolkit(
                    allow_short=env_config.allow_short,
                    max_position_frac=env_config.max_position_frac,
                    max_leverage=env_config.max_leverage,
                    exposures=env_config.exposures if env_config.mandate == "vol_target" else None,
                ).tools(),
            ]
        )
        self.tool_schemas = self.registry.schemas()
        self._prompts = [
            render_system_prompt(
                self.registry, config=env_config, symbol=market.symbol, timeframe=market.timeframe,
                target_vol=reward_config.vol_target,
            )
            for market in markets
        ]
        self.system_prompt = self._prompts[0]
        self._rng = np.random.default_rng()
        self._normals: list[float] = []
        self._episode: _Episode | None = None

    @classmethod
    def from_config(cls, config: Config, split: str = "train") -> TradingEnv:
        """An env on one split of the configured data (each file's, with several); replays are built once and
        cached."""
        return cls(load_replays(config, split), config.env, config.rewards)

    # ------------------------------------------------------------------------------------ state for tools

    @property
    def bar(self) -> int:
        """The current decision bar (the agent has seen its close)."""
        return self._state.bar

    @property
    def portfolio(self) -> Portfolio:
        return self._state.portfolio

    @property
    def _state(self) -> _Episode:
        if self._episode is None:
            raise RuntimeError("call reset() first")
        return self._episode

    @property
    def calls_made(self) -> int:
        """Tool calls (including malformed turns) used in the current decision."""
        return self._state.calls

    @property
    def messages(self) -> list[Message]:
        """The current context (what the model sees before its next turn)."""
        return list(self._state.context)

    @property
    def fills(self) -> list[Fill]:
        """Every fill of the episode so far."""
        return list(self._state.fills)

    def equity_curve(self) -> pd.Series:
        """Equity at the close of every bar of the episode so far, from the first decision bar."""
        bars, values = zip(*self._state.marks, strict=True)
        return pd.Series(values, index=self.replay.index[list(bars)], name="equity")

    def max_decisions(self, start: int) -> int:
        """How many decisions fit between `start` and the last bar."""
        return max((len(self.replay) - 1 - start) // self.env_config.decision_every, 0)

    # ------------------------------------------------------------------------------------ gym API

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[Message], dict]:
        """Start an episode; returns `[system, first observation]` and info (start bar, equity, ...).

        `seed` reseeds the generator behind the start bar and the slippage (None continues it). `options`:
        `start` (bar index of the first decision) and `decisions` (episode length; `max_decisions(start)`
        runs to the end of the split, as a backtest does). With several markets, a drawn episode first draws
        its market (`_draw_market`) and a given `start` is a bar of the first market.
        """
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._normals = []
        options = options or {}
        cfg = self.env_config
        start = options.get("start")
        decisions = int(options.get("decisions", cfg.episode_decisions))
        self._use_market(0 if start is not None else self._draw_market(decisions))
        if start is None:
            latest = len(self.replay) - 1 - decisions * cfg.decision_every
            if latest < cfg.warmup_bars:
                raise DataError(
                    f"{len(self.replay)} bars cannot hold {cfg.warmup_bars} warm-up bars and {decisions} "
                    f"decisions every {cfg.decision_every} bars: use a longer split or a shorter episode"
                )
            start = self._draw_start(cfg.warmup_bars, latest)
        start = int(start)
        if decisions < 1 or not 0 <= start or decisions > self.max_decisions(start):
            raise ValueError(
                f"start {start} with {decisions} decisions does not fit in {len(self.replay)} bars"
            )
        portfolio = Portfolio(initial_cash=cfg.initial_cash, fee_rate=cfg.fee_bps / 1e4)
        episode = _Episode(
            start=start, decisions=decisions, bar=start, portfolio=portfolio, context=[],
            notional=deque(maxlen=self.reward_config.turnover_window),
        )
        episode.marks.append((start, cfg.initial_cash))
        episode.equity_peak = cfg.initial_cash
        self._episode = episode
        episode.context = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self._observation()},
        ]
        info = {
            "decision_index": 0,
            "start_bar": start,
            "start_time": self.replay.index[start].isoformat(),
            "decisions": decisions,
            "equity": cfg.initial_cash,
            "position": 0.0,
            "context_reset": False,
        }
        return list(episode.context), info

    def _draw_market(self, decisions: int) -> int:
        """The market of a drawn episode: each with probability proportional to the first bars it offers such
        an episode, so that every window of every market is equally likely (no draw with a single market)."""
        if len(self.markets) == 1:
            return 0
        span = self.env_config.warmup_bars + decisions * self.env_config.decision_every
        room = np.array([max(len(market) - span, 0) for market in self.markets], dtype=float)
        if room.sum() == 0:  # none fits: the first market's reset says why
            return 0
        return int(self._rng.choice(len(self.markets), p=room / room.sum()))

    def _use_market(self, index: int) -> None:
        """Trade `markets[index]` from now on, with its system prompt (its symbol and bar length)."""
        self.replay, self.system_prompt = self.markets[index], self._prompts[index]

    def _draw_start(self, earliest: int, latest: int) -> int:
        """A uniformly drawn first decision bar; on data with a planted edge, one where an interval ends."""
        grid = self.replay.decision_grid
        if grid is None or grid.next_on_grid(earliest) > latest:  # (no interval end fits: any bar will do)
            return int(self._rng.integers(earliest, latest + 1))
        first = grid.next_on_grid(earliest)
        return first + grid.every * int(self._rng.integers(0, (latest - first) // grid.every + 1))

    def step(self, text: str) -> tuple[list[Message], float, bool, bool, dict]:
        """Apply one model turn: (messages, reward, terminated, truncated, info). See the class docstring."""
        episode = self._state
        if episode.done:
            raise RuntimeError("the episode is over: call reset()")
        cfg = self.env_config
        raw = rewards.zero_components()
        decision = episode.decision
        episode.calls += 1
        parsed = parse_tool_call(text, self.registry.parameters)
        order: Order | None = None
        tool_error = None
        if isinstance(parsed, ParseError):
            raw["format"] = 1.0
            reply = f"Error: {parsed.message}"
        else:
            result = self.registry[parsed.name].handler(parsed.arguments, self)
            if result.error:
                raw["tool_error"] = 1.0
                tool_error = result.text
                reply = f"Error: {result.text}"
            else:
                raw["valid_call"] = 0.0 if episode.valid_paid else 1.0
                episode.valid_paid = True
                reply, order = result.text, result.order
                if parsed.name in self.info_tools:
                    episode.looked.append(parsed.name)
        forced = order is None and episode.calls >= cfg.max_tool_calls
        if forced:
            raw["forced_hold"] = 1.0
            reply += f"\nNo trade after {cfg.max_tool_calls} tool calls: forced hold."
            order = Order("hold", None)
        fills: list[Fill] = []
        bankrupt = False
        looked: list[str] | None = None
        if order is None:
            left = cfg.max_tool_calls - episode.calls
            reply += f"\n({left} tool call{'s' if left != 1 else ''} left)"
        else:
            looked, episode.looked = episode.looked, []
            raw["info_call"] = 1.0 if looked and not forced else 0.0  # a trade that looked first, never a stall
            fills, bankrupt = self._execute(order, raw)
            compact = cfg.prompt == "compact"
            reply += "".join(f"\n{describe_fill(fill, self.replay, compact=compact)}" for fill in fills)
        terminated = bankrupt
        truncated = not bankrupt and episode.decision >= episode.decisions
        episode.done = terminated or truncated
        if episode.done:
            reply += "\n" + self._closing_line(bankrupt)
        messages: list[Message] = [{"role": "tool", "content": reply}]
        if order is not None and not episode.done:
            messages.append({"role": "user", "content": self._observation()})
        context_reset = self._extend_context(text, messages, decision_done=order is not None)
        if context_reset:
            messages = list(episode.context)
        components = rewards.weigh(raw, self._weights)
        price = self.replay.close[episode.bar]
        info: dict[str, Any] = {
            "reward_components": components,
            "action": None if isinstance(parsed, ParseError) else {
                "name": parsed.name, "arguments": parsed.arguments
            },
            "parse_error": parsed.message if isinstance(parsed, ParseError) else None,
            "error_kind": parsed.kind if isinstance(parsed, ParseError) else None,
            "tool_error": tool_error,
            "order": None if order is None else _order_record(order),
            "forced_hold": forced,
            "fills": [self._fill_record(fill) for fill in fills],
            "equity": episode.portfolio.equity(price),
            "position": episode.portfolio.units,
            "exposure": episode.portfolio.exposure(price),
            "bar": episode.bar,
            "decision_index": decision,
            "decision_done": order is not None,
            # the information tools called before this decision's trade, in order (on the trade's turn only)
            "info_tools": looked,
            # the information tools this env offers (on the trade's turn only): reports list each, 0 % included
            "info_tools_offered": None if looked is None else sorted(self.info_tools),
            # as the backtest's Direction Accuracy counts it: long or short the way the market then moved
            "direction_right": episode.direction_right[-1] if order is not None else None,
            "move_sign": episode.move_signs[-1] if order is not None else None,  # +1 up, -1 down, 0 unchanged
            "context_reset": context_reset,
        }
        if episode.done:
            info["episode"] = self._episode_stats(bankrupt)
        return messages, sum(components.values()), terminated, truncated, info

    # ------------------------------------------------------------------------------------ market

    def _execute(self, order: Order, raw: dict[str, float]) -> tuple[list[Fill], bool]:
        """Score the order's intent, fill it at the next open, walk `decision_every` bars, score outcomes."""
        episode, replay = self._state, self.replay
        portfolio = episode.portfolio
        equity_before = portfolio.equity(replay.close[episode.bar])
        self._score_intent(order, raw)
        held = order.target if order.target is not None else portfolio.target  # the position after the fill
        t, marked = episode.bar, len(episode.marks)
        fills, bankrupt = self._walk_market(order)
        move = replay.close[episode.bar] - replay.open[t + 1]  # over the interval the position is held
        episode.direction_right.append(bool(np.sign(held) * np.sign(move) > 0))  # flat counts as wrong
        episode.move_signs.append(int(np.sign(move)))
        equity_after = portfolio.equity(replay.close[episode.bar])
        marks = [equity for _, equity in episode.marks[marked:]]  # this decision's bar closes
        self._score_outcome(raw, fills, marks, equity_before=equity_before, equity_after=equity_after)
        if self.env_config.mandate == "vol_target":
            raw["mandate"] = self._mandate_miss(held, first=t, last=episode.bar)
        episode.fills += fills
        episode.actions.append(f"#{episode.decision + 1} {_describe_order(order)}")
        episode.decision += 1
        episode.calls = 0
        episode.valid_paid = False
        if bankrupt or episode.decision >= episode.decisions:
            raw["terminal"] = rewards.terminal_return(
                initial_equity=portfolio.initial_cash,
                final_equity=equity_after,
                start_price=replay.close[episode.start],
                end_price=replay.close[episode.bar],
                vs_buy_and_hold=self.reward_config.terminal_baseline == "buy_and_hold",
            )
            raw["bankruptcy"] = 1.0 if bankrupt else 0.0
        return fills, bankrupt

    def _score_intent(self, order: Order, raw: dict[str, float]) -> None:
        """Pattern and risk-rule components, known when the order is given (the pattern from later bars)."""
        rc, portfolio, t = self.reward_config, self._state.portfolio, self._state.bar
        if order.view is not None:
            forward = self.replay.forward_return(t, rc.pattern_horizon_bars)
            raw["pattern"] = rewards.pattern_score(order.view, forward, threshold=rc.pattern_threshold)
        if order.action == "place_order" and order.target is not None:
            raw["risk_no_stop"] = rewards.opened_without_stop(
                old_target=portfolio.target, new_target=order.target, stop_loss_pct=order.stop_loss_pct
            )
            raw["risk_oversize"] = rewards.oversized(
                requested_size=order.requested_size, limit=self.env_config.max_position_frac
            )

    def _walk_market(self, order: Order) -> tuple[list[Fill], bool]:
        """Fill at the next open, then per bar stop/take checks and a mark at the close: (fills, bankrupt)."""
        episode, replay, every = self._state, self.replay, self.env_config.decision_every
        portfolio, t = episode.portfolio, episode.bar
        shocks = self._shocks(every)
        fills: list[Fill] = []
        if order.target is not None:
            fill = portfolio.rebalance(order.target, bar=t + 1, open_price=replay.open[t + 1],
                                       slippage=self._slip(t, shocks[0]))
            if fill is not None:
                fills.append(fill)
        if order.action == "place_order":
            portfolio.set_exits(stop_loss_pct=order.stop_loss_pct, take_profit_pct=order.take_profit_pct)
        for step in range(1, every + 1):
            j = t + step
            if portfolio.stop_price is not None or portfolio.take_price is not None:
                exit_fill = portfolio.check_exits(bar=j, open_price=replay.open[j], high=replay.high[j],
                                                  low=replay.low[j], slippage=self._slip(j - 1, shocks[step]))
                if exit_fill is not None:
                    fills.append(exit_fill)
            equity = portfolio.equity(replay.close[j])
            episode.marks.append((j, equity))
            episode.bar = j
            if equity <= 0.0:
                return fills, True
        return fills, False

    def _score_outcome(
        self, raw: dict[str, float], fills: list[Fill], marks: list[float], *, equity_before: float,
        equity_after: float,
    ) -> None:
        """PnL, differential Sharpe, risk (variance, drawdown) and turnover components of the decision just
        walked; `marks`: the equity at each of its bars' closes."""
        episode, rc = self._state, self.reward_config
        raw["pnl"] = rewards.log_return(equity_before=equity_before, equity_after=equity_after)
        raw["variance"] = rewards.squared_return(raw["pnl"])
        raw["drawdown"], episode.equity_peak, episode.deepest_drawdown = rewards.drawdown_step(
            marks, peak=episode.equity_peak, deepest=episode.deepest_drawdown
        )
        raw["sharpe"], episode.sharpe_mean, episode.sharpe_mean_sq = rewards.differential_sharpe(
            equity_after / equity_before - 1.0, mean=episode.sharpe_mean, mean_sq=episode.sharpe_mean_sq,
            eta=rc.sharpe_eta,
        )
        episode.notional.append(sum(fill.notional for fill in fills if fill.reason == "order"))
        raw["risk_turnover"] = rewards.turnover_violation(
            recent_notional=episode.notional, equity=equity_after, limit=rc.max_turnover
        )

    def _mandate_miss(self, exposure: float, *, first: int, last: int) -> float:
        """The volatility mandate's raw penalty of the decision taken at bar `first` and held to bar `last`:
        its size against the market's annualised volatility over bars first + 1 .. last, which the agent never
        saw. An interval cut short by ruin before two returns counts as cash's miss, 1."""
        if last - first < 2:
            return 1.0
        per_bar = realised_volatility(self.replay.close, last, last - first)
        return rewards.vol_target_miss(
            exposure=exposure, realised_vol=per_bar * math.sqrt(bars_per_year(self.replay.timeframe)),
            target_vol=self.reward_config.vol_target,
        )

    def _shocks(self, bars: int) -> list[float]:
        """|z| for the decision's order and each bar's possible stop fill (zeros without random slippage).

        Drawn from the episode's generator in blocks: one numpy call per decision would cost more than the
        rest of the step.
        """
        if self.env_config.slippage_vol_frac == 0.0:
            return [0.0] * (bars + 1)
        if len(self._normals) < bars + 1:
            self._normals = np.abs(self._rng.standard_normal(max(_SHOCK_BLOCK, bars + 1))).tolist()
        shocks, self._normals = self._normals[: bars + 1], self._normals[bars + 1 :]
        return shocks

    def _slip(self, known_bar: int, shock: float) -> float:
        """Slippage fraction of a fill whose latest known close is `known_bar`'s."""
        cfg = self.env_config
        return cfg.slippage_bps / 1e4 + cfg.slippage_vol_frac * self.replay.volatility[known_bar] * shock

    # ------------------------------------------------------------------------------------ text and context

    def _observation(self) -> str:
        episode = self._state
        return render_observation(
            self.replay, episode.portfolio, bar=episode.bar, decision=episode.decision,
            decisions=episode.decisions, config=self.env_config,
        )

    def _extend_context(self, text: str, messages: list[Message], *, decision_done: bool) -> bool:
        """Append the turn to the context; rebuild it compactly once it is too long (True if rebuilt)."""
        episode, cfg = self._state, self.env_config
        episode.turn_starts.append(len(episode.context))
        episode.context.append({"role": "assistant", "content": _printable(text)})
        episode.context += messages
        if not decision_done or episode.done or len(episode.turn_starts) <= cfg.max_context_turns:
            return False
        kept = episode.context[episode.turn_starts[-cfg.history_turns]:]
        summary = render_summary(
            episode.portfolio,
            price=self.replay.close[episode.bar],
            decision=episode.decision,
            decisions=episode.decisions,
            fills=len(episode.fills),
            recent_actions=episode.actions[-_RECENT_ACTIONS:],
        )
        episode.context = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": summary},
            *kept,
        ]
        episode.turn_starts = [i for i, m in enumerate(episode.context) if m["role"] == "assistant"]
        return True

    def _closing_line(self, bankrupt: bool) -> str:
        stats = self._episode_stats(bankrupt)
        if bankrupt:
            return f"Equity reached {stats['final_equity']:.2f}: bankrupt, episode over."
        return (
            f"Episode over after {stats['decisions']} decisions: equity {stats['final_equity']:.2f} "
            f"({stats['return_pct']:+.2f}%), buy and hold {stats['buy_and_hold_pct']:+.2f}%."
        )

    def _episode_stats(self, bankrupt: bool) -> dict[str, Any]:
        episode, replay = self._state, self.replay
        final = episode.portfolio.equity(replay.close[episode.bar])
        return {
            "decisions": episode.decision,
            "final_equity": final,
            "return_pct": (final / episode.portfolio.initial_cash - 1.0) * 100.0,
            "buy_and_hold_pct": (replay.close[episode.bar] / replay.close[episode.start] - 1.0) * 100.0,
            "fees": episode.portfolio.fees_paid,
            "fills": len(episode.fills),
            "turnover": episode.portfolio.traded_notional / episode.portfolio.initial_cash,
            "bankrupt": bankrupt,
        }

    def _fill_record(self, fill: Fill) -> dict[str, Any]:
        return {
            "bar": fill.bar,
            "time": self.replay.bar_labels[fill.bar],
            "side": fill.side,
            "units": fill.units,
            "price": fill.price,
            "fee": fill.fee,
            "reason": fill.reason,
            "realized_pnl": fill.realized_pnl,
        }


def _order_record(order: Order) -> dict[str, Any]:
    return {
        "action": order.action,
        "view": order.view,
        "target": order.target,
        "requested_size": order.requested_size,
        "clipped": order.clipped,
        "stop_loss_pct": order.stop_loss_pct,
        "take_profit_pct": order.take_profit_pct,
    }


def _describe_order(order: Order) -> str:
    view = f" ({order.view})" if order.view else " (forced)"
    if order.action == "place_order" and order.target is not None:
        side = "long" if order.target > 0 else "short"
        return f"{side} {abs(order.target):g}{view}"
    return f"{order.action.replace('_', ' ')}{view}"


def _printable(text: str) -> str:
    """`text` as valid UTF-8 (lone surrogates replaced), so a tokenizer can always encode the context."""
    return text.encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------------------------------- replay cache

_REPLAYS: dict[tuple, MarketReplay] = {}
_MAX_CACHED = 8
"""Replays kept: one per asset and split, so that a run on several assets rebuilds none between updates."""


def load_replay(config: Config, split: str = "train", splits: Splits | None = None) -> MarketReplay:
    """The market replay of one split of the configured candle file (or generated data), built once per
    data/split/features, cached; a config with several files (`data.paths`) needs `load_replays`. `splits`: the
    file's splits where the caller has loaded them already."""
    sentiment_path = Path(config.data.sentiment_path) if config.data.sentiment_path else None
    key = (
        *source_key(config),
        config.data.split.model_dump_json(),
        split,
        tuple(config.env.indicators),
        config.env.volatility_bars,
        str(sentiment_path),
    )
    if key not in _REPLAYS:
        if splits is None:
            candles, _ = load_config_candles(config)
            splits = make_splits(candles, config.data.split)
        part = splits.get(split)
        sentiment = load_sentiment_csv(sentiment_path) if sentiment_path else None
        if len(_REPLAYS) >= _MAX_CACHED:
            _REPLAYS.pop(next(iter(_REPLAYS)))
        _REPLAYS[key] = MarketReplay.build(
            part,
            indicators=config.env.indicators,
            volatility_bars=config.env.volatility_bars,
            sentiment=sentiment,
        )
    return _REPLAYS[key]


def load_replays(config: Config, split: str = "train", splits: list[Splits] | None = None) -> list[MarketReplay]:
    """The market replay of one split of each of the configured candle files (`asset_configs`), each split on
    its own by `data.split`; `splits`: theirs (`load_config_splits`) where the caller has loaded them already."""
    assets = asset_configs(config)
    given = splits if splits is not None else [None] * len(assets)
    return [load_replay(asset, split, parts) for asset, parts in zip(assets, given, strict=True)]


def make_envs(
    config: Config, count: int, split: str = "train", splits: list[Splits] | None = None
) -> list[TradingEnv]:
    """`count` envs sharing the market replays (what a batched rollout uses); with several candle files each
    episode draws its market. `splits`: as for `load_replays`."""
    replays = load_replays(config, split, splits)
    return [TradingEnv(replays, config.env, config.rewards) for _ in range(count)]


class FixedStart:
    """A TradingEnv that always resets to bar `start` for `decisions` decisions: a batched player (the rollout
    engine) passes only seeds, while a backtest window or a probe point has its own first bar."""

    def __init__(self, env: TradingEnv, start: int, decisions: int) -> None:
        self.env, self.start, self.decisions = env, start, decisions

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[Message], dict]:
        return self.env.reset(seed, options={"start": self.start, "decisions": self.decisions})

    def step(self, text: str) -> tuple[list[Message], float, bool, bool, dict]:
        return self.env.step(text)
