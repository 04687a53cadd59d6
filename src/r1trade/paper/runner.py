"""`r1trade paper`: a trained checkpoint trades closed candles as they come, on paper, into a journal.

The protocol is the backtest's (`r1trade.backtest.model_runs`), bar by bar:
- A decision comes every `env.decision_every` candles of the journal, the first at the candle with
  `env.warmup_bars` candles before it (the latest closed candle when a journal starts).
- Decisions are played in episodes of `env.episode_decisions`, as in training and in the backtest's windows:
  episode k is one TradingEnv episode seeded `seed + k` (the seed drives the random slippage) that starts
  flat with `env.initial_cash`; a position still open at its end is marked at that close and dropped, and
  the next episode starts flat. The account's equity compounds the episodes' returns.
- At a decision bar the agent decodes greedily in that env, with the backtest's tools and fill rules (the
  next bar's open, fees, slippage), and sees the candles up to that bar only: the env's market is rebuilt
  from the journal's candles up to it, then placeholder bars (its close repeated) that give the env room to
  take the order; nothing after the decision bar is ever shown, and what the order fills against the
  placeholders is thrown away.
- The decision settles once the `decision_every` bars it is held over have closed: its episode is replayed
  from the journal (the same candles, turns and seed give the same fills) through that decision, and the
  decision, its turns and fills and the equity of its bars commit in one transaction. A restart resumes the
  same way, so it takes no decision twice, loses none and ends where an uninterrupted run over the same
  candles ends. A decision taken but not settled yet waits in the journal, so it is not asked again.
- Missing candles since the previous decision bar (a gap): with `on_gap="tell"` the decision is taken and
  its observation ends with a note naming them; with `"skip"` it is not taken, the episode ends there and
  the account stays flat until the next decision bar.

No order ever reaches an exchange: the env simulates the fills, and the exchange feed reads no API key.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pandas as pd

from r1trade.config import Config, load_config
from r1trade.env.market import MarketReplay
from r1trade.env.trading_env import TradingEnv
from r1trade.errors import UsageError
from r1trade.paper.feed import Batch, Feed, step_ms
from r1trade.paper.journal import DECIDED, SKIPPED, Journal, Mark, Pending, Settled, TurnRecord
from r1trade.paper.view import LiveView, Status, bar_time, describe_action, reasoning_of

if TYPE_CHECKING:
    from r1trade.backtest.model_runs import Player

GapPolicy = Literal["tell", "skip"]


@dataclass(frozen=True)
class PaperOutcome:
    """How a paper run ended and what the journal now holds."""

    journal: Path
    reason: str
    decisions: int
    skipped: int
    equity: float
    initial_cash: float
    events: dict[str, int]

    @property
    def return_pct(self) -> float:
        return 100.0 * (self.equity / self.initial_cash - 1.0)


class PaperTrader:
    """Drives one paper run: closed candles in from `feed`, the `player`'s decisions out, all into the
    journal."""

    def __init__(
        self,
        journal: Journal,
        config: Config,
        player: Player,
        feed: Feed,
        *,
        max_decisions: int | None = None,
        on_gap: GapPolicy = "tell",
        view: LiveView | None = None,
    ) -> None:
        self.journal, self.config, self.player, self.feed = journal, config, player, feed
        self.max_decisions, self.on_gap, self.view = max_decisions, on_gap, view
        self.every, self.length = config.env.decision_every, config.env.episode_decisions
        self.initial = config.env.initial_cash
        self.step = step_ms(feed.timeframe)
        self._exposure = 0.0
        self._last: tuple[int, str, str] | None = None  # the latest decision: time, action, reasoning

    def run(self) -> str:
        """Trade until `max_decisions` decisions have settled, the feed ends or the account is ruined; returns
        why it stopped. Ctrl-C stops it at once: the journal holds everything settled or decided."""
        journal = self.journal
        journal.log("start", {"decisions": journal.decision_count(), "candles": len(journal.candles)})
        try:
            if not self.journal.candles:
                self._add(self.feed.history(self.config.env.warmup_bars + 1))
            self._advance()
            reason = self._stop_reason()
            while reason is None:
                batch = self.feed.after(self.journal.candles[-1].ts)
                if batch is None:
                    reason = "the replay ended"
                    break
                self._add(batch)
                self._advance()
                reason = self._stop_reason()
        except KeyboardInterrupt:
            self.journal.log("stop", {"reason": "interrupted"})
            raise
        self.journal.log("stop", {"reason": reason})
        self._show()
        return reason

    # ------------------------------------------------------------------------------------------ the loop

    def _add(self, batch: Batch) -> None:
        self.journal.add_candles(batch, step_ms=self.step)
        self._show()

    def _stop_reason(self) -> str | None:
        equity = self.journal.last_equity()
        if equity is not None and equity <= 0.0:
            return "the account is ruined"
        if self.max_decisions is not None and self.journal.decision_count() >= self.max_decisions:
            return f"{self.max_decisions} decisions taken (--max-decisions)"
        return None

    def _advance(self) -> None:
        """Settle and take every decision the journal's candles allow, in order."""
        while True:
            pending = self.journal.pending()
            q = self._next_position(pending)
            if q >= len(self.journal.candles) or (pending is None and self._stop_reason() is not None):
                return
            market = self._market(q)
            if pending is not None:
                self._settle(pending, market, q)
                if self._stop_reason() is not None:
                    return
            self._decide(q, market)

    def _next_position(self, pending: Pending | None) -> int:
        """The next decision bar: `decision_every` after the latest decision, the first after the warm-up."""
        if pending is not None:
            return pending.position + self.every
        last = self.journal.last_decision()
        return self.config.env.warmup_bars if last is None else last[0] + self.every

    def _market(self, q: int) -> MarketReplay:
        """The journal's candles up to bar q, then placeholder bars (q's close repeated), room for an
        episode."""
        real = self.journal.candles[: q + 1]
        last = real[-1]
        filler = [(last.ts + k * self.step, last.close, last.close, last.close, last.close, last.volume)
                  for k in range(1, self.length * self.every + 1)]
        rows = [(c.ts, c.open, c.high, c.low, c.close, c.volume) for c in real] + filler
        frame = pd.DataFrame(rows, columns=["ts", "open", "high", "low", "close", "volume"])
        frame.index = pd.DatetimeIndex(pd.to_datetime(frame.pop("ts"), unit="ms", utc=True), name="timestamp")
        frame.attrs.update(symbol=self.feed.symbol, timeframe=self.feed.timeframe, source=self.feed.source)
        env = self.config.env
        return MarketReplay.build(frame, indicators=env.indicators, volatility_bars=env.volatility_bars)

    # ------------------------------------------------------------------------------------------ settling

    def _settle(self, pending: Pending, market: MarketReplay, q: int) -> None:
        """Commit `pending` now that its bars up to q have closed."""
        if pending.status == SKIPPED:
            level = self._equity_at(pending.position)
            marks = [Mark(bar, None, None, level) for bar in range(pending.position + 1, q + 1)]
            self.journal.settle(Settled(pending, [], None, marks), initial_equity=self.initial)
            self._exposure = 0.0
            return
        assert pending.episode is not None
        start = pending.position if pending.step == 0 else self.journal.episode_start(pending.episode)
        earlier = self.journal.episode_turns(pending.episode)
        env, records, over = self._replay_episode(market, pending.episode, start, [*earlier, pending.turns])
        curve = env.equity_curve().to_numpy()
        level = self._equity_at(start)
        own = {bar: float(curve[bar - start]) for bar in range(pending.position + 1, start + len(curve))}
        marks = [Mark(bar, pending.episode, own[bar], level * own[bar] / self.initial) for bar in own]
        final = records[-1].info
        action = {**final["order"], "forced_hold": final["forced_hold"]}
        self.journal.settle(Settled(pending, records, action, marks), initial_equity=self.initial)
        self._exposure = 0.0 if over else env.portfolio.exposure(market.close[q])

    def _replay_episode(
        self, market: MarketReplay, episode: int, start: int, decisions: Sequence[Sequence[str]]
    ) -> tuple[TradingEnv, list[TurnRecord], bool]:
        """Episode `episode` from bar `start` with its decisions' turns stepped again: the env after them, the
        last decision's turns as the env answered them, and whether the episode is over."""
        env = TradingEnv(market, self.config.env, self.config.rewards)
        env.reset(seed=self.config.seed + episode, options={"start": start, "decisions": self.length})
        records: list[TurnRecord] = []
        over = False
        for texts in decisions:
            records = []
            for number, text in enumerate(texts):
                if over:
                    raise self._inconsistent(episode)
                messages, _, terminated, truncated, info = env.step(text)
                records.append(TurnRecord(text, _tool_reply(messages), info))
                over = terminated or truncated
                if info["decision_done"] != (number == len(texts) - 1):
                    raise self._inconsistent(episode)
        return env, records, over

    def _inconsistent(self, episode: int) -> UsageError:
        return UsageError(
            f"journal '{self.journal.path}': the turns of episode {episode} no longer replay as recorded "
            "(written by another r1trade version?); continue in a new journal"
        )

    def _equity_at(self, position: int) -> float:
        equity = self.journal.equity_at(position)
        return self.initial if equity is None else equity

    # ------------------------------------------------------------------------------------------ deciding

    def _decide(self, q: int, market: MarketReplay) -> None:
        """Take the decision at bar q (or skip it over a gap) and keep it in the journal until it settles."""
        ts, when = self.journal.candles[q].ts, bar_time(self.journal.candles[q].ts + self.step)
        note = self._gap_note(q)
        if note is not None and self.on_gap == "skip":
            self.journal.put_pending(Pending(ts, q, None, None, SKIPPED, None, note, [], _now()))
            self._last = (ts + self.step, "skipped", note)
            self._show(f"{when} skipped: {note}")
            return
        env, episode, step = self._episode_at(market, q)
        observation = env.messages[-1]["content"] + (f"\n{note}" if note else "")
        (trajectory,) = self.player.run([_AtDecision(env, note)], [None])
        last = trajectory.turns[-1].info if trajectory.turns else {}
        if not last.get("decision_done"):
            raise RuntimeError("the player stopped before its decision ended")
        texts = [turn.text for turn in trajectory.turns]
        self.journal.put_pending(Pending(ts, q, episode, step, DECIDED, observation, note, texts, _now()))
        action = describe_action(last["order"], forced=last["forced_hold"])
        reasoning = reasoning_of(texts[-1])
        self._last = (ts + self.step, action, reasoning)
        self._show(f"{when} {action}: {reasoning}")

    def _episode_at(self, market: MarketReplay, q: int) -> tuple[TradingEnv, int, int]:
        """The env for a decision at bar q, with its episode and step: the latest decision's episode replayed
        from the journal if it goes on, else a new episode from q."""
        last = self.journal.last_decision()
        if last is not None and last[3] == DECIDED and last[2] < self.length - 1:
            _, episode, step, _ = last
            start = self.journal.episode_start(episode)
            env, _, over = self._replay_episode(market, episode, start, self.journal.episode_turns(episode))
            if not over:
                return env, episode, step + 1
        latest = self.journal.last_episode()
        episode = 0 if latest is None else latest + 1
        env = TradingEnv(market, self.config.env, self.config.rewards)
        env.reset(seed=self.config.seed + episode, options={"start": q, "decisions": self.length})
        return env, episode, 0

    def _gap_note(self, q: int) -> str | None:
        """The candles missing since the previous decision bar, as a line for the observation (None: none)."""
        candles = self.journal.candles
        missing = [
            (candles[i - 1].ts, (candles[i].ts - candles[i - 1].ts) // self.step - 1)
            for i in range(max(q - self.every + 1, 1), q + 1)
            if candles[i].ts - candles[i - 1].ts > self.step
        ]
        if not missing:
            return None
        parts = ", ".join(f"{count} after the {bar_time(after)} bar" for after, count in missing)
        total = sum(count for _, count in missing)
        plural = "s" if total > 1 else ""
        return f"Note: {total} candle{plural} missing from the exchange ({parts} UTC); the changes span them."

    # ------------------------------------------------------------------------------------------ the view

    def _show(self, line: str | None = None) -> None:
        if self.view is None:
            return
        candles = self.journal.candles
        upcoming = self._next_position(self.journal.pending())
        next_close = None
        if candles and upcoming >= len(candles) - 1:  # when the next decision bar closes, if no gap comes
            next_close = candles[-1].ts + (upcoming - len(candles) + 2) * self.step
        equity = self.journal.last_equity()
        status = Status(
            market=f"{self.feed.symbol} {self.feed.timeframe} ({self.feed.source})",
            equity=self.initial if equity is None else equity,
            initial_cash=self.initial,
            exposure=self._exposure,
            decisions=self.journal.decision_count(),
            skipped=self.journal.decision_count(SKIPPED),
            max_decisions=self.max_decisions,
            every=self.every,
            last=self._last,
            next_close=next_close,
            now=self.feed.now(),
            rate=self.feed.rate,
        )
        self.view.update(status, line=line)


class _AtDecision:
    """The env at a decision bar as a player sees an episode: `reset` gives the context so far (with the gap
    note, if any), and the episode ends, for the player, when the decision does."""

    def __init__(self, env: TradingEnv, note: str | None) -> None:
        self.env, self.note = env, note

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        messages = self.env.messages
        if self.note:
            messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}\n{self.note}"}
        return messages, {}

    def step(self, text: str) -> tuple[list[dict], float, bool, bool, dict]:
        messages, reward, terminated, truncated, info = self.env.step(text)
        return messages, reward, terminated, truncated or info["decision_done"], info


def _tool_reply(messages: list[dict]) -> str:
    """The env's answer to a turn: the last tool message `step` returned (a fresh context holds it too)."""
    return next(message["content"] for message in reversed(messages) if message["role"] == "tool")


def _now() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------- the command


def checkpoint_identity(checkpoint: Path) -> str:
    """A hash of the checkpoint's policy weights and config: a journal continues only with the same ones."""
    digest = hashlib.sha256()
    files = sorted(path for path in (checkpoint / "policy").rglob("*") if path.is_file())
    for path in [*files, checkpoint / "config.yaml"]:
        digest.update(str(path.relative_to(checkpoint)).encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def paper_trade(
    checkpoint: Path,
    journal_path: Path,
    *,
    feed_factory: Callable[[Callable[[str], None]], Feed],
    max_decisions: int | None = None,
    decision_every: int | None = None,
    on_gap: str = "tell",
    view: LiveView | None = None,
) -> PaperOutcome:
    """Paper-trade `checkpoint` on the feed's candles into the journal at `journal_path` (created or resumed).

    `feed_factory(on_retry)` builds the feed; `on_retry` records each network retry in the journal. Bad input
    is refused before the model loads: a missing checkpoint, another decision interval than the checkpoint's,
    an unknown gap policy, a bad market or candle file, a journal of another run or a damaged one (and before
    torch is imported, so that such a refusal is quick).
    """
    if on_gap not in ("tell", "skip"):
        raise UsageError(f"--on-gap must be tell or skip, not '{on_gap}'")
    policy: GapPolicy = "skip" if on_gap == "skip" else "tell"
    if not (checkpoint / "config.yaml").is_file():
        raise UsageError(f"checkpoint not found: '{checkpoint}' (look in runs/<name>/checkpoints/)")
    config = load_config(checkpoint / "config.yaml")
    if decision_every is not None and decision_every != config.env.decision_every:
        raise UsageError(
            f"checkpoint '{checkpoint}' was trained to decide every {config.env.decision_every} bars, not "
            f"{decision_every}: a policy only knows the interval it was trained on"
        )
    opened: list[Journal] = []

    def on_retry(note: str) -> None:
        if opened:
            opened[0].log("retry", {"note": note})
        if view is not None:
            view.note(note)

    feed = feed_factory(on_retry)
    identity = {
        "checkpoint": checkpoint_identity(checkpoint), "symbol": feed.symbol, "timeframe": feed.timeframe,
        "decision_every": config.env.decision_every, "source": feed.source,
    }
    with Journal.open(journal_path, identity=identity, config=config.model_dump(mode="json"),
                      options={"on_gap": policy}) as journal:
        opened.append(journal)
        from r1trade.rl.checkpoint import load_trained_agent
        from r1trade.rollout.backend import sampling_from_config
        from r1trade.rollout.build import transformers_engine

        config, models = load_trained_agent(checkpoint)
        sampling = sampling_from_config(config.rollout, greedy=True)
        player = transformers_engine(models.policy, models.tokenizer, sampling)
        trader = PaperTrader(journal, config, player, feed, max_decisions=max_decisions, on_gap=policy,
                             view=view)
        reason = trader.run()
        initial, equity = config.env.initial_cash, journal.last_equity()
        return PaperOutcome(
            journal=journal_path, reason=reason, decisions=journal.decision_count(),
            skipped=journal.decision_count(SKIPPED), equity=initial if equity is None else equity,
            initial_cash=initial, events=journal.event_counts(),
        )
