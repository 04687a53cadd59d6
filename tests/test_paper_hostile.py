"""Hostile and damaged input to `r1trade paper` and `paper-report`: flags that are not finite or out of range, a
journal edited by hand, one of another schema, one in a folder this user cannot write. Each is one line and a
non-zero exit, and no file is changed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import make_synthetic_candles, run_in_a_fresh_process
from env_fixtures import close, long

from r1trade.cli import main
from r1trade.config import load_config
from r1trade.data.store import save_candles
from r1trade.errors import UsageError
from r1trade.paper.feed import ReplayFeed
from r1trade.paper.journal import Journal
from r1trade.paper.runner import PaperTrader

IDENTITY = {"checkpoint": "scripted", "symbol": "TEST/USD", "timeframe": "1h", "decision_every": 4,
            "source": "replay"}
CANDLES = 100
"""Decisions at bars 60, 64, ..., 96 (warm-up 60, every 4): nine settle, the one at bar 96 waits for bar 100."""
FIRST_TS = 1_609_459_200_000  # 2021-01-01 00:00 UTC, the synthetic candles' first open, in ms
HOUR = 3_600_000


class LongThenClose:
    """Goes long half the equity at one decision and closes at the next: fills in every interval."""

    def run(self, envs: Sequence, seeds: Sequence[int | None]) -> list[SimpleNamespace]:
        trajectories = []
        for env, seed in zip(envs, seeds, strict=True):
            env.reset(seed)
            turns, done = [], False
            while not done:
                text = long(0.5) if env.env.bar // 4 % 2 == 0 else close()
                _, _, terminated, truncated, info = env.step(text)
                turns.append(SimpleNamespace(text=text, info=info))
                done = terminated or truncated
            trajectories.append(SimpleNamespace(turns=turns))
        return trajectories


@pytest.fixture(scope="module")
def candle_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_candles(make_synthetic_candles(CANDLES), tmp_path_factory.mktemp("candles") / "candles.parquet")


@pytest.fixture(scope="module")
def base_journal(tmp_path_factory: pytest.TempPathFactory, candle_file: Path) -> Path:
    """A replay's journal: nine settled decisions in episodes of two, one pending, fills in every interval."""
    config = load_config("smoke", ["env.episode_decisions=2"])
    path = tmp_path_factory.mktemp("journal") / "paper.sqlite"
    with Journal.open(path, identity=IDENTITY, config=config.model_dump(mode="json"),
                      options={"on_gap": "tell"}) as journal:
        assert PaperTrader(journal, config, LongThenClose(), ReplayFeed(candle_file)).run() == "the replay ended"
    return path


@pytest.fixture
def journal(base_journal: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "journal" / "paper.sqlite"
    copy.parent.mkdir()
    shutil.copy(base_journal, copy)
    return copy


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint's config without real weights: enough for everything refused before the model loads."""
    path = tmp_path / "step-1"
    load_config("smoke", ["env.episode_decisions=2"]).save(path)
    (path / "policy").mkdir()
    (path / "policy" / "model.safetensors").write_bytes(b"weights")
    return path


def files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def execute(journal: Path, *statements: str) -> None:
    db = sqlite3.connect(journal)
    try:
        for statement in statements:
            db.execute(statement)
        db.commit()
    finally:
        db.close()


def set_meta(journal: Path, key: str, change) -> None:
    db = sqlite3.connect(journal)
    try:
        (value,) = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(change(json.loads(value))), key))
        db.commit()
    finally:
        db.close()


def one_line_refusal(capsys, args: Sequence[Any], message: str, *, code: int = 2) -> str:
    got = main([str(arg) for arg in args])
    err = capsys.readouterr().err
    assert got == code, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_the_base_journal_reports(capsys, journal: Path, tmp_path: Path) -> None:
    """What the damaged copies start from is a sound journal that reports, and reading it changes no file."""
    before = files(journal.parent)
    assert main(["paper-report", str(journal), "--out", str(tmp_path / "report")]) == 0, capsys.readouterr().err
    document = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert document["strategies"]["paper agent"]["# Decisions"] == 9
    assert files(journal.parent) == before  # nothing written beside it either (no -wal or -shm left)


# --------------------------------------------------------------------------- numbers the flags take


@pytest.mark.parametrize("flags, message", [
    (["--speed", "nan"], "--speed must be a finite number above 0 (times real time), not nan"),
    (["--speed", "inf"], "--speed must be a finite number above 0 (times real time), not inf"),
    (["--speed", "-1"], "--speed must be a finite number above 0"),
    # 3600 s / 1e-300 between two 1h candles; a day's wait at most is --speed 3600 / 86400 = 0.0416667
    (["--speed", "1e-300"], ("--speed 1e-300 would wait 3.6e+303 s between two 1h candles, more than a day: use "
                             "--speed 0.0416667 or more")),
    (["--speed", "0.01"], "--speed 0.01 would wait 3.6e+05 s between two 1h candles"),
    (["--poll-seconds", "nan"], "--poll-seconds must be a number from 1 to 3600, not nan"),
    (["--poll-seconds", "inf"], "--poll-seconds must be a number from 1 to 3600, not inf"),
    (["--poll-seconds", "0"], "--poll-seconds must be a number from 1 to 3600, not 0"),
    (["--poll-seconds", "1e9"], "--poll-seconds must be a number from 1 to 3600, not 1e+09"),
])
def test_a_flag_number_that_is_not_finite_or_in_range_is_refused_before_the_journal(
    capsys, tmp_path: Path, candle_file: Path, checkpoint: Path, flags: list[str], message: str
) -> None:
    journal = tmp_path / "new.sqlite"
    one_line_refusal(capsys, ["paper", "--checkpoint", checkpoint, "--journal", journal, "--replay", candle_file,
                              *flags], message)
    assert not journal.exists()


# --------------------------------------------------------------------------- a journal edited by hand

SETTLED_TS = FIRST_TS + 60 * HOUR  # the first decision's bar, 60 (it closes: no fill)
LONG_TS = SETTLED_TS + 4 * HOUR  # the second's, 64: it goes long, filled at bar 65's open
DAMAGE = [
    (["UPDATE turns SET info = 'not json' WHERE decision_ts = (SELECT MIN(decision_ts) FROM turns)"],
     f"turns row decision_ts={SETTLED_TS}, turn=0: info is not JSON: 'not json'"),
    (["UPDATE turns SET info = '[1, 2]' WHERE decision_ts = (SELECT MIN(decision_ts) FROM turns)"],
     f"turns row decision_ts={SETTLED_TS}, turn=0: info is JSON list, not an object"),
    ([f"UPDATE turns SET info = json_set(info, '$.fills[0].price', 'cheap') WHERE decision_ts = {LONG_TS}"],
     f"turns row decision_ts={LONG_TS}, turn=0: a fill's price is 'cheap', not a finite number"),
    ([f"UPDATE turns SET info = json_set(info, '$.fills[0].bar', 90) WHERE decision_ts = {LONG_TS}"],
     f"turns row decision_ts={LONG_TS}, turn=0: a fill's bar is 90, not a whole number from 65 to 68"),
    ([f"UPDATE turns SET info = json_set(info, '$.decision_done', json('false')) WHERE decision_ts = {LONG_TS}"],
     f"turns row decision_ts={LONG_TS}, turn=0: info's decision_done is false on the decision's last turn"),
    (["UPDATE equity SET equity = 'a lot' WHERE position = 65"],
     f"equity row ts={FIRST_TS + 65 * HOUR}: equity is 'a lot', not a finite number"),
    (["UPDATE equity SET window_equity = NULL WHERE position = 65"],
     f"equity row ts={FIRST_TS + 65 * HOUR}: window_equity is None, not a finite number"),
    (["UPDATE candles SET close = 'up' WHERE position = 10"],
     "candles row position=10: close is 'up', not a finite number"),
    (["UPDATE candles SET low = -5 WHERE position = 30"], "candles row position=30: low is -5, not above 0"),
    (["UPDATE candles SET volume = 'NaN' WHERE position = 30"], "candles row position=30: volume is 'NaN'"),
    (["UPDATE decisions SET step = 1 WHERE position = 60"],
     f"decisions row ts={SETTLED_TS}: step 1 of episode 0 does not follow step 0 of that episode"),
    (["UPDATE decisions SET episode = 5 WHERE position = 60"],
     f"decisions row ts={SETTLED_TS}: step 0 opens episode 5, not the next one, 0"),
    (["UPDATE decisions SET equity = 'rich' WHERE position = 60"],
     f"decisions row ts={SETTLED_TS}: equity is 'rich', not a finite number"),
    (["DELETE FROM candles WHERE position BETWEEN 20 AND 22"],
     "candles row position=23: position 23 follows position 19: the candles between are missing"),
    (["DELETE FROM candles WHERE position > 90"],
     (f"decisions row ts={FIRST_TS + 88 * HOUR}: its bars have not all closed: bar 88 + decision_every 4 is past "
      "the last candle, 90")),
    (["DELETE FROM equity WHERE position > 90"],
     "equity: its last mark is at bar 90, but the settled decisions' bars end at bar 96"),
    (["DELETE FROM turns WHERE decision_ts = (SELECT MAX(decision_ts) FROM turns)"],
     f"decisions row ts={FIRST_TS + 92 * HOUR}: the decision has no turns"),
    (["UPDATE candles SET ts = 9000000000000000000 WHERE position = 99"],
     ("candles row position=99: its open time (ts) is 9000000000000000000, not a whole number from 0 to "
      "9223372036854")),
    (["UPDATE pending SET turns = '{' "], f"pending row ts={FIRST_TS + 96 * HOUR}: turns is not JSON"),
    (["UPDATE pending SET position = 97"], f"pending row ts={FIRST_TS + 96 * HOUR}: its time "),
    (["INSERT INTO candle_events (kind, ts, detail, recorded_at) VALUES ('revised', 0, 'x', 0)"],
     "candle_events row id=1: detail is not JSON: 'x'"),
    (["INSERT INTO candle_events (kind, ts, detail, recorded_at) VALUES ('revised', 0, '{}', 0)"],
     "candle_events row id=1: a revised candle's detail has no list of revised values"),
]


@pytest.mark.parametrize("statements, message", DAMAGE)
def test_a_hand_damaged_journal_is_one_line_naming_its_table_and_row(
    capsys, tmp_path: Path, journal: Path, candle_file: Path, checkpoint: Path, statements: list[str], message: str
) -> None:
    execute(journal, *statements)
    before = files(journal.parent)
    err = one_line_refusal(capsys, ["paper-report", journal, "--out", tmp_path / "report"], message)
    assert f"journal '{journal}' is damaged: " in err
    assert not (tmp_path / "report").exists()
    # resuming the run is refused the same way, before any candle is read or the model loads
    one_line_refusal(capsys, ["paper", "--checkpoint", checkpoint, "--journal", journal, "--replay", candle_file],
                     message)
    assert files(journal.parent) == before


@pytest.mark.parametrize("key, change, message", [
    ("identity", lambda held: {k: v for k, v in held.items() if k != "symbol"},
     "meta row identity/options: identity has no 'symbol'"),
    ("identity", lambda held: {**held, "timeframe": "99999999999w"},
     "meta row identity/options: identity's timeframe '99999999999w' is not a bar length"),
    ("identity", lambda held: {**held, "decision_every": "4"},
     "meta row identity/options: identity's decision_every is '4', not a whole number from 1"),
    ("options", lambda held: {}, "meta row identity/options: options' on_gap is None, not tell or skip"),
    # the run decided every 4 bars: a journal that says 100000 has decisions 4 bars apart, which cannot be
    ("identity", lambda held: {**held, "decision_every": 100_000},
     (f"decisions row ts={SETTLED_TS}: its bars have not all closed: bar 60 + decision_every 100000 is past the "
      "last candle, 99")),
    ("config", lambda held: {**held, "env": {**held["env"], "decision_every": 100_000}},
     "meta row config: env.decision_every is 100000, but the run's identity decides every 4 bars"),
])
def test_a_journal_whose_meta_lost_a_key_or_holds_another_interval_is_one_line(
    capsys, tmp_path: Path, journal: Path, key: str, change, message: str
) -> None:
    set_meta(journal, key, change)
    before = files(journal.parent)
    one_line_refusal(capsys, ["paper-report", journal, "--out", tmp_path / "report"], message)
    assert files(journal.parent) == before and not (tmp_path / "report").exists()


@pytest.mark.parametrize("statements, message", [
    (["ALTER TABLE candles RENAME COLUMN close TO price"], "its tables differ: table candles has no column close"),
    (["ALTER TABLE meta RENAME COLUMN key TO name"], "its tables differ: table meta has no column key"),
    (["ALTER TABLE turns DROP COLUMN info"], "its tables differ: table turns has no column info"),
    (["ALTER TABLE events ADD COLUMN colour TEXT"], "table events has a column a journal does not have: colour"),
    (["DROP TABLE fills"], "its tables differ: no table fills"),
    (["ALTER TABLE equity RENAME TO marks"], "its tables differ: no table equity"),
    (["CREATE TABLE notes (text TEXT)"], "its tables differ: tables a journal does not have: notes"),
    (["ALTER TABLE fills RENAME TO old_fills",
      ("CREATE TABLE fills (decision_ts INTEGER NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL, "
       "position INTEGER NOT NULL, side TEXT NOT NULL, units REAL NOT NULL, price TEXT NOT NULL, "
       "fee REAL NOT NULL, reason TEXT NOT NULL, realized_pnl REAL NOT NULL, PRIMARY KEY (decision_ts, seq))"),
      "DROP TABLE old_fills"],
     "table fills's column price is TEXT NOT NULL, not REAL NOT NULL"),
    (["UPDATE meta SET value = '\"0\"' WHERE key = 'schema'"], "its meta table names schema \"0\""),
])
def test_a_journal_with_other_columns_says_which_table_and_column(
    capsys, tmp_path: Path, journal: Path, statements: list[str], message: str
) -> None:
    execute(journal, *statements)
    before = files(journal.parent)
    err = one_line_refusal(capsys, ["paper-report", journal, "--out", tmp_path / "report"], message)
    assert f"journal '{journal}' is not a paper journal of this r1trade (schema 1): " in err
    assert "not an SQLite database" not in err
    assert files(journal.parent) == before


def test_a_journal_cut_short_is_one_line_and_left_as_it_was(
    capsys, tmp_path: Path, journal: Path, candle_file: Path, checkpoint: Path
) -> None:
    whole = journal.read_bytes()
    journal.write_bytes(whole[: len(whole) // 2])  # a copy that stopped halfway
    before = files(journal.parent)
    message = f"journal '{journal}' is damaged: database disk image is malformed (cut short, or a part overwritten)"
    one_line_refusal(capsys, ["paper-report", journal, "--out", tmp_path / "report"], message)
    one_line_refusal(capsys, ["paper", "--checkpoint", checkpoint, "--journal", journal, "--replay", candle_file],
                     message)
    assert files(journal.parent) == before


def test_a_run_cannot_start_on_a_journal_being_reported(journal: Path) -> None:
    """The report reads the journal file alone while no run writes it: a run that started then could write under
    it, so it is refused until the report is done."""
    config = load_config("smoke", ["env.episode_decisions=2"]).model_dump(mode="json")
    with Journal.read(journal), pytest.raises(UsageError, match="in use by another r1trade paper process"):
        Journal.open(journal, identity=IDENTITY, config=config, options={"on_gap": "tell"})
    with Journal.open(journal, identity=IDENTITY, config=config, options={"on_gap": "tell"}) as resumed:
        assert len(resumed.candles) == CANDLES  # once the report is done


# --------------------------------------------------------------------------- a folder this user cannot write


@pytest.fixture
def read_only_folder() -> Iterator[tuple[Path, Path]]:
    """A folder made read-only (and one to write the report to), outside pytest's private temporary folder so
    that the unprivileged user a root session reads as can reach it."""
    folder, out = Path(tempfile.mkdtemp(prefix="r1trade-ro-")), Path(tempfile.mkdtemp(prefix="r1trade-out-"))
    out.chmod(0o777)
    yield folder, out
    folder.chmod(0o755)
    shutil.rmtree(folder)
    shutil.rmtree(out, ignore_errors=True)


def report_as_a_reader(journal: Path, out: Path) -> subprocess.CompletedProcess:
    """`paper-report` in a process that cannot write the journal's folder: this user's, or, for root (who
    writes anywhere), the unprivileged user `nobody`'s."""
    command = [sys.executable, "-m", "r1trade.cli", "paper-report", str(journal), "--out", str(out / "report")]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root writes a read-only folder, and setpriv is missing to read it as another user")
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    for name in ("mpl", "cache"):
        (out / name).mkdir(mode=0o777, exist_ok=True)
        (out / name).chmod(0o777)
    environment = {**os.environ, "MPLCONFIGDIR": str(out / "mpl"), "R1TRADE_CACHE": str(out / "cache"),
                   "HOME": str(out), "COLUMNS": "200"}
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=240, env=environment)


def test_a_journal_in_a_read_only_folder_reports(read_only_folder: tuple[Path, Path], base_journal: Path) -> None:
    folder, out = read_only_folder
    journal = folder / "paper.sqlite"
    shutil.copy(base_journal, journal)
    journal.chmod(0o644)
    folder.chmod(0o555)
    before = files(folder)
    result = report_as_a_reader(journal, out)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "report" / "metrics.json").read_text())["strategies"]["paper agent"]["# Decisions"] == 9
    assert files(folder) == before


def test_a_killed_runs_journal_in_a_read_only_folder_reports_what_its_log_holds(
    read_only_folder: tuple[Path, Path], base_journal: Path
) -> None:
    """A run killed with SIGKILL leaves its last commits in the write-ahead log beside the journal: they are read
    from there, and neither file is changed."""
    folder, out = read_only_folder
    journal = folder / "paper.sqlite"
    shutil.copy(base_journal, journal)
    writer = (
        "import os, signal, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA journal_mode = WAL')\n"
        "db.execute(\"INSERT INTO events (at, kind, detail) VALUES (0, 'retry', '{}')\")\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", writer, str(journal)], check=False, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert {path.name for path in folder.iterdir()} == {"paper.sqlite", "paper.sqlite-wal", "paper.sqlite-shm"}
    for path in folder.iterdir():
        path.chmod(0o644)
    folder.chmod(0o555)
    before = files(folder)
    result = report_as_a_reader(journal, out)
    assert result.returncode == 0, result.stderr
    notes = json.loads((out / "report" / "metrics.json").read_text())["notes"]["paper agent"]
    assert "0 gap, 0 late, 0 revised, 1 retry" in notes  # the retry committed to the log only
    assert files(folder) == before


def test_a_refused_paper_run_imports_no_model_library(tmp_path: Path) -> None:
    """Bad input is refused before the model loads, and before torch, transformers and peft are imported."""
    checkpoint = tmp_path / "step-1"
    load_config("smoke").save(checkpoint)  # its config alone: the refusal reads nothing else
    candles = save_candles(make_synthetic_candles(200), tmp_path / "candles.parquet")
    args = ["paper", "--checkpoint", str(checkpoint), "--journal", str(tmp_path / "paper.sqlite"),
            "--replay", str(candles), "--decision-every", "7"]
    codes, imported, err = run_in_a_fresh_process([args])
    assert codes == [2] and imported == [], err
    assert "was trained to decide every 4 bars, not 7" in err
    assert not (tmp_path / "paper.sqlite").exists()
