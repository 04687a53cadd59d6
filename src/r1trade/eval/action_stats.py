"""What a policy does on held-out decisions: valid calls, the mix of trade actions, and how undecided it is.

A warm start should teach the tool-call format without choosing a strategy: it must make valid calls and still
spread probability over the trade actions, or RL has nothing to compare. `action_stats` plays held-out episodes
greedily through the real environment and measures both:
- the valid-call rate and the action mix (long, short, hold, close; information calls and malformed turns apart),
  greedy and sampled at the rollout temperature (the sampled mix is what RL explores with);
- at the *decision token* of each greedy trade turn, the policy's next-token entropy over the whole vocabulary. The
  decision token is the one after `Action:` when the turn has one (the `random` warm start's format), else the
  turn's first token. Where it follows `Action:`, the probabilities of the four action words (each word's whole
  token sequence) give the entropy of the action choice itself (ln 4 = 1.39 nats when all four are equally
  likely, 0 when one is certain);
- how it uses its information tools (`r1trade.env.information`): the share of trades after an information call,
  each tool's share, and direction accuracy with and without `get_changes`, greedy and sampled;
- direction accuracy (as the backtest counts it: the position points the way the market then moved; flat is
  wrong), greedy and sampled, and its expectation under the policy at the decision token: P(long) where the market
  rose, P(short) where it fell, over the four actions. The expectation moves smoothly while a policy learns, where
  the greedy and sampled rates jump by whole decisions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from r1trade.config import Config
from r1trade.env.demonstrations import TRADE_ACTIONS
from r1trade.env.information import information_use
from r1trade.env.trading_env import make_envs
from r1trade.rollout.backend import sampling_from_config
from r1trade.rollout.build import transformers_engine
from r1trade.rollout.decisions import action_word_ids, classify, decision_position
from r1trade.rollout.loop import Trajectory, Turn

OTHER = ("info", "malformed")


@dataclass
class ActionStats:
    decisions: int  # trade decisions reached
    turns: int
    valid_call_rate: float  # greedy turns with a well-formed, accepted call
    mix: dict[str, float]  # share of greedy turns: long, short, hold, close, info, malformed
    sampled_valid_call_rate: float
    sampled_mix: dict[str, float]  # the same at the rollout temperature
    decision_token_entropy: float  # mean nats over the vocabulary at the decision token
    action_prompt_share: float  # share of trade turns whose decision token follows `Action:`
    action_probabilities: dict[str, float]  # there: mean P(action word)
    action_entropy: float  # there: mean nats of the four-way action choice (renormalised)
    direction_accuracy: float  # greedy decisions whose position pointed the way the market moved
    sampled_direction_accuracy: float
    expected_direction_accuracy: float  # after `Action:`: mean P(the right direction) over the four actions
    information: dict = field(default_factory=dict)  # greedy: `r1trade.env.information.information_use`
    sampled_information: dict = field(default_factory=dict)
    per_decision: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def action_stats(
    policy, tokenizer, config: Config, *, split: str = "test", episodes: int = 16, seed: int = 0
) -> ActionStats:
    """Play `episodes` greedy episodes of `split` and measure the policy's actions (see the module docstring)."""
    seeds = [seed * 1_000_003 + i for i in range(episodes)]
    runs = {}
    for greedy in (True, False):
        engine = transformers_engine(policy, tokenizer, sampling_from_config(config.rollout, greedy=greedy))
        generator = torch.Generator().manual_seed(seed)
        runs[greedy] = engine.run(make_envs(config, episodes, split), seeds, generator=generator)
    ids = action_word_ids(tokenizer)
    temperature = config.rollout.temperature if config.rollout.temperature > 0 else 1.0
    per_decision = [
        _decision_token(policy, tokenizer, trajectory, turn, ids, temperature)
        for trajectory in runs[True] for turn in trajectory.turns if classify(turn) in TRADE_ACTIONS
    ]
    prompted = [d for d in per_decision if d["after_action_prompt"]]
    greedy_kinds, sampled_kinds = _kinds(runs[True]), _kinds(runs[False])
    expected = [d["expected_direction_accuracy"] for d in prompted if d["expected_direction_accuracy"] is not None]
    return ActionStats(
        decisions=len(per_decision),
        turns=len(greedy_kinds),
        valid_call_rate=_share(greedy_kinds, lambda k: k != "malformed"),
        mix={k: _share(greedy_kinds, lambda kind, k=k: kind == k) for k in (*TRADE_ACTIONS, *OTHER)},
        sampled_valid_call_rate=_share(sampled_kinds, lambda k: k != "malformed"),
        sampled_mix={k: _share(sampled_kinds, lambda kind, k=k: kind == k) for k in (*TRADE_ACTIONS, *OTHER)},
        decision_token_entropy=_mean([d["entropy"] for d in per_decision]),
        action_prompt_share=len(prompted) / max(1, len(per_decision)),
        action_probabilities={a: _mean([d["probabilities"][a] for d in prompted]) for a in TRADE_ACTIONS},
        action_entropy=_mean([d["action_entropy"] for d in prompted]),
        direction_accuracy=_direction_accuracy(runs[True]),
        sampled_direction_accuracy=_direction_accuracy(runs[False]),
        expected_direction_accuracy=_mean(expected),
        information=information_use([turn.info for t in runs[True] for turn in t.turns]),
        sampled_information=information_use([turn.info for t in runs[False] for turn in t.turns]),
        per_decision=per_decision,
    )


def _kinds(trajectories: list[Trajectory]) -> list[str]:
    return [classify(turn) for t in trajectories for turn in t.turns]


def _direction_accuracy(trajectories: list[Trajectory]) -> float:
    rights = [turn.info["direction_right"] for t in trajectories for turn in t.turns
              if turn.info.get("direction_right") is not None]
    return _mean([float(right) for right in rights])


def _share(items: list[str], keep) -> float:
    return sum(map(keep, items)) / max(1, len(items))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _decision_token(policy, tokenizer, trajectory: Trajectory, turn: Turn, words: dict[str, list[int]],
                    temperature: float) -> dict:
    segment = trajectory.segments[turn.segment]
    sampled = segment.token_ids[turn.start : turn.end]
    offset = decision_position(tokenizer, sampled)
    position = turn.start + offset
    prefix = torch.tensor([segment.token_ids[:position]], device=next(policy.parameters()).device)  # (1, P)
    logprobs = torch.log_softmax(policy(input_ids=prefix).logits[0, -1].float() / temperature, dim=-1)  # (V,)
    entropy = float(-(logprobs.exp() * logprobs).sum())
    probabilities = {a: math.exp(word_logprob(policy, prefix, logprobs, ids, temperature)) for a, ids in words.items()}
    total = sum(probabilities.values())
    shares = [p / total for p in probabilities.values() if p > 0] if total > 0 else []
    move = turn.info.get("move_sign")
    expected = expected_direction(probabilities, move) if offset > 0 and move is not None else None
    return {
        "action": classify(turn),
        "after_action_prompt": offset > 0,
        "entropy": entropy,
        "probabilities": probabilities,
        "action_entropy": -sum(p * math.log(p) for p in shares),
        "direction_right": turn.info.get("direction_right"),
        "move_sign": move,
        "expected_direction_accuracy": expected,
    }


def expected_direction(probabilities: dict[str, float], move_sign: int) -> float:
    """P(the side the market then took) among the four action words' `probabilities`: long if it rose (+1),
    short if it fell (-1); an unchanged market (0) has no right side."""
    total = sum(probabilities.values())
    side = {1: "long", -1: "short"}.get(move_sign)
    return probabilities[side] / total if side is not None and total > 0 else 0.0


def word_logprob(policy, prefix: torch.Tensor, first: torch.Tensor, ids: list[int], temperature: float) -> float:
    """log P(the tokens `ids` follow `prefix`) at `temperature`; `first` is the next-token distribution after it."""
    if len(ids) == 1:
        return float(first[ids[0]])
    full = torch.cat([prefix, torch.tensor([ids[:-1]], device=prefix.device)], dim=1)  # (1, P + n - 1)
    start = prefix.shape[1] - 1
    logits = policy(input_ids=full).logits[0, start : start + len(ids)].float() / temperature  # (n, V)
    return float(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids, device=logits.device)[:, None]).sum())
