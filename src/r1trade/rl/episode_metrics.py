"""The per-update record of what the episodes did: returns, reward components, PnL, call validity, accuracy.

Both training engines log it (r1trade's trainer and the TRL integration), so their `metrics.jsonl` compare.
"""

from __future__ import annotations

import torch

from r1trade.env.information import accuracy_by_decision, action_mix, information_use
from r1trade.rollout.loop import Trajectory


def episode_metrics(trajectories: list[Trajectory]) -> dict:
    """Per-update means over episodes: return, each reward component, PnL, valid-call rate, direction accuracy,
    the trade actions' shares, turn counts."""
    returns = torch.tensor([t.total_reward for t in trajectories])
    metrics: dict = {
        "episode_return": float(returns.mean()),
        "reward_std": float(returns.std()) if len(returns) > 1 else 0.0,
        "turns": sum(len(t.turns) for t in trajectories) / len(trajectories),
        "truncated_turn_rate": sum(turn.truncated for t in trajectories for turn in t.turns)
        / max(1, sum(len(t.turns) for t in trajectories)),
    }
    components: dict[str, float] = {}
    for trajectory in trajectories:
        for turn in trajectory.turns:
            for name, value in turn.info.get("reward_components", {}).items():
                components[name] = components.get(name, 0.0) + float(value)
    metrics.update({f"reward/{k}": v / len(trajectories) for k, v in sorted(components.items())})
    turns = [turn.info for t in trajectories for turn in t.turns if "parse_error" in turn.info]
    if turns:
        valid = [info["parse_error"] is None and info.get("tool_error") is None for info in turns]
        metrics["valid_call_rate"] = sum(valid) / len(valid)
    directions = [info["direction_right"] for info in turns if info.get("direction_right") is not None]
    if directions:  # the backtest's Direction Accuracy over this update's (sampled) decisions
        metrics["direction_accuracy"] = sum(directions) / len(directions)
    decisions = [turn.info for t in trajectories for turn in t.turns if turn.info.get("decision_done")]
    metrics.update({f"action_rate/{_key(kind)}": share for kind, share in action_mix(decisions).items()})
    by_index = accuracy_by_decision(turns)
    if len(by_index) > 1:
        metrics.update({f"direction_accuracy/decision_{k + 1}": share for k, share in by_index.items()})
    use = information_use(turns)
    if any(info.get("info_tools") is not None for info in turns):
        metrics["info_call_rate"] = use["info_call_rate"]
        metrics.update({f"tool_rate/{name}": rate for name, rate in use["tool_rates"].items()})
        for key in ("accuracy_with_signal", "accuracy_without_signal"):
            if use[key] is not None:
                metrics[f"direction_{key}"] = use[key]
    episodes = [t.final_info["episode"] for t in trajectories if "episode" in t.final_info]
    if episodes:
        metrics["episode_pnl_pct"] = sum(e["return_pct"] for e in episodes) / len(episodes)
        metrics["buy_and_hold_pct"] = sum(e["buy_and_hold_pct"] for e in episodes) / len(episodes)
        metrics["fees"] = sum(e["fees"] for e in episodes) / len(episodes)
    return metrics


def _key(kind: str) -> str:
    """`Forced Hold` -> `forced_hold`: a metrics key."""
    return kind.lower().replace(" ", "_")
