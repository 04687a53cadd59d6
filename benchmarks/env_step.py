"""Scripted decisions per second through TradingEnv on the shipped BTC/USD sample, prompt rendering included.

Each decision is a full `env.step(text)`: parsing the turn, validating arguments, filling the order with
seeded random slippage, walking `decision_every` bars with stop checks, scoring every reward component,
rendering the tool reply and the next observation, and keeping the bounded context. Episodes reset when they
end (reset cost included). Two scripts: one trade call per decision, and an information call (get_indicators)
before each trade. Also reported: building the market replay once, and creating 16 envs that share it.

    python benchmarks/env_step.py [--config btc_momentum] [--decisions 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from r1trade.config import load_config
from r1trade.env import TradingEnv, make_envs
from r1trade.env.trading_env import load_replay
from r1trade.runtime import cpu_header


def _call(name: str, reasoning: str, **arguments: object) -> str:
    return f"{reasoning}\n<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


TRADES = [
    _call("place_order", "Price is above SMA20 and RSI is rising.", side="long", size=0.5, stop_loss=2,
          take_profit=4, view="bullish"),
    _call("hold", "No change in trend.", view="bullish"),
    _call("place_order", "Momentum turned down.", side="short", size=0.5, stop_loss=2, view="bearish"),
    _call("close_position", "Mixed signals, step aside.", view="neutral"),
]
INFO = _call("get_indicators", "Check the indicators first.")


def run(env: TradingEnv, decisions: int, *, with_info: bool) -> tuple[int, int, float]:
    """Step scripted turns until `decisions` decisions are done; returns (decisions, turns, seconds)."""
    started = time.perf_counter()
    env.reset(seed=0)
    done_decisions = turns = 0
    while done_decisions < decisions:
        if with_info:
            env.step(INFO)
            turns += 1
        _, _, terminated, truncated, info = env.step(TRADES[done_decisions % len(TRADES)])
        turns += 1
        done_decisions += info["decision_done"]
        if terminated or truncated:
            env.reset()
    return done_decisions, turns, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="btc_momentum")
    parser.add_argument("--decisions", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config(args.config)

    started = time.perf_counter()
    replay = load_replay(config, "train")
    build = time.perf_counter() - started
    started = time.perf_counter()
    envs = make_envs(config, 16)
    sixteen = time.perf_counter() - started
    env = envs[0]

    print(cpu_header())
    print(f"python {platform.python_version()} · config {args.config} · "
          f"train split {len(replay):,} bars · indicators {', '.join(config.env.indicators)}")
    print(f"market replay build (load, split, indicators, sentiment proxy): {build:.2f} s; "
          f"16 envs sharing it: {sixteen * 1e3:.1f} ms")
    for with_info in (False, True):
        best = max(
            (run(env, args.decisions, with_info=with_info) for _ in range(args.repeats)),
            key=lambda result: result[0] / result[2],
        )
        decisions, turns, seconds = best
        label = "info call + trade per decision" if with_info else "one trade call per decision"
        print(f"{label}: {decisions / seconds:,.0f} decisions/s, {turns / seconds:,.0f} turns/s "
              f"({decisions:,} decisions in {seconds:.2f} s, best of {args.repeats})")


if __name__ == "__main__":
    main()
