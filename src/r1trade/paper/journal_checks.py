"""What a journal holds, checked as it is read: a journal edited by hand or damaged is refused in one line that
names the table and the row, before the runner resumes from it or the report is written.

A paper run writes every table itself, so on read each value must have the type and the range it was written
with (prices finite and above 0, times within pandas' calendar, JSON where JSON was written), and the tables must
agree with each other as the runner keeps them: one candle per position from 0; a decision every
`decision_every` bars, on a candle, its bars closed; each episode's steps 0, 1, ... in order; each decided
decision's turns numbered from 0, the last one ending the decision; one equity mark per bar from the first
decision's bar on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from r1trade.data.store import timeframe_to_timedelta
from r1trade.errors import UsageError

DECIDED, SKIPPED = "decided", "skipped"
MAX_TS = pd.Timestamp.max.value // 1_000_000
"""The latest open time (ms) pandas can hold (April 2262)."""
IDENTITY_KEYS = ("checkpoint", "symbol", "timeframe", "decision_every", "source")
GAP_POLICIES = ("tell", "skip")


class Damaged(ValueError):
    """One value of a row is not what a paper run writes (the caller names the table and the row)."""


@contextmanager
def row_of(path: Path, table: str, row: str) -> Iterator[None]:
    """Turn a `Damaged` value of `table`'s row `row` into the one-line error naming both."""
    try:
        yield
    except Damaged as exc:
        raise UsageError(f"journal '{path}' is damaged: {table} row {row}: {exc}") from None


# ---------------------------------------------------------------------------------------------- values


def integer(value: Any, name: str, low: int = 0, high: int | None = None) -> int:
    """A whole number from `low` (to `high`): INTEGER columns hold what was written, text and reals too."""
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f" from {low}" + ("" if high is None else f" to {high}")
        raise Damaged(f"{name} is {_shown(value)}, not a whole number{bound}")
    return value


def number(value: Any, name: str, *, above: float | None = None, at_least: float | None = None) -> None:
    """A finite number (REAL columns hold what was written: text stays text), above or at least a bound."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise Damaged(f"{name} is {_shown(value)}, not a finite number")
    if (above is not None and value <= above) or (at_least is not None and value < at_least):
        bound = f"above {above:g}" if above is not None else f"{at_least:g} or more"
        raise Damaged(f"{name} is {value:g}, not {bound}")


def text_value(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise Damaged(f"{name} is {_shown(value)}, not text")
    return value


def json_value(value: Any, name: str) -> Any:
    """The JSON a text column holds."""
    try:
        return json.loads(text_value(value, name))
    except ValueError:
        raise Damaged(f"{name} is not JSON: {_shown(value)}") from None


def json_object(value: Any, name: str) -> dict[str, Any]:
    loaded = json_value(value, name)
    if not isinstance(loaded, dict):
        raise Damaged(f"{name} is JSON {type(loaded).__name__}, not an object")
    return loaded


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


# ---------------------------------------------------------------------------------------------- meta


def check_meta(meta: dict[str, Any]) -> None:
    """The run's identity and options hold every key a paper run writes, with its type."""
    identity, options = meta["identity"], meta["options"]
    for key in IDENTITY_KEYS:
        if key not in identity:
            raise Damaged(f"identity has no '{key}'")
    for key in ("checkpoint", "symbol", "timeframe", "source"):
        text_value(identity[key], f"identity's {key}")
    integer(identity["decision_every"], "identity's decision_every", low=1)
    try:
        timeframe_to_timedelta(identity["timeframe"])
    except (UsageError, ValueError, OverflowError):
        raise Damaged(f"identity's timeframe {_shown(identity['timeframe'])} is not a bar length") from None
    if options.get("on_gap") not in GAP_POLICIES:
        raise Damaged(f"options' on_gap is {_shown(options.get('on_gap'))}, not tell or skip")


# ---------------------------------------------------------------------------------------------- candles


def check_candle(row: Sequence[Any], expected_position: int, previous_ts: int | None) -> None:
    """(position, ts, open, high, low, close, volume) of the candle after the one opened at `previous_ts`."""
    position, ts, *prices, volume = row
    if position != expected_position:
        after = "the first candle" if expected_position == 0 else f"position {expected_position - 1}"
        raise Damaged(f"position {position} follows {after}: the candles between are missing")
    integer(ts, "its open time (ts)", low=0, high=MAX_TS)
    if previous_ts is not None and ts <= previous_ts:
        raise Damaged(f"its open time {ts} is not after the previous candle's, {previous_ts}")
    for name, price in zip(("open", "high", "low", "close"), prices, strict=True):
        number(price, name, above=0.0)
    number(volume, "volume", at_least=0.0)


# ---------------------------------------------------------------------------------------------- decisions


def check_decision(
    row: Sequence[Any], *, candle_ts: Sequence[int], every: int, previous: Sequence[Any] | None, last_episode: int
) -> None:
    """(ts, position, episode, step, status, equity) of a settled decision after `previous` (the same columns);
    `last_episode`: the highest episode before it (-1: none)."""
    ts, position, episode, step, status, equity = row
    on_candle(ts, position, candle_ts)
    if position + every > len(candle_ts) - 1:
        raise Damaged(f"its bars have not all closed: bar {position} + decision_every {every} is past the last "
                      f"candle, {len(candle_ts) - 1}")
    if previous is not None and position != previous[1] + every:
        raise Damaged(f"its bar {position} is not decision_every ({every}) bars after the previous decision's, "
                      f"{previous[1]}")
    check_step(status, episode, step, previous=previous, last_episode=last_episode)
    number(equity, "equity")


def on_candle(ts: Any, position: Any, candle_ts: Sequence[int]) -> None:
    """A row of bar `position` and open time `ts`: a candle of the journal."""
    integer(position, "its bar (position)", high=len(candle_ts) - 1)
    if ts != candle_ts[position]:
        raise Damaged(f"its time {_shown(ts)} is not bar {position}'s, {candle_ts[position]}")


def check_step(status: Any, episode: Any, step: Any, *, previous: Sequence[Any] | None, last_episode: int) -> None:
    """A decision's episode and step: step 0 opens the next episode, step k follows step k-1 of its episode;
    a skipped decision has neither. `previous`: the settled decision before it, (ts, position, episode, step,
    status, ...)."""
    if status == SKIPPED:
        if episode is not None or step is not None:
            raise Damaged("a skipped decision has no episode or step")
        return
    if status != DECIDED:
        raise Damaged(f"status is {_shown(status)}, not {DECIDED} or {SKIPPED}")
    integer(episode, "episode")
    integer(step, "step")
    if step == 0 and episode != last_episode + 1:
        raise Damaged(f"step 0 opens episode {episode}, not the next one, {last_episode + 1}")
    follows = previous is not None and previous[4] == DECIDED and (previous[2], previous[3]) == (episode, step - 1)
    if step > 0 and not follows:
        raise Damaged(f"step {step} of episode {episode} does not follow step {step - 1} of that episode")


def check_pending(
    row: Sequence[Any], *, candle_ts: Sequence[int], every: int, previous: Sequence[Any] | None, last_episode: int
) -> None:
    """(ts, position, episode, step, status, turns) of the decision waiting for its bars; `previous`: the last
    settled decision."""
    ts, position, episode, step, status, turns = row
    on_candle(ts, position, candle_ts)
    if previous is not None and position != previous[1] + every:
        raise Damaged(f"its bar {position} is not decision_every ({every}) bars after the last settled "
                      f"decision's, {previous[1]}")
    check_step(status, episode, step, previous=previous, last_episode=last_episode)
    texts = json_value(turns, "turns")
    if not isinstance(texts, list) or not all(isinstance(item, str) for item in texts):
        raise Damaged("turns is not a JSON list of texts")
    if (status == DECIDED) != bool(texts):
        raise Damaged(f"a {status} decision with {len(texts)} turns: a decided one has turns, a skipped one none")


# ---------------------------------------------------------------------------------------------- turns


def check_info(info: dict[str, Any], *, position: int, every: int, step: int, last: bool) -> None:
    """The env's step record of a turn of the decision at bar `position` (its `step`; `last`: the turn that
    ended it), as the report reads it."""
    for key in ("decision_done", "forced_hold"):
        if not isinstance(info.get(key), bool):
            raise Damaged(f"info's {key} is {_shown(info.get(key))}, not true or false")
    if info["decision_done"] != last:
        raise Damaged("info's decision_done is " + ("false on the decision's last turn" if last else
                                                    "true before the decision's last turn"))
    if integer(info.get("decision_index"), "info's decision_index") != step:
        raise Damaged(f"info's decision_index is {info['decision_index']}, not the decision's step, {step}")
    for key in ("parse_error", "tool_error"):
        if info.get(key) is not None:
            text_value(info[key], f"info's {key}")
    order = info.get("order")
    if (order is None) == last:
        raise Damaged("info's order is " + ("missing on the decision's last turn" if last else
                                            "set before the decision's last turn"))
    if order is not None:
        if not isinstance(order, dict):
            raise Damaged("info's order is not an object")
        text_value(order.get("action"), "info's order action")
        if order.get("target") is not None:
            number(order["target"], "info's order target")
    fills = info.get("fills")
    if not isinstance(fills, list) or not all(isinstance(fill, dict) for fill in fills):
        raise Damaged("info's fills is not a list of objects")
    for fill in fills:
        integer(fill.get("bar"), "a fill's bar", low=position + 1, high=position + every)
        number(fill.get("units"), "a fill's units")
        number(fill.get("price"), "a fill's price", above=0.0)
        number(fill.get("fee"), "a fill's fee", at_least=0.0)
        number(fill.get("realized_pnl"), "a fill's realized_pnl")
        text_value(fill.get("reason"), "a fill's reason")
    for key in ("info_tools", "info_tools_offered"):
        names = info.get(key)
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise Damaged(f"info's {key} is not a list of tool names")
    if info.get("direction_right") is not None and not isinstance(info["direction_right"], bool):
        raise Damaged(f"info's direction_right is {_shown(info['direction_right'])}, not true, false or null")


# ---------------------------------------------------------------------------------------------- equity


def check_mark(
    row: Sequence[Any], *, candle_ts: Sequence[int], expected_position: int, holder: Sequence[Any] | None
) -> None:
    """(ts, position, episode, window_equity, equity) of the equity at the bar after the previous mark's; `holder`:
    the settled decision whose bars hold it (None for the first decision's own bar, marked before it trades)."""
    ts, position, episode, window_equity, equity = row
    on_candle(ts, position, candle_ts)
    if position != expected_position:
        raise Damaged(f"its bar {position} is not the bar after the previous mark's, {expected_position}")
    number(equity, "equity")
    expected_episode = None if holder is None else holder[2]
    if episode != expected_episode:
        raise Damaged(f"episode {_shown(episode)} is not {expected_episode}, the episode of the decision whose bars "
                      "hold it")
    if episode is not None:
        number(window_equity, "window_equity")
