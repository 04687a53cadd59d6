"""Credit per decision: turn-level GAE, group baselines (GRPO, Dr. GRPO, RLOO) and the per-decision group term,
each against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.config import load_config
from r1trade.errors import ConfigError
from r1trade.rl.advantages import (
    compute_advantages,
    decision_group_advantages,
    group_relative,
    kl_in_loss,
    turn_discounts,
)
from r1trade.rl.batch import RolloutBatch, TurnView, collate
from r1trade.rollout.loop import Segment, Trajectory, Turn


def test_group_relative_baselines_by_hand() -> None:
    # Group 7: scores 1, 3, 5 (mean 3, unbiased std 2); group 4: scores 2, 2 (no spread); group 9: one sample.
    scores = torch.tensor([1.0, 3.0, 5.0, 2.0, 2.0, 8.0])
    groups = torch.tensor([7, 7, 7, 4, 4, 9])
    torch.testing.assert_close(group_relative(scores, groups, "mean"), torch.tensor([-2.0, 0.0, 2.0, 0, 0, 0]))
    torch.testing.assert_close(
        group_relative(scores, groups, "mean_std", eps=0.0), torch.tensor([-1.0, 0.0, 1.0, 0, 0, 0])
    )
    # Leave-one-out: 1 - (3 + 5) / 2 = -3, 3 - (1 + 5) / 2 = 0, 5 - (1 + 3) / 2 = 3.
    torch.testing.assert_close(
        group_relative(scores, groups, "leave_one_out"), torch.tensor([-3.0, 0.0, 3.0, 0, 0, 0])
    )
    with pytest.raises(ValueError, match="unknown group baseline"):
        group_relative(scores, groups, "median")


def test_decision_group_advantages_compare_each_decision_within_its_group() -> None:
    # Group 0 has three members; the third stopped after decision 0 (went bankrupt), so decision 1's step group
    # is the first two only. Group 1 has one member: nothing to compare with.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [2.0, 0.0], [5.0, 5.0]])
    present = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    groups = torch.tensor([0, 0, 0, 1])
    # Decision 0 in group 0: 1, 0, 2 (mean 1) -> 0, -1, 1. Decision 1: 0, 2 (mean 1) -> -1, 1.
    expected = torch.tensor([[0.0, -1.0], [-1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(decision_group_advantages(rewards, present, groups, "mean"), expected)
    # RLOO on decision 0: 1 - (0 + 2) / 2 = 0, 0 - 1.5 = -1.5, 2 - 0.5 = 1.5; decision 1 (two members): -2, 2.
    loo = torch.tensor([[0.0, -2.0], [-1.5, 2.0], [1.5, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(decision_group_advantages(rewards, present, groups, "leave_one_out"), loo)


def _batch(rows: list[dict], values: list[list[float]] | None = None) -> RolloutBatch:
    """A batch from per-row token lists: mask, turn, decision, reward (one row = one trajectory segment)."""
    width = max(len(row["mask"]) for row in rows)

    def pad(key: str, fill: float) -> torch.Tensor:
        return torch.tensor([row[key] + [fill] * (width - len(row[key])) for row in rows])

    batch = RolloutBatch(
        input_ids=torch.zeros(len(rows), width, dtype=torch.long),
        attention_mask=pad("mask", -1).ge(0).long(),
        action_mask=pad("mask", 0).clamp(min=0).float(),
        old_logprobs=torch.zeros(len(rows), width),
        rewards=pad("reward", 0.0).float(),
        trajectory=torch.tensor([row["trajectory"] for row in rows]),
        group=torch.tensor([row.get("group", 0) for row in rows]),
        turn=pad("turn", -1).long(),
        decision=pad("decision", -1).long(),
    )
    if values is not None:
        batch.old_values = torch.tensor([v + [0.0] * (width - len(v)) for v in values])
    return batch


# Trajectory 0: an observation token, turn 0 (tokens 1-2, reward 0.5), two observation tokens (the second carries
# a reward of 0.1 that belongs to turn 0), turn 1 (tokens 5-7, reward 1). Trajectory 1: one turn, reward 0.
ROWS = [
    {"trajectory": 0, "mask": [0, 1, 1, 0, 0, 1, 1, 1], "turn": [-1, 0, 0, -1, -1, 1, 1, 1],
     "decision": [-1, 0, 0, -1, -1, 1, 1, 1], "reward": [0, 0, 0.5, 0, 0.1, 0, 0, 1.0]},
    {"trajectory": 1, "mask": [0, 1, 1], "turn": [-1, 0, 0], "decision": [-1, 0, 0], "reward": [0, 0, 0.0]},
]
# V(state before token t); only the values at each turn's first token (0.2, 0.6 and 0.5) may matter.
VALUES = [[9.0, 0.2, 9.0, 9.0, 9.0, 0.6, 9.0, 9.0], [9.0, 0.5, 9.0]]


def test_turn_view_sums_rewards_per_turn_and_reads_values_at_turn_starts() -> None:
    batch = _batch(ROWS[:1], VALUES[:1])
    turns = TurnView(batch.turn, batch.action_mask, batch.attention_mask.float())
    torch.testing.assert_close(turns.sum(batch.rewards), torch.tensor([[0.6, 1.0]]))
    torch.testing.assert_close(turns.first(batch.old_values), torch.tensor([[0.2, 0.6]]))
    assert turns.first_token_mask().tolist() == [[0, 1, 0, 0, 0, 1, 0, 0]]
    torch.testing.assert_close(turns.broadcast(torch.tensor([[3.0, 4.0]])), torch.tensor([[0, 3, 3, 0, 0, 4, 4, 4.0]]))
    # Without the advantage mask observation tokens take the turn they lead into.
    open_turns = TurnView(batch.turn, batch.action_mask, batch.attention_mask.float(), advantage_mask=False)
    torch.testing.assert_close(open_turns.broadcast(torch.tensor([[3.0, 4.0]])), torch.tensor([[3, 3, 3, 4, 4, 4, 4, 4.0]]))


def test_turn_level_gae_by_hand() -> None:
    # gamma 0.9, lambda 0.8. Trajectory 0: r = (0.6, 1.0), V = (0.2, 0.6).
    #   delta_1 = 1.0 - 0.6 = 0.4 -> A_1 = 0.4;  delta_0 = 0.6 + 0.9 * 0.6 - 0.2 = 0.94 -> A_0 = 0.94 + 0.72 * 0.4
    #   = 1.228; returns 1.428 and 1.0. Trajectory 1: A = 0 - 0.5 = -0.5, return 0.
    config = load_config(None, ["train.gamma=0.9", "train.lam=0.8", "train.kl_coef=0"]).train
    assert config.algorithm == "ppo" and config.credit == "turn"
    out = compute_advantages(_batch(ROWS, VALUES), config)
    raw = torch.tensor([1.228, 0.4, -0.5])
    mean, std = raw.mean(), raw.std()  # whitened over turns: each turn counts once, whatever its length
    a0, a1, b0 = ((raw - mean) / std).tolist()
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, a0, a0, 0, 0, a1, a1, a1]))
    torch.testing.assert_close(out.advantages[1, :3], torch.tensor([0, b0, b0]))
    torch.testing.assert_close(out.returns[0], torch.tensor([0, 1.428, 0, 0, 0, 1.0, 0, 0]))
    torch.testing.assert_close(out.returns[1, :3], torch.tensor([0, 0.0, 0]))
    assert out.value_mask.tolist() == [[0, 1, 0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]


def test_token_level_credit_is_kept_for_the_ablation() -> None:
    # Same batch, credit per token with lambda 0 and gamma 1: each action token's advantage is r + V(next) - V.
    config = load_config(None, ["train.credit=token", "train.gamma=1", "train.lam=0", "train.kl_coef=0"]).train
    out = compute_advantages(_batch(ROWS[:1], VALUES[:1]), config)
    #   token 1: 0 + 9 - 0.2; token 2: 0.5 + 0.1 (folded) + 0.6 - 9; token 5: 0 + 9 - 0.6; 6: 9 - 9; 7: 1 - 9.
    raw = torch.tensor([8.8, -7.8, 8.4, 0.0, -8.0])
    expected = torch.zeros(8)
    expected[torch.tensor([1, 2, 5, 6, 7])] = (raw - raw.mean()) / raw.std()
    torch.testing.assert_close(out.advantages[0], expected)
    assert out.value_mask.tolist() == [ROWS[0]["mask"]]


def test_reinforce_pp_with_credit_per_turn_by_hand() -> None:
    # Turn rewards: trajectory 0 (0.6, 1.0), trajectory 1 (0.0). gamma 0.5: returns 0.6 + 0.5 * 1.0 = 1.1, 1.0, 0.0,
    # whitened over the three turns (each turn once, whatever its length), broadcast over the turn's tokens.
    config = load_config(None, ["train.algorithm=reinforce_pp", "train.gamma=0.5", "train.kl_coef=0"]).train
    assert config.credit == "turn"
    out = compute_advantages(_batch(ROWS), config)
    raw = torch.tensor([1.1, 1.0, 0.0])
    a0, a1, b0 = ((raw - raw.mean()) / raw.std()).tolist()
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, a0, a0, 0, 0, a1, a1, a1]))
    torch.testing.assert_close(out.advantages[1, :3], torch.tensor([0, b0, b0]))
    # gamma 0: each turn judged by its own reward against the batch, so two trajectories that made the same choice
    # on different windows still get a signal (a group baseline would give both 0).
    greedy = compute_advantages(_batch(ROWS), config.model_copy(update={"gamma": 0.0}))
    raw = torch.tensor([0.6, 1.0, 0.0])
    a0, a1, b0 = ((raw - raw.mean()) / raw.std()).tolist()
    torch.testing.assert_close(greedy.advantages[0], torch.tensor([0, a0, a0, 0, 0, a1, a1, a1]))
    torch.testing.assert_close(greedy.advantages[1, :3], torch.tensor([0, b0, b0]))
    # The KL penalty comes off each turn's reward (k1: old - ref log-prob summed over the turn's sampled tokens).
    batch = _batch(ROWS)
    batch.ref_logprobs = batch.old_logprobs - torch.tensor([[0, 0.1, 0.1, 0, 0, 0.2, 0.2, 0.2], [0, 0.3, 0.3] + [0] * 5])
    penalised = compute_advantages(batch, config.model_copy(update={"gamma": 0.0, "kl_coef": 0.5}))
    raw = torch.tensor([0.6 - 0.5 * 0.2, 1.0 - 0.5 * 0.6, 0.0 - 0.5 * 0.6])
    a0, a1, b0 = ((raw - raw.mean()) / raw.std()).tolist()
    torch.testing.assert_close(penalised.advantages[0], torch.tensor([0, a0, a0, 0, 0, a1, a1, a1]))
    torch.testing.assert_close(penalised.advantages[1, :3], torch.tensor([0, b0, b0]))


def test_group_baselines_with_the_per_decision_term_by_hand() -> None:
    # One group of two trajectories replaying the same window, two decisions each. Trajectory A's decision 0 takes
    # two turns (an information call rewarded 0.25, then a trade rewarded 0.75): decision rewards A = (1, 0),
    # B = (0, 2); episode scores 1 and 2.
    rows = [
        {"trajectory": 0, "mask": [0, 1, 0, 1, 0, 1], "turn": [-1, 0, -1, 1, -1, 2], "decision": [-1, 0, -1, 0, -1, 1],
         "reward": [0, 0.25, 0, 0.75, 0, 0.0]},
        {"trajectory": 1, "mask": [0, 1, 0, 1], "turn": [-1, 0, -1, 1], "decision": [-1, 0, -1, 1],
         "reward": [0, 0.0, 0, 2.0]},
    ]
    # Dr. GRPO episode term: 1 - 1.5 = -0.5 and +0.5. Decision term: decision 0: 1 vs 0 (mean 0.5) -> +0.5, -0.5;
    # decision 1: 0 vs 2 (mean 1) -> -1, +1. With weight 0.5: A's decision 0 = -0.5 + 0.25 = -0.25 on both of its
    # turns, A's decision 1 = -0.5 - 0.5 = -1; B's = 0.5 - 0.25 = 0.25 and 0.5 + 0.5 = 1.
    config = load_config(None, ["train.algorithm=dr_grpo", "train.group_size=2", "train.kl_coef=0",
                                "train.decision_advantage_coef=0.5"]).train
    out = compute_advantages(_batch(rows), config)
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, -0.25, 0, -0.25, 0, -1.0]))
    torch.testing.assert_close(out.advantages[1, :4], torch.tensor([0, 0.25, 0, 1.0]))
    # Without the decision term: the episode term alone, on every sampled token.
    plain = compute_advantages(_batch(rows), config.model_copy(update={"decision_advantage_coef": 0.0}))
    torch.testing.assert_close(plain.advantages[0], torch.tensor([0, -0.5, 0, -0.5, 0, -0.5]))
    # GRPO scales the episode term by the group's std (sqrt(0.5)); RLOO by n / (n - 1) = 2.
    for algorithm, scale in (("grpo", 1 / math.sqrt(0.5)), ("rloo", 2.0)):
        other = compute_advantages(_batch(rows), config.model_copy(update={"algorithm": algorithm,
                                                                           "decision_advantage_coef": 0.0}))
        torch.testing.assert_close(other.advantages[1, :4], torch.tensor([0, 0.5, 0, 0.5]) * scale, atol=1e-5, rtol=0)


def test_collate_tags_every_sampled_token_with_its_turn_and_decision() -> None:
    # Two segments (a context reset after the first turn); the second segment holds two turns of decision 1.
    first = Segment()
    first.extend([10, 11], sampled=False)
    first.extend([12, 13], sampled=True, logprobs=[-1.0, -1.0])
    empty = Segment()
    second = Segment()
    second.extend([20], sampled=False)
    second.extend([21], sampled=True, logprobs=[-0.5])
    second.extend([22], sampled=False)
    second.extend([23, 24], sampled=True, logprobs=[-0.1, -0.2])
    turns = [
        Turn(0, 2, 4, "a", 0.0, False, {"decision_index": 0}),
        Turn(2, 1, 2, "b", 0.0, False, {"decision_index": 1}),
        Turn(2, 3, 5, "c", 1.0, False, {"decision_index": 1}),
    ]
    trajectory = Trajectory(seed=0, group=3, segments=[first, empty, second], turns=turns)
    batch = collate([trajectory], pad_id=0)
    assert batch.turn.tolist() == [[-1, -1, 0, 0, -1], [-1, 1, -1, 2, 2]]
    assert batch.decision.tolist() == [[-1, -1, 0, 0, -1], [-1, 1, -1, 1, 1]]
    # the turn tags select exactly the sampled tokens
    assert ((batch.turn >= 0) == batch.action_mask.bool()).all()


def test_group_algorithms_need_groups_and_the_decision_term_needs_a_group_algorithm() -> None:
    from r1trade.errors import ConfigError

    with pytest.raises(ConfigError, match="needs group_size >= 2"):
        load_config(None, ["train.algorithm=rloo"])
    with pytest.raises(ConfigError, match="decision_advantage_coef needs a group algorithm"):
        load_config(None, ["train.decision_advantage_coef=1"])


# One trajectory of three turns: an information call (turn 0, reward 0.05 for looking), the trade of decision 0
# (turn 1, reward 1.0) and the trade of decision 1 (turn 2, reward 2.0). One observation token before each turn.
INFO_ROWS = [
    {"trajectory": 0, "mask": [0, 1, 1, 0, 1, 1, 0, 1, 1], "turn": [-1, 0, 0, -1, 1, 1, -1, 2, 2],
     "decision": [-1, 0, 0, -1, 0, 0, -1, 1, 1], "reward": [0, 0, 0.05, 0, 0, 1.0, 0, 0, 2.0]},
    {"trajectory": 1, "mask": [0, 1, 1], "turn": [-1, 0, 0], "decision": [-1, 0, 0], "reward": [0, 0, 0.0]},
]


def test_turn_discounts_apply_turn_gamma_within_a_decision_and_gamma_between() -> None:
    decisions = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 2, 0, 0]])
    torch.testing.assert_close(
        turn_discounts(decisions, 0.5, 1.0), torch.tensor([[1.0, 0.5, 1.0, 1.0, 0.5], [0.5, 0.5, 0.5, 1.0, 0.5]])
    )
    assert turn_discounts(decisions, 0.5, None) == 0.5


def test_the_trade_reward_reaches_the_information_call_before_it() -> None:
    # gamma 0 between decisions, turn_gamma 1 within one: returns 0.05 + 1.0 = 1.05 (the information call takes
    # the trade's reward), 1.0 and 2.0 (no credit across decisions); the second trajectory's one turn 0.0.
    config = load_config(None, [
        "train.algorithm=reinforce_pp", "train.gamma=0", "train.turn_gamma=1", "train.kl_coef=0",
    ]).train
    out = compute_advantages(_batch(INFO_ROWS), config)
    raw = torch.tensor([1.05, 1.0, 2.0, 0.0])
    a0, a1, a2, b0 = ((raw - raw.mean()) / raw.std()).tolist()
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, a0, a0, 0, a1, a1, 0, a2, a2]))
    torch.testing.assert_close(out.advantages[1, :3], torch.tensor([0, b0, b0]))
    # Without turn_gamma (gamma 0 between every two turns) the information call keeps only its own 0.05.
    plain = compute_advantages(_batch(INFO_ROWS), config.model_copy(update={"turn_gamma": None}))
    raw = torch.tensor([0.05, 1.0, 2.0, 0.0])
    a0 = ((raw - raw.mean()) / raw.std())[0].item()
    assert plain.advantages[0, 1].item() == pytest.approx(a0)


def test_turn_level_gae_with_a_discount_per_turn_by_hand() -> None:
    # PPO, lambda 1, gamma 0.5 between decisions, turn_gamma 1 within one. V at the turns' first tokens:
    # (0.4, 0.8, 1.5). delta_2 = 2.0 - 1.5 = 0.5; delta_1 = 1.0 + 0.5 * 1.5 - 0.8 = 0.95;
    # delta_0 = 0.05 + 1.0 * 0.8 - 0.4 = 0.45. A_2 = 0.5, A_1 = 0.95 + 0.5 * 0.5 = 1.2, A_0 = 0.45 + 1.0 * 1.2
    # = 1.65; returns A + V: 2.05, 2.0, 2.0. Trajectory 1: A = 0 - 0.3, return 0.
    config = load_config(None, ["train.gamma=0.5", "train.turn_gamma=1", "train.lam=1", "train.kl_coef=0"]).train
    values = [[9.0, 0.4, 9.0, 9.0, 0.8, 9.0, 9.0, 1.5, 9.0], [9.0, 0.3, 9.0]]
    out = compute_advantages(_batch(INFO_ROWS, values), config)
    torch.testing.assert_close(out.returns[0], torch.tensor([0, 2.05, 0, 0, 2.0, 0, 0, 2.0, 0]))
    raw = torch.tensor([1.65, 1.2, 0.5, -0.3])
    a0, a1, a2, b0 = ((raw - raw.mean()) / raw.std()).tolist()
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, a0, a0, 0, a1, a1, 0, a2, a2]))
    torch.testing.assert_close(out.advantages[1, :3], torch.tensor([0, b0, b0]))


def test_turn_gamma_needs_credit_per_turn_without_groups() -> None:
    for overrides in (["train.credit=token"], ["train.algorithm=grpo", "train.group_size=2"]):
        with pytest.raises(ConfigError, match="turn_gamma needs credit: turn"):
            load_config(None, ["train.turn_gamma=1", *overrides])


def test_the_kl_placement_moves_the_penalty_out_of_the_advantages() -> None:
    # auto: the group algorithms put the KL in the loss, PPO and REINFORCE++ in the reward.
    for algorithm, in_loss in (("ppo", False), ("reinforce_pp", False), ("grpo", True), ("rloo", True)):
        assert kl_in_loss(load_config(None, [f"train.algorithm={algorithm}", "train.group_size=2"]).train) is in_loss
    # In the loss, the advantages of the hand-worked example above are those without any KL: 1.05, 1.0, 2.0, 0.0.
    batch = _batch(INFO_ROWS)
    batch.ref_logprobs = batch.old_logprobs - 0.1 * batch.action_mask
    config = load_config(None, [
        "train.algorithm=reinforce_pp", "train.gamma=0", "train.turn_gamma=1", "train.kl_coef=0.5",
        "train.kl_placement=loss",
    ]).train
    assert kl_in_loss(config)
    raw = torch.tensor([1.05, 1.0, 2.0, 0.0])
    a0, a1, a2, b0 = ((raw - raw.mean()) / raw.std()).tolist()
    out = compute_advantages(batch, config)
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, a0, a0, 0, a1, a1, 0, a2, a2]))
    # GRPO with the KL in the reward: each episode's score loses 0.5 * 0.1 per sampled token (6 and 2 tokens).
    grpo = load_config(None, ["train.algorithm=dr_grpo", "train.group_size=2", "train.kl_coef=0.5",
                              "train.kl_placement=reward"]).train
    batch.group = torch.tensor([0, 0])
    scores = torch.tensor([3.05 - 0.3, 0.0 - 0.1])  # Dr. GRPO: score minus the group mean, 1.325 and -1.325
    out = compute_advantages(batch, grpo)
    assert out.advantages[0, 1].item() == pytest.approx((scores[0] - scores.mean()).item())
    assert out.advantages[1, 1].item() == pytest.approx((scores[1] - scores.mean()).item())
