"""`check-env`: scripted policies through the env on the real sample, and its Rich report."""

from __future__ import annotations

from rich.console import Console

from r1trade.config import load_config
from r1trade.env.check import CheckReport, render_check_report, run_check_env


def test_check_env_runs_the_scripted_policies_and_renders() -> None:
    report = run_check_env(load_config("smoke"), episodes=3, seed=0)
    assert isinstance(report, CheckReport) and report.ok
    stats = {s.policy: s for s in report.policies}
    assert list(stats) == ["random", "malformed", "momentum"]
    assert stats["malformed"].valid_call_rate == 0 and stats["malformed"].fills == 0
    assert stats["malformed"].forced_holds == stats["malformed"].decisions
    assert stats["momentum"].format_errors == 0 and stats["momentum"].tool_errors == 0
    assert stats["random"].format_errors == 0
    assert all(s.episodes == 3 and s.decisions == 3 * 4 for s in report.policies)
    console = Console(record=True, width=200)
    console.print(render_check_report(report))
    text = console.export_text()
    for expected in ("random", "malformed", "momentum", "Return [%]", "Fees", "reward: risk_turnover",
                     "Same seed ⇒ identical trajectories: yes"):
        assert expected in text


def test_check_env_with_shorting_disabled_reports_the_refusals() -> None:
    report = run_check_env(load_config("smoke", ["env.allow_short=false"]), episodes=4, seed=1)
    stats = {s.policy: s for s in report.policies}
    assert stats["momentum"].tool_errors == 0  # the momentum policy goes flat instead of short
    assert report.same_seed_identical
