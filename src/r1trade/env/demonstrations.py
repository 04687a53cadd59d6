"""The demonstrators' action vocabulary: the turns a rule or a random policy writes in a `TradingEnv`.

The warm start (`r1trade.warmstart`) plays them to teach the tool-call format; the evaluation reads decisions in
the same words (`ACTION_PROMPT`, `TRADE_ACTIONS`), and the probe replays `random_turn` to ask what a model prefers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from r1trade.env.information import SIGNAL_TOOL
from r1trade.env.trading_env import TradingEnv
from r1trade.errors import ConfigError

TREND_BARS = 24


def demonstration_turn(env: TradingEnv) -> str:
    """The rule's turn for the env's current decision: one sentence of reasoning, then one trade call.

    Long half the equity with a 3 % stop when the last 24 bars rose more than 1 % and RSI is below 70; short
    (if allowed) on the mirror image; otherwise close an open position when the trend has faded, or hold.
    """
    change = env.replay.change_pct(env.bar, TREND_BARS)
    rsi_values = env.replay.feature_values.get("rsi_14")
    rsi = rsi_values[env.bar] if rsi_values else math.nan
    facts = f"{TREND_BARS} bars {change:+.2f}%" + (f", RSI {rsi:.0f}" if math.isfinite(rsi) else "")
    holding = env.portfolio.units != 0
    if change > 1.0 and not rsi >= 70:
        reason, call = f"Uptrend ({facts}), not overbought: go long half, stop 3%.", _order("long", "bullish")
    elif change < -1.0 and not rsi <= 30 and env.env_config.allow_short:
        reason, call = f"Downtrend ({facts}), not oversold: go short half, stop 3%.", _order("short", "bearish")
    elif holding and abs(change) < 0.3:
        reason, call = f"The trend has faded ({facts}): close the position.", _simple("close_position")
    else:
        reason, call = f"No clear signal ({facts}): hold.", _simple("hold")
    return f"{reason}\n<tool_call>{json.dumps(call)}</tool_call>"


def _order(side: str, view: str) -> dict:
    return {"name": "place_order", "arguments": {"side": side, "size": 0.5, "stop_loss": 3, "view": view}}


def _simple(name: str) -> dict:
    return {"name": name, "arguments": {"view": "neutral"}}


TRADE_ACTIONS = ("long", "short", "hold", "close")
ACTION_PROMPT = "Action:"
_SIZES = (0.25, 0.5, 0.75, 1.0)
_STOPS = (None, 1, 2, 3, 5)  # % from entry; None: no stop (the risk rule's penalty applies)
_TAKES = (None, None, 2, 4, 8)


def observed_changes(env: TradingEnv) -> str:
    """The price changes the observation shows over one and six decision intervals, as it shows them."""
    every = env.env_config.decision_every
    parts = []
    for bars in (every, 6 * every):
        change = env.replay.change_pct(env.bar, bars)
        parts.append(f"{bars} bars " + ("n/a" if math.isnan(change) else f"{change:+.2f}%"))
    return ", ".join(parts)


def random_turn(
    env: TradingEnv,
    rng: np.random.Generator,
    choices: Sequence[str] = TRADE_ACTIONS,
    *,
    plain: bool = False,
    looked: Sequence[str] = (),
    restate: Literal["all", "none"] = "all",
) -> str:
    """A uniformly random trade action after a line that restates the changes the agent has seen, and nothing else.

    The action is drawn from `choices` (long, short when allowed, hold and close by default); an order's size, stop
    and take-profit are drawn too, unless `plain` (the largest allowed size, no stop, no take-profit); under
    the volatility-target mandate the draw is over its sizes (`_mandate_action`; `plain` does not apply). The
    reasoning names no cause: it restates the changes the observation showed (`env.observation: full`), or one
    line of what each information tool `looked` at this decision returned (`restated_result`; nothing with
    `restate` none, so every trade turn is as short whatever was looked at), then `Action: <action>.`; the
    token after `Action:` is the one that picks the trade, and the call carries it out.
    """
    actions = [a for a in choices if a != "short" or env.env_config.allow_short]
    if not actions:
        raise ConfigError("warmstart.actions leaves nothing to do: add long, hold or close (shorts are not allowed)")
    if env.env_config.mandate == "vol_target":
        action, call = _mandate_action(env, rng, actions)
    else:
        action, call = _trade_action(env, rng, actions, plain=plain)
    if env.env_config.observation == "full":
        facts = [observed_changes(env)]
    else:  # each tool's answer restated alike (or none), so no tool's turn is longer to write than another's
        facts = [restated_result(env, name) for name in looked] if restate == "all" else []
    reasoning = "".join(f"{fact.rstrip('.')}. " for fact in facts) + f"{ACTION_PROMPT} {action}."
    return f"{reasoning}\n<tool_call>{json.dumps(call)}</tool_call>"


def _trade_action(
    env: TradingEnv, rng: np.random.Generator, actions: Sequence[str], *, plain: bool
) -> tuple[str, dict]:
    """A uniformly drawn action of `actions` and its call; an order's size, stop and take-profit drawn too
    unless `plain`."""
    action = actions[int(rng.integers(len(actions)))]
    if action in ("long", "short"):
        if plain:
            size, stop, take = min(1.0, env.env_config.max_position_frac), None, None
        else:
            size = min(_SIZES[int(rng.integers(len(_SIZES)))], env.env_config.max_position_frac)
            stop, take = _STOPS[int(rng.integers(len(_STOPS)))], _TAKES[int(rng.integers(len(_TAKES)))]
        arguments: dict = {"side": action, "size": size}
        if stop is not None:
            arguments["stop_loss"] = stop
        if take is not None:
            arguments["take_profit"] = take
        arguments["view"] = "bullish" if action == "long" else "bearish"
        return action, {"name": "place_order", "arguments": arguments}
    return action, _simple("hold" if action == "hold" else "close_position")


def _mandate_action(env: TradingEnv, rng: np.random.Generator, actions: Sequence[str]) -> tuple[str, dict]:
    """Under the volatility-target mandate, a uniform draw over the sizes of `env.exposures` (long for each
    size above 0, close for 0, each as one choice) and hold, as far as `actions` allows them: `long 0.75` and
    its order, with no stop; every size is as likely, so the warm start keeps the entropy over sizes."""
    options: list[tuple[str, float | None]] = []
    for size in sorted(env.env_config.exposures):
        if size > 0 and "long" in actions:
            options.append((f"long {size:g}", size))
        elif size == 0 and "close" in actions:
            options.append(("close", None))
    options += [("hold", None)] if "hold" in actions else []
    if not options:
        raise ConfigError("warmstart.actions leaves the mandate nothing to do: add long, close or hold")
    action, size = options[int(rng.integers(len(options)))]
    if size is None:
        return action, _simple("hold" if action == "hold" else "close_position")
    return action, {"name": "place_order", "arguments": {"side": "long", "size": size, "view": "neutral"}}


def information_arguments(env: TradingEnv, name: str) -> dict:
    """The plain arguments the random policy calls information tool `name` with."""
    return {"n": min(4, env.env_config.max_candles)} if name == "get_candles" else {}


def information_turn(env: TradingEnv, name: str) -> str:
    """A call of the information tool `name` with plain arguments, after a line that says only which tool."""
    call = {"name": name, "arguments": information_arguments(env, name)}
    return f"Check {name}.\n<tool_call>{json.dumps(call)}</tool_call>"


def restated_result(env: TradingEnv, name: str) -> str:
    """One line of what information tool `name` answers now: `get_changes` as `observed_changes`, the latest bar
    of `get_candles`, the first line of any other."""
    if name == SIGNAL_TOOL:
        return observed_changes(env)
    lines = env.registry[name].handler(information_arguments(env, name), env).text.splitlines()
    return lines[-1] if name == "get_candles" else lines[0]


def random_decision(
    env: TradingEnv,
    rng: np.random.Generator,
    choices: Sequence[str],
    *,
    plain: bool,
    max_info_calls: int,
    always_call: Sequence[str] = (),
    restate: Literal["all", "none"] = "all",
) -> list[str]:
    """The random policy's turns for one decision: the tools in `always_call`, then 0 to `max_info_calls` other
    distinct information tools (how many and which drawn at random), then `random_turn`, whose reasoning restates
    what they returned. Tools only read the market, so every turn can be written before the first is played."""
    count = int(rng.integers(max_info_calls + 1)) if max_info_calls else 0
    tools = sorted(env.info_tools - set(always_call))
    looked = [*always_call, *([tools[i] for i in rng.permutation(len(tools))[:count]] if count else [])]
    return [*(information_turn(env, name) for name in looked),
            random_turn(env, rng, choices, plain=plain, looked=looked, restate=restate)]
