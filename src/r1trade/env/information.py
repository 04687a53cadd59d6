"""How a policy uses its information tools, and how it fares decision by decision, from the env's step infos: the
same figures in training and reports.

A decision is the turn that ended it (a trade tool or a forced hold); its info lists, under `info_tools`, the
information tools called before it in the same decision. `get_changes` is the tool that carries the recent price
changes under `env.observation: price_only`, the signal a planted-edge market rewards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

SIGNAL_TOOL = "get_changes"
ACTION_KINDS = ("Long", "Short", "Close", "Hold", "Forced Hold")
"""How a decision ended: a long or short order, close_position, hold, or the env's forced hold."""


def information_use(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over the decisions among `infos` (step infos of any turns):

    - `info_call_rate`: the share of decisions whose trade came after at least one information call;
    - `tool_rates`: per tool offered (`info_tools_offered`) or called, the share of decisions that called it (once or
      more): a tool never called shows as 0.0;
    - `accuracy_with_signal` / `accuracy_without_signal`: direction accuracy of the decisions that did or did not
      call `get_changes` (None where there are none).
    Empty (no decisions): rates 0.0 and accuracies None.

    >>> decisions = [
    ...     {"info_tools": ["get_changes"], "direction_right": True},
    ...     {"info_tools": ["get_candles", "get_changes"], "direction_right": False},
    ...     {"info_tools": [], "info_tools_offered": ["get_candles", "get_changes", "get_sentiment"],
    ...      "direction_right": True},
    ...     {"info_tools": None},  # an information turn: not a decision
    ... ]
    >>> use = information_use(decisions)
    >>> use["info_call_rate"], use["accuracy_with_signal"], use["accuracy_without_signal"]
    (0.6666666666666666, 0.5, 1.0)
    >>> use["tool_rates"]  # get_sentiment was offered and never called
    {'get_candles': 0.3333333333333333, 'get_changes': 0.6666666666666666, 'get_sentiment': 0.0}
    """
    decisions = [info for info in infos if info.get("info_tools") is not None]
    count = len(decisions)
    called = Counter(name for info in decisions for name in set(info["info_tools"]))
    tools = set(called).union(*(info.get("info_tools_offered") or () for info in decisions))
    with_signal = [bool(info["direction_right"]) for info in decisions if SIGNAL_TOOL in info["info_tools"]]
    without = [bool(info["direction_right"]) for info in decisions if SIGNAL_TOOL not in info["info_tools"]]
    return {
        "info_call_rate": sum(bool(info["info_tools"]) for info in decisions) / count if count else 0.0,
        "tool_rates": {name: called[name] / count for name in sorted(tools)},
        "accuracy_with_signal": sum(with_signal) / len(with_signal) if with_signal else None,
        "accuracy_without_signal": sum(without) / len(without) if without else None,
    }


def accuracy_by_decision(infos: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Direction accuracy at each decision index of an episode (0 = its first decision), over the decisions among
    `infos`: a policy that learned only the first decision of an episode shows it here.

    >>> accuracy_by_decision([
    ...     {"decision_index": 0, "direction_right": True}, {"decision_index": 1, "direction_right": False},
    ...     {"decision_index": 0, "direction_right": False}, {"decision_index": 1, "direction_right": None},
    ... ])
    {0: 0.5, 1: 0.0}
    """
    hits: dict[int, list[bool]] = {}
    for info in infos:
        if info.get("direction_right") is not None:
            hits.setdefault(int(info.get("decision_index", 0)), []).append(bool(info["direction_right"]))
    return {index: sum(right) / len(right) for index, right in sorted(hits.items())}


def decision_kind(info: Mapping[str, Any]) -> str:
    """Which of `ACTION_KINDS` ended the decision whose step info this is."""
    if info["forced_hold"]:
        return "Forced Hold"
    order = info["order"]
    if order["action"] == "place_order":
        return "Long" if order["target"] > 0 else "Short"
    return "Close" if order["action"] == "close_position" else "Hold"


def action_mix(decisions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each of `ACTION_KINDS`' share of `decisions` (0 included); empty without decisions."""
    if not decisions:
        return {}
    kinds = Counter(decision_kind(info) for info in decisions)
    return {kind: kinds[kind] / len(decisions) for kind in ACTION_KINDS}
