"""A held-out learning curve without generation: which way a policy turns at fresh decisions of a split.

For a policy that trades in the random warm start's format (`<observed changes>. Action: <action>.` and the call),
the decision is the word after `Action:`, and the call carries it out. `probe_points` opens a one-decision episode
at each of N evenly spaced decision bars of a split (bars where a planted interval ends, when the data has them),
appends the line the format opens with, up to `Action:`, and records how the market then moved over the decision
interval (the env's `move_sign`). `probe` reads, at the sampling temperature and one forward pass per batch (the
system prompt once per batch), the policy's probabilities of the four action words there, and after each of
`Action: long.` and `Action: short.` the probability that the order's `"side"` is long or short. What the policy
would *do* is the word's probability times its call's side: P(long) = P(long) P(side long | long) + P(short)
P(side long | short), and likewise short; hold and close are their words'. (A small model can learn to trade
through the call's side while its stated word stays a coin flip: reading only the word would miss that.) From these:
- expected direction accuracy: the mean of P(long) where the market rose and P(short) where it fell, the four
  actions' probabilities renormalised (an unchanged market: no side is right);
- greedy direction accuracy: the most probable action points the way the market moved (flat is wrong);
- the mean share of long, beside the share of points where the market rose (what always-long scores);
- how often the call's side follows the stated word.
Every checkpoint of a run is scored on the same prefixes, so the curve moves with the policy alone; `probe_run`
draws it for a run's start and its checkpoints.

Where a decision's context depends on the policy, the probe follows the policy (`follows_policy`): under
`env.observation: price_only` the changes are not in the observation, so the policy has to fetch them, and in
episodes of several decisions (`env.episode_decisions` > 1) a later decision sees the earlier ones' turns and the
position they left. There each window is played greedily, the policy calling the tools it chooses, and the
probabilities are read in each of its own trade turns, after the tool results and its text up to `Action:`. The
prefixes then move with the policy, and the result adds how often it looked first (`info_call_rate`), how often
at `get_changes` (`signal_call_rate`), the expected accuracy with and without that call, and the expected accuracy
at each decision index of a window (`expected_accuracy_by_decision`: a policy that learned only the first
decision shows it there).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from r1trade.config import Config, load_config
from r1trade.env.demonstrations import ACTION_PROMPT, TRADE_ACTIONS, observed_changes, random_turn
from r1trade.env.information import SIGNAL_TOOL
from r1trade.env.trading_env import FixedStart, make_envs
from r1trade.errors import UsageError
from r1trade.eval.action_stats import expected_direction, word_logprob
from r1trade.models.chat import ChatTokens
from r1trade.models.loading import load_agent_models
from r1trade.models.scoring import backbone_hidden, causal_lm
from r1trade.outputs import write_file
from r1trade.rl.checkpoint import load_policy
from r1trade.rl.checkpoint_paths import list_checkpoints
from r1trade.rollout.backend import sampling_from_config
from r1trade.rollout.build import transformers_engine
from r1trade.rollout.decisions import SIDES, action_word_ids

CALL_PREFIX = '<tool_call>{"name": "place_order", "arguments": {"side": "'
"""How the format's order call opens, up to its side (`random_turn` writes the side first)."""


@dataclass
class ProbePoint:
    bar: int  # the decision bar, in the split
    move_sign: int  # +1 the market rose over the decision interval, -1 it fell, 0 unchanged
    input_ids: list[int]  # the context up to and including `Action:`
    call_ids: dict[str, list[int]]  # per stated side (long, short): the context on to the order's `"side": "`
    info_tools: list[str] | None = None  # price_only: the information tools the policy called first, in order
    decision: int = 0  # the decision's index in its window (0: the first)


@dataclass
class ProbeResult:
    points: int
    expected_direction_accuracy: float
    greedy_direction_accuracy: float
    long_share: float  # mean renormalised P(long)
    up_share: float  # points where the market rose: the accuracy of always long, the bar a learned rule must clear
    # P(long) where the market then rose minus P(long) where it fell: 0 for any policy blind to the market (always
    # long, a coin of any bias), 1 for a perfect one; None without both kinds of points
    discrimination: float | None
    call_follows_word: float  # mean P(the call's side is the stated word), given a stated long or short
    # price_only (None otherwise): the share of points whose trade came after an information call, after a
    # get_changes call, and the expected direction accuracy of the points with and without get_changes
    info_call_rate: float | None
    signal_call_rate: float | None
    expected_accuracy_with_signal: float | None
    expected_accuracy_without_signal: float | None
    expected_accuracy_by_decision: dict[int, float]  # per decision index of a window (0: the first)
    probabilities: list[dict[str, float]]  # per point: P of each action, as the call carries it out
    word_probabilities: list[dict[str, float]]  # per point: P of each action word after `Action:`

    def summary(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if k not in ("probabilities", "word_probabilities")}


def follows_policy(config: Config) -> bool:
    """Whether a decision's context depends on the policy's own earlier turns (see the module docstring)."""
    return config.env.observation == "price_only" or config.env.episode_decisions > 1


def probe_points(config: Config, tokenizer, *, split: str = "test", count: int = 200,
                 policy=None) -> list[ProbePoint]:
    """`count` decision contexts at evenly spaced decision bars of `split` (fewer if the split is shorter).

    Where the probe follows the policy (`follows_policy`), they are the contexts `policy` reaches in its greedy
    play of enough windows of `env.episode_decisions` decisions for `count` (rounded up to whole windows), so
    `policy` is required there.
    """
    (env,) = make_envs(config, 1, split)
    if follows_policy(config):
        if policy is None:
            raise UsageError("this probe follows the policy's own turns (price_only or several decisions): pass "
                             "the policy")
        decisions = config.env.episode_decisions
        bars = _decision_bars(env, config, split, -(-count // decisions), decisions)  # windows enough for `count`
        return _policy_points(config, policy, tokenizer, bars, split, decisions)
    bars = _decision_bars(env, config, split, count)
    chat = ChatTokens(tokenizer)
    rng = np.random.default_rng(0)
    points = []
    for bar in bars:
        messages, _ = env.reset(options={"start": int(bar), "decisions": 1})
        opening = f"{observed_changes(env)}. {ACTION_PROMPT}"
        context = chat.context(messages)
        *_, info = env.step(random_turn(env, rng, ["long"], plain=True))  # any order: it reveals the move
        points.append(_point(tokenizer, int(bar), int(info["move_sign"]), context, opening))
    return points


def _decision_bars(env, config: Config, split: str, count: int, decisions: int = 1) -> np.ndarray:
    """Up to `count` evenly spaced decision bars of the env's split (on the planted intervals' grid, if any), each
    with room for `decisions` decisions."""
    every, warmup = config.env.decision_every, config.env.warmup_bars
    latest = len(env.replay) - 1 - every * decisions
    grid = env.replay.decision_grid
    first = grid.next_on_grid(warmup) if grid is not None else warmup
    step = grid.every if grid is not None else 1
    bars = np.arange(first, latest + 1, step)
    if len(bars) == 0:
        raise UsageError(f"the {split} split has no room for a decision after {warmup} warm-up bars")
    return bars[np.unique(np.linspace(0, len(bars) - 1, min(count, len(bars))).round().astype(int))]


def _point(tokenizer, bar: int, move_sign: int, context: list[int], opening: str,
           info_tools: list[str] | None = None, decision: int = 0) -> ProbePoint:
    """The point whose prefix is `context` then `opening` (text ending in `Action:`), and its two call prefixes."""
    ids = context + tokenizer(opening, add_special_tokens=False)["input_ids"]
    calls = {side: context + tokenizer(f"{opening} {side}.\n{CALL_PREFIX}", add_special_tokens=False)["input_ids"]
             for side in SIDES}
    return ProbePoint(bar, move_sign, ids, calls, info_tools, decision)


def _policy_points(config: Config, policy, tokenizer, bars: np.ndarray, split: str,
                   decisions: int) -> list[ProbePoint]:
    """A point at each decision of the policy's greedy windows of `decisions` decisions from `bars`: its context is
    the window's conversation up to that decision's trade turn's `Action:` (or, where that turn has no `Action:`,
    the context before the turn with `Action:` appended)."""
    envs = make_envs(config, len(bars), split)
    engine = transformers_engine(policy, tokenizer, sampling_from_config(config.rollout, greedy=True))
    played = engine.run([FixedStart(env, int(bar), decisions) for env, bar in zip(envs, bars, strict=True)],
                        [config.seed + k for k in range(len(bars))])
    every = config.env.decision_every
    points = []
    for bar, trajectory in zip(bars, played, strict=True):
        for turn in trajectory.turns:
            if not turn.info["decision_done"]:  # an information call, or a malformed turn
                continue
            context = trajectory.segments[turn.segment].token_ids[: turn.start]
            cut = turn.text.find(ACTION_PROMPT)
            opening = turn.text[: cut + len(ACTION_PROMPT)] if cut >= 0 else ACTION_PROMPT
            index = int(turn.info["decision_index"])
            points.append(_point(tokenizer, int(bar) + index * every, int(turn.info["move_sign"]), context, opening,
                                 list(turn.info["info_tools"]), index))
    return points


@torch.no_grad()
def probe(policy, tokenizer, points: list[ProbePoint], *, temperature: float = 1.0,
          batch_size: int = 16) -> ProbeResult:
    """The policy's action-word probabilities at `points` and the direction accuracies they imply."""
    training = policy.training
    policy.eval()  # no adapter dropout
    try:
        words = _probabilities(policy, tokenizer, [p.input_ids for p in points], action_word_ids(tokenizer),
                               temperature, batch_size)
        side_ids = {side: tokenizer(side, add_special_tokens=False)["input_ids"] for side in SIDES}
        sides = {stated: _probabilities(policy, tokenizer, [p.call_ids[stated] for p in points], side_ids,
                                        temperature, batch_size) for stated in SIDES}
    finally:
        policy.train(training)
    per_point = [{stated: sides[stated][k] for stated in SIDES} for k in range(len(points))]
    calls = [carried_out(word, side) for word, side in zip(words, per_point, strict=True)]
    greedy = [float(max(TRADE_ACTIONS, key=p.__getitem__) == {1: "long", -1: "short"}.get(point.move_sign))
              for point, p in zip(points, calls, strict=True)]
    follows = [_follows(word, side) for word, side in zip(words, per_point, strict=True)]
    return ProbeResult(
        points=len(points),
        expected_direction_accuracy=float(np.mean([
            expected_direction(p, point.move_sign) for point, p in zip(points, calls, strict=True)
        ])),
        greedy_direction_accuracy=float(np.mean(greedy)),
        long_share=float(np.mean([expected_direction(p, 1) for p in calls])),  # P(long), renormalised
        up_share=float(np.mean([p.move_sign > 0 for p in points])),
        discrimination=discrimination(calls, [point.move_sign for point in points]),
        call_follows_word=float(np.mean(follows)),
        **_information(points, calls),
        expected_accuracy_by_decision=_by_decision(points, calls),
        probabilities=calls,
        word_probabilities=words,
    )


def _information(points: list[ProbePoint], calls: list[dict[str, float]]) -> dict[str, float | None]:
    """The information fields of `ProbeResult` (all None for points without tool turns)."""
    keys = ("info_call_rate", "signal_call_rate", "expected_accuracy_with_signal", "expected_accuracy_without_signal")
    if any(point.info_tools is None for point in points):
        return dict.fromkeys(keys)
    looked = [SIGNAL_TOOL in point.info_tools for point in points]
    expected = [expected_direction(p, point.move_sign) for point, p in zip(points, calls, strict=True)]
    with_signal = [e for e, hit in zip(expected, looked, strict=True) if hit]
    without = [e for e, hit in zip(expected, looked, strict=True) if not hit]
    return dict(zip(keys, (
        float(np.mean([bool(point.info_tools) for point in points])),
        float(np.mean(looked)),
        float(np.mean(with_signal)) if with_signal else None,
        float(np.mean(without)) if without else None,
    ), strict=True))


def _by_decision(points: list[ProbePoint], calls: list[dict[str, float]]) -> dict[int, float]:
    """The expected direction accuracy of the points at each decision index."""
    expected: dict[int, list[float]] = {}
    for point, p in zip(points, calls, strict=True):
        expected.setdefault(point.decision, []).append(expected_direction(p, point.move_sign))
    return {index: float(np.mean(values)) for index, values in sorted(expected.items())}


def carried_out(words: dict[str, float], sides: dict[str, dict[str, float]]) -> dict[str, float]:
    """P of each action as the call carries it out: a stated long or short by its call's side (renormalised over
    long and short), hold and close as stated.

    >>> p = carried_out({"long": 0.5, "short": 0.3, "hold": 0.1, "close": 0.1},
    ...                 {"long": {"long": 0.9, "short": 0.1}, "short": {"long": 0.6, "short": 0.2}})
    >>> {action: round(q, 6) for action, q in p.items()}  # long: 0.5 * 0.9 + 0.3 * 0.75
    {'long': 0.675, 'short': 0.125, 'hold': 0.1, 'close': 0.1}
    """
    out = dict(words)
    out["long"] = out["short"] = 0.0
    for stated in SIDES:
        for side in SIDES:
            out[side] += words[stated] * _side_share(sides[stated], side)
    return out


def _follows(words: dict[str, float], sides: dict[str, dict[str, float]]) -> float:
    """P(the call's side is the stated word | the word is long or short)."""
    stated = words["long"] + words["short"]
    agree = sum(words[s] * _side_share(sides[s], s) for s in SIDES)
    return agree / stated if stated > 0 else 0.0


def _side_share(probabilities: dict[str, float], side: str) -> float:
    """P(`side`) renormalised over long and short (even odds if both are 0)."""
    total = sum(probabilities.values())
    return probabilities[side] / total if total > 0 else 0.5


def discrimination(probabilities: list[dict[str, float]], move_signs: list[int]) -> float | None:
    """Mean renormalised P(long) at the points where the market rose minus that where it fell.

    It separates skill from bias: a policy that ignores the market has the same P(long) at both kinds of points,
    so it scores 0 whatever its lean, while expected accuracy rewards always-long on a rising split.

    >>> round(discrimination([{"long": 0.9, "short": 0.1}, {"long": 0.6, "short": 0.4},
    ...                       {"long": 0.5, "short": 0.5}], [1, -1, 0]), 6)
    0.3
    """
    rose = [expected_direction(p, 1) for p, sign in zip(probabilities, move_signs, strict=True) if sign > 0]
    fell = [expected_direction(p, 1) for p, sign in zip(probabilities, move_signs, strict=True) if sign < 0]
    if not rose or not fell:
        return None
    return float(np.mean(rose) - np.mean(fell))


def _probabilities(policy, tokenizer, contexts: list[list[int]], words: dict[str, list[int]], temperature: float,
                   batch_size: int) -> list[dict[str, float]]:
    """Per context, P(each of `words` follows it): rows batched, right-padded, the common prefix once."""
    device = next(policy.parameters()).device
    head = causal_lm(policy).get_output_embeddings()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    probabilities = []
    for start in range(0, len(contexts), batch_size):
        batch = contexts[start : start + batch_size]
        width = max(len(c) for c in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, T)
        mask = torch.zeros_like(ids)
        for row, context in enumerate(batch):
            ids[row, : len(context)] = torch.tensor(context)
            mask[row, : len(context)] = 1
        ids, mask = ids.to(device), mask.to(device)
        hidden = backbone_hidden(policy, ids, mask, share_prefix=True)  # (B, T, H)
        last = hidden[torch.arange(len(batch), device=device), mask.sum(1) - 1]  # (B, H)
        logprobs = torch.log_softmax(head(last).float() / temperature, dim=-1)  # (B, V)
        for row, context in enumerate(batch):
            prefix = torch.tensor([context], device=device)
            probabilities.append({
                word: math.exp(word_logprob(policy, prefix, logprobs[row], tokens, temperature))
                for word, tokens in words.items()
            })
    return probabilities


def probe_run(run_dir: Path, *, every: int = 1, count: int = 200, split: str = "test",
              on_step=None) -> list[dict]:
    """Probe a run's starting policy (step 0) and every `every`-th checkpoint (and its last) on `split`.

    Results go to `<run_dir>/probe-<split>.json` (a list of {step, ...summary}) after each checkpoint; steps already
    there with the same probe size are not probed again, so the curve can grow while the run trains.
    """
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"'{run_dir}' is not a run directory (no config.yaml)")
    config = load_config(run_dir / "config.yaml")
    checkpoints = list_checkpoints(run_dir)
    steps = [step for step, _ in checkpoints]
    chosen = {0, *(s for s in steps if s % every == 0), *(steps[-1:])}
    path = run_dir / f"probe-{split}.json"
    # records of another probe size, or from before the probe read the call's side, are probed again
    records = [r for r in (json.loads(path.read_text()) if path.is_file() else [])
               if r.get("points_asked") == count and "call_follows_word" in r]
    done = {r["step"] for r in records}
    todo = sorted(chosen - done)
    if not todo:
        return records
    models = load_agent_models(config.model, seed=config.seed)
    follows_tools = follows_policy(config)  # the points move with the policy's own turns
    points = None if follows_tools else probe_points(config, models.tokenizer, split=split, count=count)
    temperature = config.rollout.temperature if config.rollout.temperature > 0 else 1.0
    by_step = dict(checkpoints)
    for step in todo:
        if step > 0:
            load_policy(models, by_step[step] / "policy")
        if follows_tools:
            points = probe_points(config, models.tokenizer, split=split, count=count, policy=models.policy)
        result = probe(models.policy, models.tokenizer, points, temperature=temperature)
        record = {"step": step, "points_asked": count, **result.summary()}
        records = sorted([*records, record], key=lambda r: r["step"])
        write_file(path, json.dumps(records, indent=1) + "\n")
        if on_step is not None:
            on_step(record)
    return records
