"""`r1trade paper` and `paper-report`: the backtest's protocol bar by bar, a journal that survives restarts
(kill -9 included), network faults from a scripted exchange, gaps, late and revised candles, one-line
errors."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ccxt
import pandas as pd
import pytest
from conftest import SAMPLE
from env_fixtures import call, close, hold, long, short
from rich.console import Console

import r1trade.paper.feed
from r1trade.backtest.model_runs import model_run, plan_windows, play_windows
from r1trade.backtest.runner import load_context
from r1trade.cli import main
from r1trade.config import Config, load_config
from r1trade.data.store import load_clean_candles, save_candles
from r1trade.env.trading_env import TradingEnv
from r1trade.errors import UsageError
from r1trade.paper.feed import Batch, Candle, ExchangeFeed, ReplayFeed
from r1trade.paper.journal import SKIPPED, Journal
from r1trade.paper.report import paper_report
from r1trade.paper.runner import GapPolicy, PaperTrader
from r1trade.paper.view import LiveView, Status
from r1trade.rollout.loop import Trajectory, Turn

MALFORMED = "Up, I think. <tool_call>{not json</tool_call>"
HOUR = 3_600_000
IDENTITY = {
    "checkpoint": "scripted", "symbol": "BTC/USD", "timeframe": "1h", "decision_every": 4, "source": "replay"
}
TELL = {"on_gap": "tell"}


def scripted_turn(env: TradingEnv) -> str:
    """A policy of the bar alone (so the same in a backtest and on paper): looks first, trades with a stop and
    a take-profit, flips, closes, holds, writes malformed turns and runs out of calls (a forced hold)."""
    turns = {
        0: [call("get_candles", "Look first.", n=2), long(1.0, stop_loss=0.3)],
        1: [short(0.5, take_profit=0.5)],
        2: [MALFORMED, close()],
        3: [MALFORMED, MALFORMED, MALFORMED],
        4: [long(0.5, "Trend up."), hold()],
    }[(env.bar // env.env_config.decision_every) % 5]
    return turns[min(env.calls_made, len(turns) - 1)]


class ScriptedPlayer:
    """Plays `scripted_turn` where the engine would decode; records the bars it was asked to decide at."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def run(self, envs: Sequence, seeds: Sequence[int | None]) -> list[Trajectory]:
        trajectories = []
        for env, seed in zip(envs, seeds, strict=True):
            env.reset(seed)
            inner = env.env  # the TradingEnv behind the backtest's or the paper run's wrapper
            self.asked.append(inner.bar)
            trajectory, done = Trajectory(seed=seed, group=0), False
            while not done:
                text = scripted_turn(inner)
                _, reward, terminated, truncated, info = env.step(text)
                trajectory.turns.append(Turn(0, 0, 0, text, reward, False, info))
                done = terminated or truncated
            trajectories.append(trajectory)
        return trajectories


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def smoke(*overrides: str) -> Config:
    return load_config("smoke", ["env.episode_decisions=2", *overrides])


@pytest.fixture(scope="module")
def split_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The start of the smoke config's test split as a candle file (what its backtest evaluates)."""
    path = tmp_path_factory.mktemp("candles") / "test_split.parquet"
    save_candles(load_context(smoke()).split_candles.iloc[:160], path)
    return path


def paper_run(
    journal: Path,
    feed: Any,
    *,
    max_decisions: int,
    player: ScriptedPlayer | None = None,
    config: Config | None = None,
    on_gap: GapPolicy = "tell",
    identity: dict | None = None,
) -> str:
    """A paper run of the scripted player; returns why it stopped."""
    config = config or smoke()
    with Journal.open(journal, identity=identity or IDENTITY, config=config.model_dump(mode="json"),
                      options={"on_gap": on_gap}) as opened:
        player = player or ScriptedPlayer()
        trader = PaperTrader(opened, config, player, feed, max_decisions=max_decisions, on_gap=on_gap)
        return trader.run()


def dump(journal: Path) -> dict[str, list[tuple]]:
    """The tables two runs over the same candles share (the times things were received or written aside)."""
    queries = {
        "candles": "SELECT position, ts, open, high, low, close, volume FROM candles",
        "decisions": "SELECT ts, position, episode, step, status, observation, note, action, equity "
                     "FROM decisions",
        "turns": "SELECT * FROM turns ORDER BY decision_ts, turn",
        "fills": "SELECT * FROM fills ORDER BY decision_ts, seq",
        "equity": "SELECT * FROM equity ORDER BY ts",
        "pending": "SELECT ts, position, episode, step, status, turns FROM pending",
    }
    db = sqlite3.connect(journal)
    try:
        return {table: db.execute(query).fetchall() for table, query in queries.items()}
    finally:
        db.close()


def events(journal: Path, table: str = "candle_events") -> list[tuple[str, dict]]:
    db = sqlite3.connect(journal)
    try:
        rows = db.execute(f"SELECT kind, detail FROM {table} ORDER BY id").fetchall()
        return [(kind, json.loads(detail)) for kind, detail in rows]
    finally:
        db.close()


def run_cli(capsys, *args: Any) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- the backtest's protocol


def test_paper_trading_replays_the_backtest_bar_by_bar(tmp_path: Path, split_file: Path) -> None:
    config = smoke("backtest.max_decisions=8", "backtest.agent_windows=4")  # windows of 2, as the episodes
    context = load_context(config)
    plan = plan_windows(config, len(context.split_candles))
    backtest = model_run("agent", play_windows(ScriptedPlayer(), context, plan), context, plan, note="")

    journal = tmp_path / "paper.sqlite"
    assert paper_run(journal, ReplayFeed(split_file), max_decisions=8, config=config) == (
        "8 decisions taken (--max-decisions)"
    )
    report = paper_report(journal, tmp_path / "report")
    paper, buy_and_hold = report.runs
    assert buy_and_hold.name == "buy_and_hold"
    pd.testing.assert_series_equal(paper.equity, backtest.equity, check_names=False)
    pd.testing.assert_frame_equal(paper.trades, backtest.trades)
    assert set(paper.trades["exit_reason"]) == {"stop_loss", "take_profit", "window end"}
    for row, value in backtest.rows.items():
        assert paper.rows[row] == value or (math.isnan(value) and math.isnan(paper.rows[row])), row
    assert {"metrics.json", "report.html", "equity.png", "trades.csv"} <= {path.name for path in report.files}

    tables = dump(journal)
    assert [row[1] for row in tables["decisions"]] == list(range(60, 92, 4))  # every 4 bars after warm-up
    assert [(row[2], row[3]) for row in tables["decisions"]] == [(k // 2, k % 2) for k in range(8)]
    turn_fills = sum(len(json.loads(row[5])["fills"]) for row in tables["turns"])
    assert len(tables["fills"]) == turn_fills > 0 and tables["pending"] == []
    equity = {ts: value for ts, _, _, _, value in tables["equity"]}  # every bar held, episodes compounded
    stamps = [int(t.value // 10**6) for t in context.split_candles.index[60:93]]
    assert [equity[ts] for ts in stamps] == pytest.approx(backtest.equity.to_numpy())


# --------------------------------------------------------------------------- restarts


class Crash(Exception):
    """Stands for the process dying at that point."""


class CrashingFeed(ReplayFeed):
    """A replay that dies when asked for the candle after bar `position`."""

    def __init__(self, path: Path, position: int) -> None:
        super().__init__(path)
        self.crash_after = self.candles[position].ts

    def after(self, ts: int) -> Batch | None:
        if ts >= self.crash_after:
            raise Crash()
        return super().after(ts)


class CrashOnDelete:
    """A connection that dies on the last statement of `Journal.settle`'s transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("DELETE FROM pending"):
            raise Crash()
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, split_file: Path) -> dict[str, list[tuple]]:
    journal = tmp_path_factory.mktemp("whole") / "whole.sqlite"
    paper_run(journal, ReplayFeed(split_file), max_decisions=7)
    return dump(journal)


def test_a_restart_replays_the_journal_and_asks_only_for_new_decisions(
    tmp_path: Path, split_file: Path, uninterrupted: dict
) -> None:
    journal = tmp_path / "parts.sqlite"
    reason = paper_run(journal, ReplayFeed(split_file), max_decisions=3)
    assert reason == "3 decisions taken (--max-decisions)"
    player = ScriptedPlayer()
    paper_run(journal, ReplayFeed(split_file), max_decisions=7, player=player)
    assert player.asked == [72, 76, 80, 84]  # 72 continues the episode 68 began: replayed from the journal
    assert dump(journal) == uninterrupted
    again = ScriptedPlayer()
    paper_run(journal, ReplayFeed(split_file), max_decisions=7, player=again)
    assert again.asked == [] and dump(journal) == uninterrupted


def test_a_decision_taken_before_a_crash_is_settled_from_the_journal_not_asked_again(
    tmp_path: Path, split_file: Path, uninterrupted: dict
) -> None:
    journal = tmp_path / "crashed.sqlite"
    with pytest.raises(Crash):
        paper_run(journal, CrashingFeed(split_file, 66), max_decisions=7)
    held = dump(journal)
    assert [row[1] for row in held["decisions"]] == [60] and [row[1] for row in held["pending"]] == [64]
    player = ScriptedPlayer()
    paper_run(journal, ReplayFeed(split_file), max_decisions=7, player=player)
    assert player.asked == [68, 72, 76, 80, 84]  # 64 was decided before the crash: settled, not asked again
    assert dump(journal) == uninterrupted


def test_a_crash_inside_the_settling_transaction_leaves_nothing_half_written(
    tmp_path: Path, split_file: Path, uninterrupted: dict
) -> None:
    journal, config = tmp_path / "torn.sqlite", smoke()
    settings = config.model_dump(mode="json")
    with Journal.open(journal, identity=IDENTITY, config=settings, options=TELL) as opened:
        opened._db = CrashOnDelete(opened._db)  # type: ignore[assignment]
        feed = ReplayFeed(split_file)
        trader = PaperTrader(opened, config, ScriptedPlayer(), feed, max_decisions=7)
        with pytest.raises(Crash):
            trader.run()
    held = dump(journal)
    assert held["decisions"] == held["turns"] == held["fills"] == held["equity"] == []
    assert [row[1] for row in held["pending"]] == [60]
    paper_run(journal, ReplayFeed(split_file), max_decisions=7)
    assert dump(journal) == uninterrupted


# --------------------------------------------------------------------------- the journal refuses


def test_a_journal_of_another_run_or_a_damaged_file_is_refused_in_one_line(
    tmp_path: Path, split_file: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    paper_run(journal, ReplayFeed(split_file), max_decisions=1)
    held = dump(journal)
    others = [("checkpoint", "0123"), ("symbol", "ETH/USD"), ("timeframe", "4h"), ("decision_every", 6),
              ("source", "exchange:binance")]
    for key, value in others:
        with pytest.raises(UsageError, match=f"its {key} is") as caught:
            Journal.open(journal, identity={**IDENTITY, key: value}, config={}, options=TELL)
        assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="was started with on_gap tell, not skip"):
        Journal.open(journal, identity=IDENTITY, config={}, options={"on_gap": "skip"})
    busy = pytest.raises(UsageError, match="in use by another r1trade paper process")
    with Journal.open(journal, identity=IDENTITY, config={}, options=TELL), busy:
        Journal.open(journal, identity=IDENTITY, config={}, options=TELL)
    assert dump(journal) == held  # refused, untouched

    note = tmp_path / "notes.sqlite"
    note.write_text("not a database, but a note\n" * 200)
    with pytest.raises(UsageError, match="not an SQLite database"):
        Journal.open(note, identity=IDENTITY, config={}, options=TELL)
    assert note.read_text() == "not a database, but a note\n" * 200
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE trades (id INTEGER)").connection.close()
    with pytest.raises(UsageError, match="its tables differ"):
        Journal.read(other)
    with pytest.raises(UsageError, match="its tables differ"):
        Journal.open(other, identity=IDENTITY, config={}, options=TELL)
    with pytest.raises(UsageError, match="journal not found"):
        Journal.read(tmp_path / "missing.sqlite")


def test_a_journal_that_never_got_a_candle_is_taken_over(tmp_path: Path, split_file: Path) -> None:
    journal = tmp_path / "j.sqlite"
    Journal.open(journal, identity={**IDENTITY, "checkpoint": "broken"}, config={}, options=TELL).close()
    paper_run(journal, ReplayFeed(split_file), max_decisions=1)  # the run before stopped before it began
    with Journal.read(journal) as opened:
        assert opened.meta["identity"] == IDENTITY and opened.decision_count() == 1


# --------------------------------------------------------------------------- gaps


@pytest.fixture
def gappy_file(tmp_path: Path, split_file: Path) -> Path:
    """The split without two candles in the first decision's interval (before the journal's bar 62)."""
    candles, _ = load_clean_candles(split_file)
    path = tmp_path / "gappy.parquet"
    save_candles(candles.drop(candles.index[[62, 63]]), path)
    return path


def test_a_gap_is_recorded_and_the_agent_is_told(tmp_path: Path, gappy_file: Path) -> None:
    journal = tmp_path / "told.sqlite"
    paper_run(journal, ReplayFeed(gappy_file), max_decisions=4)
    assert [(kind, detail["missing"]) for kind, detail in events(journal)] == [("gap", 2)]
    decisions = dump(journal)["decisions"]
    notes = {row[1]: row[6] for row in decisions}
    assert notes[60] is None and notes[68] is None
    assert notes[64].startswith("Note: 2 candles missing from the exchange")
    observation = {row[1]: row[5] for row in decisions}[64]
    assert observation.endswith(notes[64]) and "Decision 2/2" in observation


def test_a_gap_skips_the_decision_when_asked_and_the_report_shows_it_flat(
    tmp_path: Path, gappy_file: Path
) -> None:
    journal = tmp_path / "skipped.sqlite"
    paper_run(journal, ReplayFeed(gappy_file), max_decisions=4, on_gap="skip")
    tables = dump(journal)
    assert [(row[1], row[2], row[3], row[4]) for row in tables["decisions"]] == [
        (60, 0, 0, "decided"), (64, None, None, SKIPPED), (68, 1, 0, "decided"), (72, 1, 1, "decided"),
        (76, 2, 0, "decided"),
    ]  # the skip ends episode 0 after one decision
    equity = {position: value for _, position, _, _, value in tables["equity"]}
    assert {equity[bar] for bar in range(64, 69)} == {equity[64]}  # flat while skipped
    assert [kind for kind, _ in events(journal, "events")].count("skipped") == 1
    paper = paper_report(journal, tmp_path / "report").runs[0]
    assert paper.rows["# Decisions"] == 4
    assert len(paper.equity) == 80 - 60 + 1
    assert paper.equity.iloc[-1] == pytest.approx(equity[80])
    assert list(paper.equity.iloc[4:9]) == pytest.approx([equity[64]] * 5)


# --------------------------------------------------------------------------- a scripted exchange


class ScriptedExchange:
    """A ccxt exchange on a scripted clock: a candle is served once it has opened, the newest still forming
    (with other prices than it closes at); some come late, some are revised after they closed, calls fail.

    `faults`: call number (load_markets and fetch_ohlcv counted together) → the error raised instead;
    `delays`: candle time → clock time before which it is not served; `revisions`: candle time → (clock
    time from which, the candle served instead)."""

    id = "fakex"
    rateLimit = 0

    def __init__(
        self,
        candles: list[Candle],
        *,
        now: int,
        faults: dict[int, Exception] | None = None,
        delays: dict[int, int] | None = None,
        revisions: dict[int, tuple[int, Candle]] | None = None,
        symbols: Sequence[str] = ("BTC/USD",),
    ) -> None:
        self.candles, self.now = {candle.ts: candle for candle in candles}, now
        self.faults, self.delays, self.revisions = faults or {}, delays or {}, revisions or {}
        self.has = {"fetchOHLCV": True}
        self.timeframes = {"1h": "1h", "1d": "1d"}
        self.features = {"spot": {"fetchOHLCV": {"limit": 20}}}
        self.listed = list(symbols)
        self.markets: dict[str, dict] = {}
        self.symbols: list[str] = []
        self.calls = 0
        self.touched: list[str] = []  # keys and order endpoints read: must stay empty
        self.end = max(self.candles) + 24 * HOUR

    def _call(self) -> None:
        number, self.calls = self.calls, self.calls + 1
        if number in self.faults:
            raise self.faults[number]

    def load_markets(self) -> dict[str, dict]:
        self._call()
        self.markets = {symbol: {"symbol": symbol, "type": "spot"} for symbol in self.listed}
        self.symbols = list(self.markets)
        return self.markets

    def fetch_ohlcv(self, symbol: str, timeframe: str, since: int, limit: int) -> list[list[float]]:
        self._call()
        rows = []
        for ts in sorted(self.candles):
            if ts < since or ts > self.now or self.delays.get(ts, 0) > self.now:
                continue
            candle = self.candles[ts]
            if ts in self.revisions and self.revisions[ts][0] <= self.now:
                candle = self.revisions[ts][1]
            if ts + HOUR > self.now:  # still forming
                candle = Candle(ts, candle.open, candle.open * 1.01, candle.low, candle.open * 1.005, 0.5)
            rows.append([ts, candle.open, candle.high, candle.low, candle.close, candle.volume])
        return rows[:limit]

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += int(seconds * 1000)
        if self.now > self.end:
            raise RuntimeError("the run waited past the end of the script")

    @property
    def apiKey(self) -> str:
        self.touched.append("apiKey")
        return ""

    @property
    def secret(self) -> str:
        self.touched.append("secret")
        return ""

    def create_order(self, *args: Any, **kwargs: Any) -> None:
        self.touched.append("create_order")
        raise AssertionError("a paper run sent an order")


GRACE = 5_000
EXCHANGE = {**IDENTITY, "source": "exchange:fakex"}


def exchange_feed(exchange: ScriptedExchange, retries: list[str] | None = None) -> ExchangeFeed:
    return ExchangeFeed(exchange, "BTC/USD", "1h", poll_seconds=60, grace_seconds=GRACE / 1000,
                        clock=lambda: exchange.now, sleep=exchange.sleep,
                        on_retry=(retries if retries is not None else []).append)


@pytest.fixture(scope="module")
def final_candles(split_file: Path) -> list[Candle]:
    return ReplayFeed(split_file).candles[:100]


def started(candles: list[Candle]) -> int:
    """The clock when candle 60 has just closed: a journal starts with candles 0–60, as a replay does."""
    return candles[60].ts + HOUR + GRACE


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory, split_file: Path) -> dict[str, list[tuple]]:
    """A replay of the same candles: what the exchange runs below must end with."""
    journal = tmp_path_factory.mktemp("replayed") / "replayed.sqlite"
    paper_run(journal, ReplayFeed(split_file), max_decisions=6)
    return dump(journal)


def test_an_exchange_run_with_network_faults_ends_like_a_replay_of_its_candles(
    tmp_path: Path, final_candles: list[Candle], replayed: dict
) -> None:
    faults: dict[int, Exception] = {
        0: ccxt.RequestTimeout("timed out"), 2: ccxt.RateLimitExceeded("429 Too Many Requests"),
        9: ccxt.ExchangeNotAvailable("maintenance"), 10: ccxt.NetworkError("connection reset"),
        **{call: ccxt.RequestTimeout("timed out") for call in range(30, 38)},  # an outage: 8 in a row
    }
    exchange = ScriptedExchange(final_candles, now=started(final_candles), faults=faults)
    retries: list[str] = []
    journal = tmp_path / "live.sqlite"
    paper_run(journal, exchange_feed(exchange, retries), max_decisions=6, identity=EXCHANGE)
    assert dump(journal) == replayed
    assert len(retries) == len(faults) and retries[0] == "RequestTimeout, retry 1 in 1 s"
    assert "RateLimitExceeded" in retries[1] and "ExchangeNotAvailable" in retries[2]
    assert retries[-1] == "RequestTimeout, retry 8 in 60 s"
    assert events(journal) == [] and exchange.touched == []


def test_late_revised_and_forming_candles_are_recorded_and_never_decided_on(
    tmp_path: Path, final_candles: list[Candle], replayed: dict
) -> None:
    late, revised = final_candles[70], final_candles[65]
    changed = Candle(revised.ts, revised.open, revised.high * 1.02, revised.low, revised.close * 1.01, 9.0)
    exchange = ScriptedExchange(
        final_candles, now=started(final_candles),
        delays={late.ts: late.ts + HOUR + 40 * 60_000},  # 40 minutes after its close, before the next one's
        revisions={revised.ts: (final_candles[67].ts + HOUR, changed)},  # after it was used
    )
    journal = tmp_path / "live.sqlite"
    paper_run(journal, exchange_feed(exchange), max_decisions=6, identity=EXCHANGE)
    assert dump(journal) == replayed  # neither the forming candles nor the revision were used
    recorded = events(journal)
    assert [kind for kind, _ in recorded] == ["revised", "late"]
    values = [revised.open, revised.high, revised.low, revised.close, revised.volume]
    revision = [changed.open, changed.high, changed.low, changed.close, changed.volume]
    assert recorded[0][1] == {"used": values, "revised": revision}
    assert recorded[1][1]["used"] is True and recorded[1][1]["delay_ms"] >= 40 * 60_000


def test_a_candle_that_comes_after_the_next_one_is_a_gap_then_a_late_candle(
    tmp_path: Path, final_candles: list[Candle]
) -> None:
    missing = final_candles[62]
    exchange = ScriptedExchange(final_candles, now=started(final_candles),
                                delays={missing.ts: final_candles[63].ts + 2 * HOUR})
    journal = tmp_path / "live.sqlite"
    paper_run(journal, exchange_feed(exchange), max_decisions=3, identity=EXCHANGE)
    recorded = events(journal)
    assert [kind for kind, _ in recorded] == ["gap", "late"]
    assert recorded[0][1] == {"after": final_candles[61].ts, "before": final_candles[63].ts, "missing": 1}
    assert recorded[1][1]["used"] is False
    tables = dump(journal)
    assert missing.ts not in [row[1] for row in tables["candles"]]
    notes = [row[6] for row in tables["decisions"]]
    assert notes[0] is None and notes[1].startswith("Note: 1 candle missing from the exchange")


@pytest.mark.parametrize("error", [ccxt.BadSymbol("market delisted"), ccxt.BadRequest("bad since")])
def test_a_rejected_symbol_or_request_is_a_usage_error(
    tmp_path: Path, final_candles: list[Candle], error: Exception
) -> None:
    exchange = ScriptedExchange(final_candles, now=started(final_candles), faults={3: error})
    with pytest.raises(UsageError, match="fakex rejected the (symbol|request) while fetching") as caught:
        paper_run(tmp_path / "j.sqlite", exchange_feed(exchange), max_decisions=3, identity=EXCHANGE)
    assert "\n" not in str(caught.value)


def test_an_unknown_symbol_or_timeframe_is_refused_before_any_candle(final_candles: list[Candle]) -> None:
    exchange = ScriptedExchange(final_candles, now=started(final_candles), symbols=("ETH/USD",))
    with pytest.raises(UsageError, match="fakex has no market 'BTC/USD'"):
        exchange_feed(exchange)
    with pytest.raises(UsageError, match="fakex has no '4h' candles; use one of 1h, 1d"):
        ExchangeFeed(ScriptedExchange(final_candles, now=0), "BTC/USD", "4h")


# --------------------------------------------------------------------------- the view and the command line


def test_the_live_view_draws_on_a_terminal() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    status = Status(market="BTC/USD 1h (replay)", equity=10_250.0, initial_cash=10_000.0, exposure=-0.5,
                    decisions=3, skipped=1, max_decisions=50, every=4,
                    last=(HOUR * 4, "short 0.5 (bearish)", "RSI is high."), next_close=HOUR * 8, now=HOUR * 4,
                    rate=1.0)
    with LiveView(console) as view:
        view.update(status, line="not printed on a terminal")
        view.note("RequestTimeout, retry 1 in 1 s")
    drawn = screen.getvalue()
    assert "10,250.00 (+2.50 %)" in drawn and "short 0.50 of equity" in drawn and "RSI is high." in drawn
    assert "in 3h 59m" in drawn and "not printed" not in drawn


@pytest.fixture
def config_only_checkpoint(tmp_path: Path) -> Path:
    """A checkpoint's config without real weights: enough for the refusals that come before the model
    loads."""
    checkpoint = tmp_path / "step-1"
    smoke().save(checkpoint)
    (checkpoint / "policy").mkdir()
    (checkpoint / "policy" / "model.safetensors").write_bytes(b"weights")
    return checkpoint


def test_bad_input_is_one_line_and_exit_2(
    capsys, monkeypatch, tmp_path: Path, split_file: Path, final_candles: list[Candle],
    config_only_checkpoint: Path,
) -> None:
    checkpoint, journal = config_only_checkpoint, tmp_path / "j.sqlite"
    real = r1trade.paper.feed.make_exchange
    monkeypatch.setattr("r1trade.paper.feed.make_exchange", lambda name: (
        ScriptedExchange(final_candles, now=started(final_candles)) if name == "fakex" else real(name)))
    replay = ["--checkpoint", checkpoint, "--journal", journal, "--replay", split_file]
    live = ["--checkpoint", checkpoint, "--journal", journal, "--exchange", "fakex"]
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    cases = [
        (["--decision-every", "6", *replay], "was trained to decide every 4 bars, not 6"),
        (["--checkpoint", checkpoint, "--journal", damaged, "--replay", split_file], "not a paper journal"),
        (["--on-gap", "wait", *replay], "--on-gap must be tell or skip"),
        (["--symbol", "ETH/USD", *replay], "--symbol ETH/USD differs from the replay file's BTC/USD"),
        (["--checkpoint", checkpoint, "--journal", journal], "give --exchange NAME"),
        (["--checkpoint", tmp_path / "none", "--journal", journal, "--replay", split_file],
         "checkpoint not found"),
        ([*live[:4], "--exchange", "binanse", "--symbol", "BTC/USDT", "--timeframe", "1h"],
         "unknown exchange 'binanse'"),
        ([*live, "--symbol", "DOGE/USD", "--timeframe", "1h"], "fakex has no market 'DOGE/USD'"),
        ([*live, "--symbol", "BTC/USD", "--timeframe", "4h"], "fakex has no '4h' candles"),
        ([*live, "--symbol", "BTC/USD"], "--exchange needs --symbol"),
    ]
    commands = [(["paper", *args], message) for args, message in cases] + [
        (["paper-report", damaged, "--out", tmp_path / "report"], "not a paper journal"),
        (["paper-report", tmp_path / "missing.sqlite", "--out", tmp_path / "report"], "journal not found"),
    ]
    for args, message in commands:
        code, _, err = run_cli(capsys, *args)
        assert code == 2, (args, err)
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_help_says_no_real_order_is_sent(capsys) -> None:
    code, out, _ = run_cli(capsys, "paper", "--help")
    assert code == 0 and "No real order is ever sent" in " ".join(out.split())


# --------------------------------------------------------------------------- a trained checkpoint, end to end


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, trained_run: Path) -> Path:
    """A copy of the smoke run's checkpoint that ends a decision after one turn: the tiny model never writes
    a valid call, so it holds at once instead of after three tries (the same journal, a third of the
    decoding)."""
    copy = tmp_path_factory.mktemp("checkpoint") / "step-1"
    shutil.copytree(trained_run / "checkpoints" / "step-1", copy)
    config = load_config(copy / "config.yaml")
    config.model_copy(update={"env": config.env.model_copy(update={"max_tool_calls": 1})}).save(copy)
    return copy


@pytest.fixture(scope="module")
def sample_journal(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Path:
    """50 decisions of the tiny trained checkpoint on the shipped sample, replayed as fast as it goes."""
    journal = tmp_path_factory.mktemp("sample") / "sample.sqlite"
    args = ["paper", "--replay", SAMPLE, "--checkpoint", checkpoint, "--journal", journal]
    assert main([str(arg) for arg in [*args, "--max-decisions", 50]]) == 0
    return journal


def test_the_sample_replay_with_a_trained_checkpoint_and_its_report(
    capsys, tmp_path: Path, checkpoint: Path, sample_journal: Path
) -> None:
    tables = dump(sample_journal)
    assert [row[1] for row in tables["decisions"]] == list(range(60, 260, 4))
    assert len(tables["turns"]) == 50 and tables["pending"] == []
    code, out, err = run_cli(capsys, "paper", "--replay", SAMPLE, "--checkpoint", checkpoint, "--journal",
                             sample_journal, "--max-decisions", 50)
    assert code == 0, err
    assert "50 settled, 0 skipped" in out and "no real order was sent" in out
    assert dump(sample_journal) == tables  # resumed: nothing decided again

    out_dir = tmp_path / "report"
    code, out, err = run_cli(capsys, "paper-report", sample_journal, "--out", out_dir)
    assert code == 0, err
    document = json.loads((out_dir / "metrics.json").read_text())
    assert list(document["strategies"]) == ["paper agent", "buy_and_hold"]
    assert document["strategies"]["paper agent"]["# Decisions"] == 50
    assert document["period"]["bars"] == 50 * 4 + 1 and "report.html" in out
    assert "paper agent" in (out_dir / "report.html").read_text()
    code, _, err = run_cli(capsys, "paper-report", sample_journal, "--out", out_dir)
    assert code == 2 and "--force" in err
    assert run_cli(capsys, "paper-report", sample_journal, "--out", out_dir, "--force")[0] == 0


def settled(journal: Path) -> int:
    """Settled decisions in a journal another process is writing (0 before it holds any)."""
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_killed_with_sigkill_and_started_again_it_ends_like_an_uninterrupted_run(
    tmp_path: Path, checkpoint: Path, sample_journal: Path
) -> None:
    journal = tmp_path / "killed.sqlite"
    command = [sys.executable, "-m", "r1trade.cli", "paper", "--replay", str(SAMPLE), "--checkpoint",
               str(checkpoint), "--journal", str(journal), "--max-decisions", "10"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # decoding as in this process (one_torch_thread)
    for kill_after in (2, 5):
        process = subprocess.Popen([*command, "--speed", "100000"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=environment)
        deadline = time.monotonic() + 120
        while settled(journal) < kill_after and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        process.kill()  # SIGKILL: no handler runs, nothing is cleaned up
        process.wait()
        assert kill_after <= settled(journal) < 10
    finished = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300,
                              env=environment)
    assert finished.returncode == 0, finished.stderr

    resumed, whole = dump(journal), dump(sample_journal)  # the first 10 decisions of an uninterrupted run
    decided = {row[0] for row in resumed["decisions"]}
    assert len(decided) == 10 and resumed["pending"] == []
    assert resumed["candles"] == whole["candles"][: len(resumed["candles"])]
    assert resumed["decisions"] == whole["decisions"][:10]
    for table in ("turns", "fills"):
        assert resumed[table] == [row for row in whole[table] if row[0] in decided]
    last_bar = resumed["candles"][-1][1]
    assert resumed["equity"] == [row for row in whole["equity"] if row[0] <= last_bar]
    assert [kind for kind, _ in events(journal, "events")].count("start") == 3
