"""A quiet CLI: the model commands print r1trade's progress and results, not the libraries' warnings, bars and logs;
`--debug` or `-v` leaves the libraries as they are."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from r1trade import quiet
from r1trade.cli import main

ROOT = Path(__file__).resolve().parents[1]
NOISE = ("Warning", "WARNING", "past_key_values", "{'loss'", "'train_runtime'", "Setting accelerator", "it/s]",
         "examples/s]")
TINY = ["--config", "smoke", "--set", "env.episode_decisions=2"]


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, as a user runs it (no quieting settings inherited from the test session)."""
    env = {key: value for key, value in os.environ.items() if key not in quiet.ENVIRONMENT}
    env["R1TRADE_CACHE"] = str(tmp_path / "cache")
    command = [sys.executable, "-m", "r1trade.cli", *args, "--set", f"output_dir={tmp_path}"]
    return subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.parametrize(
    ("command", "result"),
    [
        (["train", *TINY, "--set", "train.updates=1", "--set", "train.epochs=1",
          "--set", "rollout.max_new_tokens=12"], "final checkpoint"),
        (["warmstart", *TINY, "--set", "rollout.max_new_tokens=128", "--set", "warmstart.max_steps=2",
          "--set", "warmstart.episodes=1"], "warm-started model"),
    ],
    ids=["train", "warmstart"],
)
def test_model_commands_print_no_third_party_noise(tmp_path, command, result) -> None:
    done = _run(*command, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert result in done.stdout
    assert [noise for noise in NOISE if noise in printed] == [], printed[-3000:]
    if command[0] == "warmstart":
        assert "warm start smoke" in done.stdout and "2/2" in done.stdout and "loss" in done.stdout  # the Rich bar


@pytest.mark.parametrize(
    ("flags", "quieted"), [([], True), (["-v"], False), (["--verbose"], False), (["--debug"], False)]
)
def test_verbose_and_debug_leave_the_libraries_as_they_are(monkeypatch, capsys, flags, quieted) -> None:
    calls = []
    monkeypatch.setattr(quiet, "quiet_third_party", lambda: calls.append(1))
    assert main([*flags, "show-config", "--config", "smoke"]) == 0
    assert calls == ([1] if quieted else [])


def test_quieting_drops_the_known_harmless_warnings_and_log_lines_only(monkeypatch, caplog) -> None:
    for name in quiet.ENVIRONMENT:
        monkeypatch.setenv(name, "unset")  # recorded, so that what the test sets is undone after it
        monkeypatch.delenv(name)
    monkeypatch.setenv("TQDM_DISABLE", "0")  # a value the user set is kept
    deepspeed = logging.getLogger("DeepSpeed")
    monkeypatch.setattr(deepspeed, "filters", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.quiet_third_party()
        quiet.quiet_third_party()  # twice: no second filter
        warnings.warn("`past_key_values` is deprecated and will be removed in version 5.40.0", FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TQDM_DISABLE"] == "0"
    assert len(deepspeed.filters) == 1
    with caplog.at_level(logging.WARNING, logger="DeepSpeed"):
        deepspeed.warning("Setting accelerator to CPU. If you have GPU or other accelerator, ...")
        deepspeed.warning("a real problem")
    assert [record.getMessage() for record in caplog.records] == ["a real problem"]


def test_r1trade_messages_show_one_line_each(capsys) -> None:
    quiet.show_messages()
    quiet.show_messages()  # once only
    logging.getLogger("r1trade.models.test").warning("decoding attention stays with torch: %s", "no compiler")
    logging.getLogger("r1trade.models.test").info("converting a model (once)")
    assert capsys.readouterr().err == (
        "warning: decoding attention stays with torch: no compiler\nconverting a model (once)\n"
    )
