"""The paper-trading journal: one SQLite file that records a paper run and lets it resume exactly.

SQLite (WAL mode, synced on every commit) because a decision, its simulated fills and the equity they leave
must commit in one transaction: a process killed at any point, kill -9 included, leaves the journal as it was
before that decision or after it, never between. Decisions are keyed by their bar's open time, so the
database itself refuses to record one twice.

Tables:
- `meta`: schema version, the run's identity (hash of the policy weights, symbol, timeframe, decision
  interval, candle source), the checkpoint's config and the run's options.
- `candles`: every closed candle the run used, by position (the env's bar index) and open time (ms, UTC).
- `candle_events`: gaps (missing candles), late candles and candles revised after they closed.
- `pending`: the decision taken at the latest decision bar, waiting for the bars it is held over; its turns
  are kept so that a restart replays them instead of asking the model again.
- `decisions`, `turns`, `fills`, `equity`: each decision once its bars have closed, with its model turns
  (text, tool call, tool result, the env's step record), its simulated fills and the account's equity at every
  bar.
- `events`: what happened to the run (starts, stops, network retries, skipped decisions), for people.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from r1trade.errors import OutputError, UsageError
from r1trade.paper.feed import Batch, Candle
from r1trade.paper.journal_checks import (
    DECIDED,
    SKIPPED,
    Damaged,
    check_candle,
    check_decision,
    check_info,
    check_mark,
    check_meta,
    check_pending,
    json_object,
    row_of,
    text_value,
)

SCHEMA_VERSION = "1"
SCHEMA = {
    "meta": "key TEXT PRIMARY KEY, value TEXT NOT NULL",
    "candles": "position INTEGER PRIMARY KEY, ts INTEGER NOT NULL UNIQUE, open REAL NOT NULL, "
    "high REAL NOT NULL, low REAL NOT NULL, close REAL NOT NULL, volume REAL NOT NULL, "
    "received_at INTEGER NOT NULL",
    "candle_events": "id INTEGER PRIMARY KEY, kind TEXT NOT NULL, ts INTEGER NOT NULL, detail TEXT NOT NULL, "
    "recorded_at INTEGER NOT NULL",
    "pending": "ts INTEGER PRIMARY KEY, position INTEGER NOT NULL, episode INTEGER, step INTEGER, "
    "status TEXT NOT NULL, observation TEXT, note TEXT, turns TEXT NOT NULL, decided_at INTEGER NOT NULL",
    "decisions": "ts INTEGER PRIMARY KEY, position INTEGER NOT NULL UNIQUE, episode INTEGER, step INTEGER, "
    "status TEXT NOT NULL, observation TEXT, note TEXT, action TEXT, equity REAL NOT NULL, "
    "decided_at INTEGER NOT NULL, settled_at INTEGER NOT NULL",
    "turns": "decision_ts INTEGER NOT NULL, turn INTEGER NOT NULL, text TEXT NOT NULL, tool_call TEXT, "
    "tool_result TEXT NOT NULL, info TEXT NOT NULL, PRIMARY KEY (decision_ts, turn)",
    "fills": "decision_ts INTEGER NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL, "
    "position INTEGER NOT NULL, side TEXT NOT NULL, units REAL NOT NULL, price REAL NOT NULL, "
    "fee REAL NOT NULL, reason TEXT NOT NULL, realized_pnl REAL NOT NULL, PRIMARY KEY (decision_ts, seq)",
    "equity": "ts INTEGER PRIMARY KEY, position INTEGER NOT NULL, episode INTEGER, window_equity REAL, "
    "equity REAL NOT NULL",
    "events": "id INTEGER PRIMARY KEY, at INTEGER NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL",
}
"""Every table and its columns; a journal whose tables differ is refused."""


@dataclass(frozen=True)
class Pending:
    """A decision taken at bar `position` whose interval has not closed yet (`status` SKIPPED: none taken)."""

    ts: int
    position: int
    episode: int | None
    step: int | None
    status: str
    observation: str | None
    note: str | None
    turns: list[str]
    decided_at: int


@dataclass(frozen=True)
class TurnRecord:
    """One model turn as the env answered it once the decision's bars had closed."""

    text: str
    tool_result: str
    info: dict[str, Any]


@dataclass(frozen=True)
class Mark:
    """The account's equity at the close of bar `position` (`window_equity`: the episode's, from the env)."""

    position: int
    episode: int | None
    window_equity: float | None
    equity: float


@dataclass(frozen=True)
class Settled:
    """A decision (or a skipped one) whose interval has closed, with everything it produced."""

    pending: Pending
    turns: list[TurnRecord]
    action: dict[str, Any] | None
    marks: list[Mark]


class Journal:
    """An open journal: `Journal.open` creates or resumes one to write, `Journal.read` opens one to report."""

    def __init__(self, path: Path, connection: sqlite3.Connection, lock: IO[bytes] | None) -> None:
        """Read the journal's meta and candles, and check every table (`journal_checks`): a damaged journal is
        refused here, and the connection closed (the lock is the caller's)."""
        self.path, self._db, self._lock = path, connection, lock
        try:
            self.meta = _read_meta(connection, path)
            self.candles = self._read_candles()
            self._check_tables()
        except sqlite3.DatabaseError as exc:  # a page of the file is damaged, or the file was cut short
            connection.close()
            raise _unreadable(path, exc) from None
        except BaseException:
            connection.close()
            raise
        self._positions = {candle.ts: i for i, candle in enumerate(self.candles)}

    # ------------------------------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls, path: Path, *, identity: dict[str, Any], config: dict[str, Any], options: dict[str, Any]
    ) -> Journal:
        """Resume the journal at `path`, or start it; another run's journal or a damaged file is refused.

        A journal that holds no candle yet (its run stopped before it began) is taken over by this run. The
        journal is locked for this process until `close` (the lock goes with the process, even on kill -9).
        """
        lock = _lock(path)
        try:
            connection = _connect(path)
            if _tables(connection, path):
                _write_ahead(connection)
            else:
                _write_meta(connection, identity=identity, config=config, options=options, create=True)
            journal = cls(path, connection, lock)
        except sqlite3.Error as exc:  # the file or its folder is read-only, the disk is full
            lock.close()
            raise UsageError(f"cannot write journal '{path}': {exc}") from None
        except BaseException:
            lock.close()
            raise
        try:
            if journal.candles:
                journal._check_same_run(identity, options)
            elif (journal.meta["identity"], journal.meta["options"]) != (identity, options):
                _write_meta(connection, identity=identity, config=config, options=options, create=False)
                journal.meta.update(identity=identity, config=config, options=options)
        except UsageError:
            journal.close()
            raise
        return journal

    @classmethod
    def read(cls, path: Path) -> Journal:
        """An existing journal, to read (paper-report); a missing, damaged or foreign file is refused.

        Read-only, and nothing is written beside it, so a journal in a folder this user cannot write reads as
        well. While no paper process writes the journal, a shared lock keeps one from starting during the read,
        and the journal file alone is read when no write-ahead log is left beside it."""
        if not path.is_file():
            raise UsageError(f"journal not found: '{path}' (write one with `r1trade paper --journal {path}`)")
        connection, lock = _open_to_read(path)
        try:
            if not _tables(connection, path):
                connection.close()
                raise UsageError(f"journal '{path}' is empty: it holds no paper run")
            return cls(path, connection, lock)
        except BaseException:
            if lock is not None:
                lock.close()
            raise

    def close(self) -> None:
        self._db.close()
        if self._lock is not None:
            self._lock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_candles(self) -> list[Candle]:
        candles: list[Candle] = []
        rows = self._db.execute("SELECT position, ts, open, high, low, close, volume FROM candles ORDER BY position")
        for row in rows:
            with row_of(self.path, "candles", f"position={row[0]}"):
                check_candle(row, len(candles), candles[-1].ts if candles else None)
            candles.append(Candle(*row[1:]))
        return candles

    def _check_tables(self) -> None:
        """The settled decisions, the pending one, the turns, the equity marks and the candle events, as a paper
        run writes them (`journal_checks`)."""
        every, stamps = self.meta["identity"]["decision_every"], [candle.ts for candle in self.candles]
        decisions = self.rows("SELECT ts, position, episode, step, status, equity FROM decisions ORDER BY ts")
        previous, last_episode = None, -1
        for row in decisions:
            with row_of(self.path, "decisions", f"ts={row[0]}"):
                check_decision(row, candle_ts=stamps, every=every, previous=previous, last_episode=last_episode)
            previous, last_episode = row, last_episode if row[2] is None else row[2]
        pending = self.rows("SELECT ts, position, episode, step, status, turns FROM pending ORDER BY ts")
        for row in pending:
            with row_of(self.path, "pending", f"ts={row[0]}"):
                if len(pending) > 1:
                    raise Damaged(f"the table holds {len(pending)} decisions, a paper run keeps one")
                check_pending(row, candle_ts=stamps, every=every, previous=previous, last_episode=last_episode)
        self._check_turns(decisions, every)
        self._check_marks(decisions, stamps, every)
        for row in self.rows("SELECT id, kind, detail FROM candle_events ORDER BY id"):
            with row_of(self.path, "candle_events", f"id={row[0]}"):
                detail = json_object(row[2], "detail")
                if row[1] == "revised" and not isinstance(detail.get("revised"), list):
                    raise Damaged("a revised candle's detail has no list of revised values")

    def _check_turns(self, decisions: list[tuple], every: int) -> None:
        """Each decided decision's turns, numbered from 0, the last one ending it; a skipped decision has none."""
        decided = {row[0]: row for row in decisions if row[4] == DECIDED}
        counts = dict(self.rows("SELECT decision_ts, COUNT(*) FROM turns GROUP BY decision_ts"))
        query = "SELECT decision_ts, turn, text, info FROM turns ORDER BY decision_ts, turn"
        for ts, turn, said, info in self.rows(query):
            with row_of(self.path, "turns", f"decision_ts={ts}, turn={turn}"):
                decision = decided.get(ts)
                if decision is None:
                    raise Damaged("no decided decision has this decision_ts")
                if turn not in range(counts[ts]):
                    raise Damaged(f"turn {turn} of {counts[ts]}: the decision's turns are not numbered from 0")
                text_value(said, "text")
                check_info(json_object(info, "info"), position=decision[1], every=every, step=decision[3],
                           last=turn == counts[ts] - 1)
        for ts in decided.keys() - counts.keys():
            with row_of(self.path, "decisions", f"ts={ts}"):
                raise Damaged("the decision has no turns")

    def _check_marks(self, decisions: list[tuple], stamps: list[int], every: int) -> None:
        """One equity mark per bar, from the first decision's bar to the end of the last one's bars (earlier if the
        account was ruined), each of the episode of the decision whose bars hold it."""
        marks = self.rows("SELECT ts, position, episode, window_equity, equity FROM equity ORDER BY ts")
        first = decisions[0][1] if decisions else None
        holders = {row[1]: row for row in decisions}
        for number, row in enumerate(marks):
            with row_of(self.path, "equity", f"ts={row[0]}"):
                if first is None:
                    raise Damaged("there is no settled decision whose bars it marks")
                bar = first + number
                holder = None if number == 0 else holders.get(first + (number - 1) // every * every)
                if number and holder is None:
                    raise Damaged(f"no settled decision holds its bar {bar}")
                check_mark(row, candle_ts=stamps, expected_position=bar, holder=holder)
        end = None if first is None else decisions[-1][1] + every
        if end is not None and (not marks or (marks[-1][1] != end and marks[-1][4] > 0.0)):
            last = f"its last mark is at bar {marks[-1][1]}" if marks else "it holds no mark"
            raise UsageError(f"journal '{self.path}' is damaged: equity: {last}, but the settled decisions' bars end "
                             f"at bar {end}")

    def _check_same_run(self, identity: dict[str, Any], options: dict[str, Any]) -> None:
        """Refuse to continue a journal written by another checkpoint, market or candle source, or options."""
        held = self.meta["identity"]
        for key, wanted in identity.items():
            if held.get(key) != wanted:
                raise UsageError(
                    f"journal '{self.path}' belongs to another run: its {key} is {_short(held.get(key))}, "
                    f"this run's is {_short(wanted)}; use another --journal"
                )
        for key, wanted in options.items():
            started = self.meta["options"].get(key)
            if started != wanted:
                raise UsageError(
                    f"journal '{self.path}' was started with {key} {started}, not {wanted}: resume it with "
                    f"{key} {started}"
                )

    # ------------------------------------------------------------------------------------------ writing

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: all of it commits, or none of it (a crash rolls it back on the next open)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise OutputError(f"could not write journal '{self.path}': {exc}") from None

    def log(self, kind: str, detail: dict[str, Any]) -> None:
        """Record something that happened to the run (a start, a stop, a retry)."""
        with self._transaction() as db:
            _insert_event(db, kind, detail)

    def add_candles(self, batch: Batch, *, step_ms: int) -> int:
        """Append the batch's candles newer than the last one; record gaps, late and revised candles.

        The candles already used never change: a candle that arrives for a time already passed (it fills a
        gap too late) or with other values than those recorded (revised after it closed) is recorded as an
        event and not used. A new candle the feed saw come late is used and recorded as late. Returns how many
        candles were appended.
        """
        appended: list[Candle] = []
        last = self.candles[-1].ts if self.candles else None
        with self._transaction() as db:
            for candle in sorted(batch.candles, key=lambda c: c.ts):
                if last is not None and candle.ts <= last:
                    self._record_old(db, candle, batch.received_at)
                    continue
                if last is not None and candle.ts > last + step_ms:
                    missing = (candle.ts - last) // step_ms - 1
                    detail = {"after": last, "before": candle.ts, "missing": missing}
                    _event(db, "gap", candle.ts, detail, batch.received_at)
                if candle.ts in batch.late:
                    delay = batch.received_at - (candle.ts + step_ms)
                    _event(db, "late", candle.ts, {"delay_ms": delay, "used": True}, batch.received_at)
                db.execute(
                    "INSERT INTO candles VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (len(self.candles) + len(appended), candle.ts, candle.open, candle.high, candle.low,
                     candle.close, candle.volume, batch.received_at),
                )
                appended.append(candle)
                last = candle.ts
        self._positions.update((candle.ts, len(self.candles) + i) for i, candle in enumerate(appended))
        self.candles += appended
        return len(appended)

    def _record_old(self, db: sqlite3.Connection, candle: Candle, received_at: int) -> None:
        """A candle for a time at or before the last one: a used candle revised, or a late one (once)."""
        position = self._positions.get(candle.ts)
        if position is None:
            query = "SELECT 1 FROM candle_events WHERE kind = 'late' AND ts = ?"
            if db.execute(query, (candle.ts,)).fetchone() is None:
                _event(db, "late", candle.ts, {"values": _values(candle), "used": False}, received_at)
            return
        used = self.candles[position]
        if _values(candle) == _values(used):
            return
        latest = db.execute(
            "SELECT detail FROM candle_events WHERE kind = 'revised' AND ts = ? ORDER BY id DESC LIMIT 1",
            (candle.ts,),
        ).fetchone()
        if latest is None or json.loads(latest[0])["revised"] != _values(candle):
            detail = {"used": _values(used), "revised": _values(candle)}
            _event(db, "revised", candle.ts, detail, received_at)

    def put_pending(self, pending: Pending) -> None:
        """Keep a decision until its interval closes; a restart settles it without asking the model again."""
        p = pending
        with self._transaction() as db:
            db.execute(
                "INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (p.ts, p.position, p.episode, p.step, p.status, p.observation, p.note, json.dumps(p.turns),
                 p.decided_at),
            )
            if pending.status == SKIPPED:
                _insert_event(db, "skipped", {"ts": pending.ts, "note": pending.note})

    def settle(self, settled: Settled, *, initial_equity: float) -> None:
        """Record a decision with its turns, fills and the equity of its bars, and drop it from `pending`: one
        transaction. The first decision also marks its own bar at the initial equity."""
        p = settled.pending
        before = self.equity_at(p.position)
        final = settled.marks[-1].equity if settled.marks else initial_equity if before is None else before
        with self._transaction() as db:
            if before is None:
                db.execute("INSERT INTO equity VALUES (?, ?, NULL, NULL, ?)",
                           (self.candles[p.position].ts, p.position, initial_equity))
            db.execute(
                "INSERT INTO decisions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (p.ts, p.position, p.episode, p.step, p.status, p.observation, p.note,
                 _json_or_null(settled.action), final, p.decided_at, _now()),
            )
            for number, turn in enumerate(settled.turns):
                db.execute(
                    "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?)",
                    (p.ts, number, turn.text, _json_or_null(turn.info["action"]), turn.tool_result,
                     json.dumps(turn.info)),
                )
            fills = [fill for turn in settled.turns for fill in turn.info["fills"]]
            for seq, fill in enumerate(fills):
                db.execute(
                    "INSERT INTO fills VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (p.ts, seq, self.candles[fill["bar"]].ts, fill["bar"], fill["side"], fill["units"],
                     fill["price"], fill["fee"], fill["reason"], fill["realized_pnl"]),
                )
            for mark in settled.marks:
                ts = self.candles[mark.position].ts
                db.execute("INSERT INTO equity VALUES (?, ?, ?, ?, ?)",
                           (ts, mark.position, mark.episode, mark.window_equity, mark.equity))
            db.execute("DELETE FROM pending WHERE ts = ?", (p.ts,))

    # ------------------------------------------------------------------------------------------ reading

    def pending(self) -> Pending | None:
        row = self._db.execute("SELECT * FROM pending ORDER BY ts DESC LIMIT 1").fetchone()
        if row is None:
            return None
        *head, turns, decided_at = row
        return Pending(*head, turns=json.loads(turns), decided_at=decided_at)

    def last_decision(self) -> tuple[int, int | None, int | None, str] | None:
        """(position, episode, step, status) of the latest settled decision, or None."""
        return self._db.execute(
            "SELECT position, episode, step, status FROM decisions ORDER BY ts DESC LIMIT 1"
        ).fetchone()

    def last_episode(self) -> int | None:
        """The highest episode number used, settled or pending."""
        rows = self._db.execute(
            "SELECT MAX(episode) FROM decisions UNION ALL SELECT MAX(episode) FROM pending"
        )
        numbers = [number for (number,) in rows if number is not None]
        return max(numbers) if numbers else None

    def decision_count(self, status: str = DECIDED) -> int:
        return self._db.execute("SELECT COUNT(*) FROM decisions WHERE status = ?", (status,)).fetchone()[0]

    def episode_turns(self, episode: int) -> list[list[str]]:
        """The turn texts of each settled decision of an episode, in order."""
        rows = self._db.execute(
            "SELECT d.step, t.text FROM decisions d JOIN turns t ON t.decision_ts = d.ts WHERE d.episode = ? "
            "ORDER BY d.step, t.turn", (episode,),
        ).fetchall()
        decisions: dict[int, list[str]] = {}
        for step, text in rows:
            decisions.setdefault(step, []).append(text)
        return [decisions[step] for step in sorted(decisions)]

    def episode_start(self, episode: int) -> int:
        """The bar (position) of an episode's first decision."""
        query = "SELECT position FROM decisions WHERE episode = ? AND step = 0"
        return self._db.execute(query, (episode,)).fetchone()[0]

    def equity_at(self, position: int) -> float | None:
        row = self._db.execute("SELECT equity FROM equity WHERE position = ?", (position,)).fetchone()
        return None if row is None else row[0]

    def last_equity(self) -> float | None:
        row = self._db.execute("SELECT equity FROM equity ORDER BY ts DESC LIMIT 1").fetchone()
        return None if row is None else row[0]

    def rows(self, query: str, *args: Any) -> list[tuple]:
        """Rows of a read-only query (the report reads the tables this way)."""
        return self._db.execute(query, args).fetchall()

    def event_counts(self) -> dict[str, int]:
        """How many gaps, late and revised candles, retries and skipped decisions the journal records."""
        counts = dict(self._db.execute("SELECT kind, COUNT(*) FROM candle_events GROUP BY kind").fetchall())
        counts.update(self._db.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind").fetchall())
        return counts


# ---------------------------------------------------------------------------------------------- helpers


def _lock(path: Path) -> IO[bytes]:
    """An exclusive lock on the journal file itself, held by an open handle; a second writer is refused.

    The handle stays open until the journal closes: closing any handle on the file would drop SQLite's own
    locks on it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("ab")
    except OSError as exc:
        raise UsageError(f"cannot open journal '{path}': {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UsageError(
            f"journal '{path}' is in use by another r1trade paper process (a paper run, or a report reading it)"
        ) from None
    return handle


def _connect(path: Path) -> sqlite3.Connection:
    """A connection that commits only where `_transaction` says (autocommit otherwise)."""
    try:
        return sqlite3.connect(path, isolation_level=None, timeout=30)
    except sqlite3.Error as exc:
        raise UsageError(f"cannot open journal '{path}': {exc}") from None


def _write_ahead(connection: sqlite3.Connection) -> None:
    """WAL mode, synced on every commit: a commit survives kill -9 and a power cut."""
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")


def _open_to_read(path: Path) -> tuple[sqlite3.Connection, IO[bytes] | None]:
    """A read-only connection to the journal, and the shared lock held while no paper process writes it.

    SQLite reads a WAL journal through a shared-memory file beside it, which it cannot create in a folder this
    user cannot write. With no writer (the lock is ours) and no write-ahead log left beside the journal, the
    journal file holds everything and is read alone (`immutable`); otherwise SQLite reads the log too."""
    try:
        lock: IO[bytes] | None = path.open("rb")
    except OSError as exc:
        raise UsageError(f"cannot open journal '{path}': {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # a paper run writes it: read its log through SQLite's shared memory
        lock.close()  # before SQLite opens the file, whose locks closing a handle would drop
        lock = None
    log = path.with_name(path.name + "-wal")
    alone = lock is not None and (not log.exists() or log.stat().st_size == 0)
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if alone else "")
    try:
        connection = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
        connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        if lock is not None:
            lock.close()
        hint = "" if alone else f" (reading its write-ahead log, {log.name}, needs a folder this user can write)"
        raise UsageError(f"cannot read journal '{path}': {exc}{hint}") from None
    except sqlite3.DatabaseError as exc:
        if lock is not None:
            lock.close()
        raise _unreadable(path, exc) from None
    return connection, lock


def _tables(connection: sqlite3.Connection, path: Path) -> bool:
    """Whether the file holds a journal (False: an empty database); anything else is refused in one line that
    says what differs."""
    try:
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        names = {name for (name,) in tables}
        columns = {name: connection.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()
                   for name in names}
    except sqlite3.OperationalError as exc:
        connection.close()
        raise UsageError(f"cannot read journal '{path}': {exc}") from None
    except sqlite3.DatabaseError as exc:
        connection.close()
        raise _unreadable(path, exc) from None
    if not names:
        return False
    difference = _schema_difference(columns)
    if difference is not None:
        difference = f"its tables differ: {difference}"
    else:
        metas = dict(connection.execute("SELECT key, value FROM meta").fetchall())
        if set(metas) != set(_META_KEYS):
            difference = f"its meta table holds the keys {', '.join(sorted(map(str, metas)))}"
        elif metas["schema"] != json.dumps(SCHEMA_VERSION):
            difference = f"its meta table names schema {_short(metas['schema'])}"
    if difference is not None:
        connection.close()
        raise UsageError(
            f"journal '{path}' is not a paper journal of this r1trade (schema {SCHEMA_VERSION}): {difference}"
        )
    return True


def _unreadable(path: Path, exc: sqlite3.DatabaseError) -> UsageError:
    """A file SQLite cannot read: a damaged database (cut short, a page overwritten) or no database at all."""
    if getattr(exc, "sqlite_errorname", None) == "SQLITE_CORRUPT":
        return UsageError(f"journal '{path}' is damaged: {exc} (cut short, or a part overwritten)")
    return UsageError(f"journal '{path}' is not a paper journal (not an SQLite database: {exc})")


def _schema_difference(columns: dict[str, list[tuple]]) -> str | None:
    """What differs between a file's tables (`PRAGMA table_info` of each) and a journal's, or None."""
    expected = _expected_columns()
    missing = [name for name in expected if name not in columns]
    if missing:
        return f"no table {', '.join(missing)}"
    foreign = sorted(set(columns) - set(expected))
    if foreign:
        return f"tables a journal does not have: {', '.join(foreign)}"
    for table, wanted in expected.items():
        held = {column[1]: column for column in columns[table]}
        for column in wanted:
            if column[1] not in held:
                return f"table {table} has no column {column[1]}"
            if held[column[1]][2:] != column[2:]:
                return f"table {table}'s column {column[1]} is {_column(held[column[1]])}, not {_column(column)}"
        extra = [name for name in held if name not in {column[1] for column in wanted}]
        if extra:
            return f"table {table} has a column a journal does not have: {', '.join(extra)}"
        if columns[table] != wanted:
            return f"table {table}'s columns are in another order"
    return None


def _column(info: tuple) -> str:
    """A column of `PRAGMA table_info` (cid, name, type, notnull, default, pk) as its declaration reads."""
    _, _, kind, not_null, default, key = info
    return " ".join(
        part for part in (kind or "untyped", "NOT NULL" if not_null else "", f"DEFAULT {default}" if default else "",
                          "PRIMARY KEY" if key else "") if part
    )


def _expected_columns() -> dict[str, list[tuple]]:
    """`PRAGMA table_info` of every table as `SCHEMA` creates it (names, types, constraints)."""
    memory = sqlite3.connect(":memory:")
    try:
        for name, spec in SCHEMA.items():
            memory.execute(f"CREATE TABLE {name} ({spec})")
        return {name: memory.execute(f"PRAGMA table_info({name})").fetchall() for name in SCHEMA}
    finally:
        memory.close()


_META_KEYS = ("schema", "identity", "config", "options", "created_at")


def _read_meta(connection: sqlite3.Connection, path: Path) -> dict[str, Any]:
    """The run's meta; values that are not what `_write_meta` writes make the journal foreign or damaged."""
    try:
        meta = {key: json.loads(value) for key, value in connection.execute("SELECT key, value FROM meta")}
    except (ValueError, TypeError):
        meta = {}
    if not all(isinstance(meta.get(key), dict) for key in ("identity", "config", "options")):
        raise UsageError(f"journal '{path}' is not a paper journal of this r1trade: its meta is damaged")
    with row_of(path, "meta", "identity/options"):
        check_meta(meta)
    return meta


def _write_meta(
    connection: sqlite3.Connection, *, identity: dict, config: dict, options: dict, create: bool
) -> None:
    """The run's meta (with `create`, the tables too) in one transaction: a crash leaves the file as it
    was."""
    _write_ahead(connection)
    connection.execute("BEGIN IMMEDIATE")
    if create:
        for name, spec in SCHEMA.items():
            connection.execute(f"CREATE TABLE {name} ({spec})")
    meta = {"schema": SCHEMA_VERSION, "identity": identity, "config": config, "options": options,
            "created_at": _now()}
    rows = [(key, json.dumps(meta[key])) for key in _META_KEYS]
    connection.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)
    connection.execute("COMMIT")


def _event(db: sqlite3.Connection, kind: str, ts: int, detail: dict[str, Any], at: int) -> None:
    db.execute("INSERT INTO candle_events (kind, ts, detail, recorded_at) VALUES (?, ?, ?, ?)",
               (kind, ts, json.dumps(detail), at))


def _json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _insert_event(db: sqlite3.Connection, kind: str, detail: dict[str, Any]) -> None:
    db.execute("INSERT INTO events (at, kind, detail) VALUES (?, ?, ?)", (_now(), kind, json.dumps(detail)))


def _values(candle: Candle) -> list[float]:
    return [candle.open, candle.high, candle.low, candle.close, candle.volume]


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def _now() -> int:
    """Wall-clock time in ms (when something was recorded)."""
    return int(time.time() * 1000)
