"""The optional stabilisers against hand-worked numbers: GiGPO's step-level groups, DAPO's dynamic sampling and
sequence- against token-level loss averaging; each off by default."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.config import load_config
from r1trade.errors import ConfigError
from r1trade.rl.advantages import compute_advantages, shared_step_group_rate
from r1trade.rl.batch import anchor_states, collate, trajectory_scores
from r1trade.rl.group_filters import drop_uniform_groups
from r1trade.rl.losses import policy_loss, sequence_weights, token_mean
from r1trade.rollout.loop import Segment, Trajectory, Turn

CHANGES, CANDLES = (50, 51), (60, 61)  # the token ids of two tools' answers


def episode(group: int, answer: tuple[int, ...], rewards: tuple[float, float], own: tuple[int, int] = (10, 11),
            units: float = 1.0) -> Trajectory:
    """One decision in two turns: a look (sampled tokens `own`, positions 2-3), the environment's `answer`
    (positions 4-5), then the trade (positions 6-7, leaving `units` held). Each turn's reward on its last token."""
    segment = Segment()
    segment.extend([1, 2], sampled=False)  # the system prompt and the window's observation
    segment.extend(list(own), sampled=True, logprobs=[-1.0, -1.0])
    segment.extend(list(answer), sampled=False)
    segment.extend([12, 13], sampled=True, logprobs=[-1.0, -1.0])
    segment.rewards[3], segment.rewards[7] = rewards
    turns = [
        Turn(0, 2, 4, "look", rewards[0], False, {"decision_index": 0, "decision_done": False, "position": 0.0}),
        Turn(0, 6, 8, "trade", rewards[1], False, {"decision_index": 0, "decision_done": True, "position": units}),
    ]
    return Trajectory(seed=0, group=group, segments=[segment], turns=turns)


# Two windows (groups) of three episodes, two turns each (look, then trade), rewards (look, trade):
#   window 0: A looks at get_changes (0.3, 1.0), B at get_changes (0.3, -1.0), C at get_candles (0.0, 0.6);
#   window 1: D, E and F all look at get_changes (the same answer tokens as A's): (0.3, 0.4), (0.3, 0.0), (0.3, -0.4).
EPISODES = [
    episode(0, CHANGES, (0.3, 1.0)), episode(0, CHANGES, (0.3, -1.0)), episode(0, CANDLES, (0.0, 0.6)),
    episode(1, CHANGES, (0.3, 0.4)), episode(1, CHANGES, (0.3, 0.0)), episode(1, CHANGES, (0.3, -0.4)),
]


def step_group_config(*extra: str):
    return load_config(None, ["train.algorithm=dr_grpo", "train.group_size=3", "train.kl_coef=0", "train.gamma=0.5",
                              "train.step_groups=true", *extra]).train


def test_step_groups_by_hand() -> None:
    # Dr. GRPO (no std), gamma 0.5, w 1.
    # Episode term, score minus the window's mean:
    #   window 0: 1.3, -0.7, 0.6 (mean 0.4) -> A 0.9, B -1.1, C 0.2;
    #   window 1: 0.7, 0.3, -0.1 (mean 0.3) -> D 0.4, E 0, F -0.4.
    # Step groups: every look of a window faces the same state (nothing answered yet); a trade faces the window and
    # the answer it read: {A, B} and {C} in window 0 (C alone: step term 0), {D, E, F} in window 1 (D's answer is
    # A's, but another window's). Step returns: look = r_look + 0.5 r_trade, trade = r_trade.
    #   window 0 looks: 0.3 + 0.5 = 0.8, 0.3 - 0.5 = -0.2, 0 + 0.3 = 0.3 (mean 0.3) -> 0.5, -0.5, 0.0
    #   window 0 trades: {A, B} 1.0, -1.0 (mean 0) -> 1.0, -1.0;  {C} -> 0
    #   window 1 looks: 0.5, 0.3, 0.1 (mean 0.3) -> 0.2, 0, -0.2;  trades 0.4, 0.0, -0.4 (mean 0) -> 0.4, 0, -0.4
    # A = episode + step: A (0.9 + 0.5, 0.9 + 1.0) = (1.4, 1.9), B (-1.6, -2.1), C (0.2, 0.2),
    #                     D (0.4 + 0.2, 0.4 + 0.4) = (0.6, 0.8), E (0, 0), F (-0.6, -0.8).
    batch = collate(EPISODES, pad_id=0)
    out = compute_advantages(batch, step_group_config())
    expected = {0: (1.4, 1.9), 1: (-1.6, -2.1), 2: (0.2, 0.2), 3: (0.6, 0.8), 4: (0.0, 0.0), 5: (-0.6, -0.8)}
    for row, (look, trade) in expected.items():
        torch.testing.assert_close(out.advantages[row], torch.tensor([0, 0, look, look, 0, 0, trade, trade]))
    # Five step groups (two looks, three trades); all but {C} have more than one member.
    assert shared_step_group_rate(out) == pytest.approx(4 / 5)
    # w = 0.5 halves the step term: A's trade 0.9 + 0.5 * 1.0 = 1.4; off, the episode term alone.
    half = compute_advantages(batch, step_group_config("train.step_group_weight=0.5"))
    assert half.advantages[0, 6].item() == pytest.approx(1.4)
    off = compute_advantages(batch, step_group_config("train.step_groups=false"))
    torch.testing.assert_close(off.advantages[0], torch.tensor([0, 0, 0.9, 0.9, 0, 0, 0.9, 0.9]))
    # GRPO divides both terms by their group's std: in window 1 the episode scores, the looks' returns and the
    # trades' returns each lie at mean +- one std (0.4, 0.2, 0.4), so D gets 1 + 1 on both turns, E 0, F -2.
    grpo = compute_advantages(batch, step_group_config("train.algorithm=grpo"))
    torch.testing.assert_close(grpo.advantages[3:, [2, 6]], torch.tensor([[2.0, 2.0], [0.0, 0.0], [-2.0, -2.0]]),
                               atol=1e-4, rtol=0)


def test_turns_that_face_the_same_anchor_state_share_a_step_group_and_others_do_not() -> None:
    same_answer_other_words = episode(0, CHANGES, (0.0, 0.0), own=(14, 15))  # the model wrote other tokens
    trajectories = [episode(0, CHANGES, (0.0, 0.0)), same_answer_other_words, episode(0, CANDLES, (0.0, 0.0)),
                    episode(1, CHANGES, (0.0, 0.0))]
    states = [anchor_states(t) for t in trajectories]
    assert states[0] == states[1] == [(0, 0, 0, ()), (0, 0, 0, (CHANGES,))]
    assert states[2][0] == states[0][0] and states[2][1] != states[0][1]  # another answer: another state
    assert states[3][1] == (1, 0, 0, (CHANGES,))  # the same answer in another window: another state
    batch = collate(trajectories, pad_id=0)
    # ids in order of first appearance: looks 0 (window 0) and 3 (window 1); trades 1 (get_changes), 2 (get_candles), 4
    assert batch.anchor.tolist() == [
        [-1, -1, 0, 0, -1, -1, 1, 1], [-1, -1, 0, 0, -1, -1, 1, 1], [-1, -1, 0, 0, -1, -1, 2, 2],
        [-1, -1, 3, 3, -1, -1, 4, 4],
    ]


def test_positions_count_by_their_side_once_the_episodes_diverge() -> None:
    def two_decisions(units: float) -> Trajectory:
        segment = Segment()
        segment.extend([1, 2], sampled=False)
        segment.extend([10], sampled=True, logprobs=[-1.0])
        segment.extend([3], sampled=False)  # decision 1's observation (its equity differs: not part of the state)
        segment.extend([11], sampled=True, logprobs=[-1.0])
        turns = [Turn(0, 2, 3, "trade", 0.0, False, {"decision_index": 0, "position": units}),
                 Turn(0, 4, 5, "trade", 0.0, False, {"decision_index": 1, "position": units})]
        return Trajectory(seed=0, group=0, segments=[segment], turns=turns)

    second = {units: anchor_states(two_decisions(units))[1] for units in (0.5, 0.8, -0.5, 0.0)}
    assert second[0.5] == second[0.8] == (0, 1, 1, ())  # long, whatever the size
    assert second[-0.5] == (0, 1, -1, ()) and second[0.0] == (0, 1, 0, ())


def test_step_groups_need_a_group_algorithm_and_allow_turn_gamma() -> None:
    with pytest.raises(ConfigError, match="step_groups needs a group algorithm"):
        load_config(None, ["train.step_groups=true"])
    with pytest.raises(ConfigError, match="turn_gamma needs credit: turn"):
        load_config(None, ["train.algorithm=grpo", "train.group_size=2", "train.turn_gamma=1"])
    grouped = load_config(None, ["train.algorithm=grpo", "train.group_size=2", "train.turn_gamma=1",
                                 "train.step_groups=true"]).train
    assert grouped.turn_gamma == 1.0


def test_every_stabiliser_is_off_by_default() -> None:
    train = load_config(None).train
    assert (train.step_groups, train.dynamic_sampling, train.loss_aggregation) == (False, False, "token")
    assert train.side_balance_coef == 0.0
    for name in ("demo_tools", "tool_gated_tiny", "tool_gated"):
        shipped = load_config(name).train
        assert not shipped.step_groups and not shipped.dynamic_sampling, name


def scored(group: int, reward: float) -> Trajectory:
    segment = Segment()
    segment.extend([1], sampled=False)
    segment.extend([2], sampled=True, logprobs=[-1.0])
    segment.rewards[1] = reward
    return Trajectory(seed=0, group=group, segments=[segment],
                      turns=[Turn(0, 1, 2, "trade", reward, False, {"decision_index": 0})])


def test_dynamic_sampling_drops_the_groups_whose_rewards_do_not_vary() -> None:
    # Three groups of two: (1, 1) and (0.5, 0.5) do not vary, (0, 2) does: two of three groups dropped; the kept
    # trajectories are renumbered 0, 1.
    batch = collate([scored(g, r) for g, r in ((0, 1.0), (0, 1.0), (1, 0.0), (1, 2.0), (2, 0.5), (2, 0.5))], pad_id=0)
    kept, dropped = drop_uniform_groups(batch)
    assert dropped == pytest.approx(2 / 3)
    assert kept.group.tolist() == [1, 1] and kept.trajectory.tolist() == [0, 1]
    assert trajectory_scores(kept).tolist() == [0.0, 2.0]
    # When every group varies nothing is dropped; when none does the batch is kept whole (an update needs rows).
    for rewards in ((0.0, 2.0, 1.0, 3.0), (1.0, 1.0, 0.5, 0.5)):
        whole = collate([scored(g, r) for g, r in zip((0, 0, 1, 1), rewards, strict=True)], pad_id=0)
        assert drop_uniform_groups(whole) == (whole, 0.0)
    with pytest.raises(ConfigError, match="dynamic_sampling needs group_size >= 2"):
        load_config(None, ["train.dynamic_sampling=true"])


def test_sequence_and_token_level_loss_averaging_by_hand() -> None:
    # Trajectory 0 has three loss tokens over two rows (a context reset), trajectory 1 one; at ratio 1 each token's
    # loss is -A: trajectory 0's tokens A = +1, trajectory 1's A = -2. A NaN off the mask reaches nothing.
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 0]])
    trajectory = torch.tensor([0, 0, 1])
    advantages = torch.tensor([[1.0, 1.0, math.nan], [1.0, 0.0, 0.0], [-2.0, 0.0, 0.0]])
    logprobs = torch.zeros(3, 3, requires_grad=True)
    weights = sequence_weights(mask, trajectory)
    torch.testing.assert_close(weights, torch.tensor([[1 / 3, 1 / 3, 0], [1 / 3, 0, 0], [1.0, 0, 0]]))
    # token level (DAPO): -(1 + 1 + 1 - 2) / 4 = -0.25; sequence level: -(mean(1, 1, 1) + mean(-2)) / 2 = 0.5.
    token, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask)
    sequence, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, weights=weights)
    assert token.item() == pytest.approx(-0.25) and sequence.item() == pytest.approx(0.5)
    sequence.backward()  # d/dlogp of -A r w / sum(w): trajectory 0's tokens -1 / 3 / 2, trajectory 1's 2 / 2
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 6, -1 / 6, 0], [-1 / 6, 0, 0], [1.0, 0, 0]]))
    assert token_mean(torch.tensor([[4.0, 2.0]]), torch.tensor([[1, 1]]), torch.tensor([[1.0, 3.0]])).item() == 2.5
    with pytest.raises(ConfigError):
        load_config(None, ["train.loss_aggregation=episode"])
