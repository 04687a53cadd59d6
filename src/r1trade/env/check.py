"""`r1trade check-env`: scripted text policies through the env, what they earned, and a determinism check.

Three policies speak the tool-call format: a random valid policy (random tool, random schema-valid arguments),
an always-malformed policy (every kind of broken turn) and a momentum policy (reads the indicators, then goes
long or short with the recent trend, with a stop-loss). It is a user-facing smoke test of the whole env.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from r1trade.config import Config
from r1trade.env.market import MarketReplay
from r1trade.env.rewards import COMPONENTS
from r1trade.env.trading_env import TradingEnv, load_replays

Policy = Callable[[TradingEnv, np.random.Generator], str]

MALFORMED_TURNS = (
    "I think the price goes up, so I buy.",
    '<tool_call>{"name": "place_order", "arguments": {"side": "long", "size": 0.5</tool_call>',
    '<tool_call>{"name": "buy_everything", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "place_order", "arguments": {"side": "up", "size": -1}}</tool_call>',
    '<tool_call>{"name": "hold", "arguments": {"view": "neutral"}}</tool_call>'
    '<tool_call>{"name": "hold", "arguments": {"view": "neutral"}}</tool_call>',
    '<tool_call>{"name": "hold", "arguments": {"view": "neutral"}}',
    "<tool_call>[\"hold\"]</tool_call>",
)


def random_policy(env: TradingEnv, rng: np.random.Generator) -> str:
    """A random tool with random schema-valid arguments."""
    tool = env.tool_schemas[int(rng.integers(len(env.tool_schemas)))]["function"]
    call = {"name": tool["name"], "arguments": _random_value(tool["parameters"], rng)}
    return f"Random choice.\n<tool_call>{json.dumps(call)}</tool_call>"


def malformed_policy(env: TradingEnv, rng: np.random.Generator) -> str:
    """Always a broken turn, of a random kind."""
    return MALFORMED_TURNS[int(rng.integers(len(MALFORMED_TURNS)))]


def momentum_policy(env: TradingEnv, rng: np.random.Generator) -> str:
    """First call: read the indicators. Then follow the trend of the last 6 decisions' bars with half the
    equity, stop-loss 3 % (under the volatility-target mandate, its size nearest to a half and no stop, as its
    orders take)."""
    if env.calls_made == 0:
        return 'Indicators first.\n<tool_call>{"name": "get_indicators", "arguments": {}}</tool_call>'
    span = 6 * env.env_config.decision_every
    change = env.replay.change_pct(env.bar, span)
    if math.isnan(change) or abs(change) < 0.5 or (change < 0 and not env.env_config.allow_short):
        call = {"name": "close_position", "arguments": {"view": "neutral"}}
    else:
        side, view = ("long", "bullish") if change > 0 else ("short", "bearish")
        offered = env.registry["place_order"].parameters["properties"]
        size = min(offered["size"].get("enum", [0.5]), key=lambda size: abs(size - 0.5))
        arguments = {"side": side, "size": size, "stop_loss": 3, "view": view}
        if "stop_loss" not in offered:
            del arguments["stop_loss"]
        call = {"name": "place_order", "arguments": arguments}
    return f"The last {span} bars moved {change:+.2f}%.\n<tool_call>{json.dumps(call)}</tool_call>"


POLICIES: dict[str, Policy] = {
    "random": random_policy, "malformed": malformed_policy, "momentum": momentum_policy
}


def _random_value(schema: dict[str, Any], rng: np.random.Generator) -> Any:
    """A random value valid under the schema subset the tools use."""
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    kind = schema.get("type")
    if kind == "object":
        required = set(schema.get("required", ()))
        return {
            key: _random_value(sub, rng)
            for key, sub in schema.get("properties", {}).items()
            if key in required or rng.random() < 0.5
        }
    if kind == "array":
        options = schema["items"]["enum"]
        count = int(rng.integers(1, len(options) + 1))
        return [options[i] for i in rng.choice(len(options), size=count, replace=False)]
    if kind == "integer":
        return int(rng.integers(schema.get("minimum", 0), schema.get("maximum", 10) + 1))
    low = schema.get("minimum", schema.get("exclusiveMinimum", 0.0))
    return round(float(rng.uniform(low, schema.get("maximum", 1.0))), 3) or 0.001


# --------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class PolicyStats:
    """Per-episode averages of one policy (rewards are episode sums)."""

    policy: str
    episodes: int
    turns: int
    decisions: int
    reward_mean: float
    reward_std: float
    components: dict[str, float]
    return_pct: float
    buy_and_hold_pct: float
    fees: float
    fills: float
    format_errors: int
    tool_errors: int
    forced_holds: int
    valid_call_rate: float
    bankruptcies: int
    turns_per_second: float


@dataclass(frozen=True)
class CheckReport:
    """What `check-env` found: per-policy statistics and the determinism checks."""

    config_name: str
    split: str
    seed: int
    policies: list[PolicyStats]
    same_seed_identical: bool
    different_seeds_differ: bool

    @property
    def ok(self) -> bool:
        """Deterministic, and the scripted policies behave as scripted."""
        by_name = {stats.policy: stats for stats in self.policies}
        return (
            self.same_seed_identical
            and self.different_seeds_differ
            and by_name["momentum"].format_errors == 0
            and by_name["malformed"].format_errors == by_name["malformed"].turns
        )


def run_episode(env: TradingEnv, policy: Policy, *, seed: int) -> dict[str, Any]:
    """One episode; returns the transcript (for determinism checks) and its totals."""
    rng = np.random.default_rng(seed)
    messages, info = env.reset(seed=seed)
    transcript: list[Any] = [info["start_bar"], messages]
    totals = dict.fromkeys(COMPONENTS, 0.0)
    counts = {"turns": 0, "format": 0, "tool_error": 0, "forced": 0, "valid": 0}
    done = False
    while not done:
        text = policy(env, rng)
        messages, reward, terminated, truncated, info = env.step(text)
        transcript += [text, messages, reward]
        for name, value in info["reward_components"].items():
            totals[name] += value
        counts["turns"] += 1
        counts["format"] += info["parse_error"] is not None
        counts["tool_error"] += info["tool_error"] is not None
        counts["forced"] += info["forced_hold"]
        counts["valid"] += info["parse_error"] is None and info["tool_error"] is None
        done = terminated or truncated
    return {"transcript": transcript, "totals": totals, "counts": counts, "episode": info["episode"]}


def run_check_env(config: Config, *, episodes: int, seed: int, split: str = "train") -> CheckReport:
    """Run every scripted policy for `episodes` episodes on `split`, then check determinism."""
    markets = load_replays(config, split)
    policies = [_policy_stats(name, policy, markets, config, episodes=episodes, seed=seed)
                for name, policy in POLICIES.items()]
    return CheckReport(
        config_name=config.name,
        split=split,
        seed=seed,
        policies=policies,
        same_seed_identical=_same_seed_identical(markets, config, seed=seed),
        different_seeds_differ=_different_seeds_differ(markets, config, seed=seed),
    )


def _policy_stats(
    name: str, policy: Policy, markets: list[MarketReplay], config: Config, *, episodes: int, seed: int
) -> PolicyStats:
    env = TradingEnv(markets, config.env, config.rewards)
    started = time.perf_counter()
    runs = [run_episode(env, policy, seed=seed + i) for i in range(episodes)]
    elapsed = time.perf_counter() - started
    totals = [sum(run["totals"].values()) for run in runs]
    turns = sum(run["counts"]["turns"] for run in runs)

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else math.nan

    return PolicyStats(
        policy=name,
        episodes=episodes,
        turns=turns,
        decisions=sum(run["episode"]["decisions"] for run in runs),
        reward_mean=mean(totals),
        reward_std=float(np.std(totals)) if totals else math.nan,
        components={c: mean([run["totals"][c] for run in runs]) for c in COMPONENTS},
        return_pct=mean([run["episode"]["return_pct"] for run in runs]),
        buy_and_hold_pct=mean([run["episode"]["buy_and_hold_pct"] for run in runs]),
        fees=mean([run["episode"]["fees"] for run in runs]),
        fills=mean([run["episode"]["fills"] for run in runs]),
        format_errors=sum(run["counts"]["format"] for run in runs),
        tool_errors=sum(run["counts"]["tool_error"] for run in runs),
        forced_holds=sum(run["counts"]["forced"] for run in runs),
        valid_call_rate=sum(run["counts"]["valid"] for run in runs) / turns if turns else math.nan,
        bankruptcies=sum(run["episode"]["bankrupt"] for run in runs),
        turns_per_second=turns / elapsed if elapsed > 0 else math.inf,
    )


def _same_seed_identical(markets: list[MarketReplay], config: Config, *, seed: int) -> bool:
    """Two fresh envs, same seed, random and momentum policies: identical transcripts and rewards."""
    for policy in (random_policy, momentum_policy):
        first, second = (
            run_episode(TradingEnv(markets, config.env, config.rewards), policy, seed=seed)["transcript"]
            for _ in range(2)
        )
        if first != second:
            return False
    return True


def _different_seeds_differ(markets: list[MarketReplay], config: Config, *, seed: int) -> bool:
    """Different seeds start at different bars (checked over a few seeds, since two may collide by chance)."""
    env = TradingEnv(markets, config.env, config.rewards)
    starts = {env.reset(seed=seed + i)[1]["start_bar"] for i in range(4)}
    return len(starts) > 1


# --------------------------------------------------------------------------------------------- rendering


def render_check_report(report: CheckReport) -> RenderableType:
    """A Rich table (one column per policy: outcome rows, then every reward component) and the verdicts."""
    table = Table(title=f"check-env · {report.config_name} · {report.split} split · seed {report.seed}")
    table.add_column("Metric")
    for s in report.policies:
        table.add_column(s.policy, justify="right")
    rows: list[tuple[str, Callable[[PolicyStats], str]]] = [
        ("Episodes", lambda s: str(s.episodes)),
        ("Decisions / turns", lambda s: f"{s.decisions} / {s.turns}"),
        ("Reward (mean per episode)", lambda s: f"{s.reward_mean:+.3f}"),
        ("Reward std", lambda s: f"{s.reward_std:.3f}"),
        ("Return [%]", lambda s: f"{s.return_pct:+.2f}"),
        ("Buy & Hold [%]", lambda s: f"{s.buy_and_hold_pct:+.2f}"),
        ("Fees", lambda s: f"{s.fees:.2f}"),
        ("Fills", lambda s: f"{s.fills:.1f}"),
        ("Format errors", lambda s: str(s.format_errors)),
        ("Tool errors", lambda s: str(s.tool_errors)),
        ("Forced holds", lambda s: str(s.forced_holds)),
        ("Valid calls [%]", lambda s: f"{100 * s.valid_call_rate:.0f}"),
        ("Bankruptcies", lambda s: str(s.bankruptcies)),
        ("Turns/s", lambda s: f"{s.turns_per_second:,.0f}"),
    ]
    for index, (label, cell) in enumerate(rows):
        table.add_row(label, *(cell(s) for s in report.policies), end_section=index == len(rows) - 1)
    for name in COMPONENTS:
        table.add_row(f"reward: {name}", *(f"{s.components[name]:+.3f}" for s in report.policies))

    def verdict(passed: bool) -> str:
        return "[green]yes[/green]" if passed else "[red]NO[/red]"

    checks = Text.from_markup(
        f"Same seed ⇒ identical trajectories: {verdict(report.same_seed_identical)}\n"
        f"Different seeds ⇒ different starts: {verdict(report.different_seeds_differ)}\n"
        f"Overall: {verdict(report.ok)}"
    )
    return Group(table, checks)
