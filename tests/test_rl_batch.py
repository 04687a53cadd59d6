"""Collating trajectories into rows and computing each algorithm's advantages across context resets."""

import torch

from r1trade.config import TrainConfig
from r1trade.rl.advantages import compute_advantages, gae
from r1trade.rl.batch import TrajectoryView, collate, trajectory_scores
from r1trade.rl.group_filters import filter_top_groups
from r1trade.rollout.loop import Segment, Trajectory, Turn


def segment(ids, mask, rewards=None, logprobs=None) -> Segment:
    n = len(ids)
    return Segment(list(ids), list(mask), list(logprobs or [0.0] * n), list(rewards or [0.0] * n))


def two_trajectories() -> list[Trajectory]:
    # trajectory 0 spans two segments (a context reset); trajectory 1 has one.
    a = Trajectory(seed=0, group=0, segments=[
        segment([1, 2, 3, 4], [0, 1, 1, 0], rewards=[0, 0, 0.5, 0]),
        segment([5, 6, 7], [0, 0, 1], rewards=[0, 0, 1.0]),
    ])
    b = Trajectory(seed=1, group=0, segments=[segment([8, 9, 10, 11, 12], [0, 0, 1, 1, 1], rewards=[0, 0, 0, 0, 2.0])])
    return [a, b]


def test_collate_pads_rows_and_keeps_bookkeeping():
    batch = collate(two_trajectories(), pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 0], [5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.trajectory.tolist() == [0, 0, 1]
    assert trajectory_scores(batch).tolist() == [1.5, 2.0]


def test_trajectory_view_lays_segments_end_to_end_and_back():
    batch = collate(two_trajectories(), pad_id=0)
    view = TrajectoryView(batch)
    ids = view.to_trajectories(batch.input_ids.float())
    assert ids.tolist() == [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 0, 0]]
    assert torch.equal(view.to_rows(ids), batch.input_ids.float())


def test_ppo_advantages_flow_across_a_context_reset():
    batch = collate(two_trajectories(), pad_id=0)
    batch.old_values = torch.zeros_like(batch.rewards)
    config = TrainConfig(credit="token", gamma=1.0, lam=1.0, kl_coef=0.0)
    out = compute_advantages(batch, config)
    # with V = 0, γ = λ = 1 the raw advantage is reward-to-go over action tokens: trajectory 0's tokens
    # [2, 3, 7] get [1.5, 1.5, 1.0] although token 7 sits in another segment; trajectory 1's [2, 2, 2].
    raw = torch.tensor([1.5, 1.5, 1.0, 2.0, 2.0, 2.0])
    whitened = (raw - raw.mean()) / (raw.std() + 1e-8)
    action = batch.action_mask.bool()
    assert torch.allclose(out.advantages[action], whitened, atol=1e-6)
    assert torch.allclose(out.returns[action], raw)
    assert (out.advantages[~action] == 0).all()


def test_ppo_kl_penalty_enters_the_rewards_of_action_tokens_only():
    batch = collate(two_trajectories(), pad_id=0)
    batch.old_values = torch.zeros_like(batch.rewards)
    batch.ref_logprobs = batch.old_logprobs - 0.1  # k1 = +0.1 per token everywhere
    config = TrainConfig(credit="token", gamma=1.0, lam=1.0, kl_coef=1.0, kl_estimator="k1")
    out = compute_advantages(batch, config)
    action = batch.action_mask.bool()
    assert torch.allclose(out.returns[action], torch.tensor([1.2, 1.3, 0.9, 1.7, 1.8, 1.9]))


def test_advantage_mask_off_runs_gae_over_every_token():
    batch = collate(two_trajectories(), pad_id=0)
    batch.old_values = torch.zeros_like(batch.rewards)
    out = compute_advantages(batch, TrainConfig(credit="token", gamma=0.5, lam=1.0, kl_coef=0.0, advantage_mask=False))
    view = TrajectoryView(batch)
    valid = view.to_trajectories(batch.attention_mask.float())
    _, expected = gae(view.to_trajectories(batch.rewards), torch.zeros_like(valid), valid, 0.5, 1.0,
                      advantage_mask=False, valid_mask=valid)
    assert torch.allclose(out.returns, view.to_rows(expected))
    assert out.advantages[0, 0] != 0  # a prompt token gets an advantage in the ablation


def test_turn_level_credit_flows_across_a_context_reset():
    # Trajectory 0's turns: tokens 2-3 in the first segment (reward 0.5), token 7 after the reset (reward 1).
    trajectories = two_trajectories()
    trajectories[0].turns = [Turn(0, 1, 3, "a", 0.5, False, {}), Turn(1, 2, 3, "b", 1.0, False, {})]
    trajectories[1].turns = [Turn(0, 2, 5, "c", 2.0, False, {})]
    batch = collate(trajectories, pad_id=0)
    batch.old_values = torch.zeros_like(batch.rewards)
    out = compute_advantages(batch, TrainConfig(gamma=1.0, lam=1.0, kl_coef=0.0))
    # V = 0, gamma = lambda = 1: turn advantages are rewards-to-go 1.5, 1.0 (trajectory 0) and 2.0, whitened over
    # the three turns and given to every token of each turn; returns sit at each turn's first token.
    raw = torch.tensor([1.5, 1.0, 2.0])
    a, b, c = ((raw - raw.mean()) / raw.std()).tolist()
    action = batch.action_mask.bool()
    assert torch.allclose(out.advantages[action], torch.tensor([a, a, b, c, c, c]), atol=1e-6)
    assert out.returns[0, 1] == 1.5 and out.returns[1, 2] == 1.0 and out.returns[2, 2] == 2.0
    assert out.value_mask.sum() == 3


def test_grpo_broadcasts_group_normalised_scores():
    batch = collate(two_trajectories(), pad_id=0)
    out = compute_advantages(batch, TrainConfig(algorithm="grpo", group_size=2))
    std = torch.tensor([1.5, 2.0]).std()
    action = batch.action_mask.bool()
    expected = torch.tensor([-0.25, -0.25, -0.25, 0.25, 0.25, 0.25]) / (std + 1e-6)
    assert torch.allclose(out.advantages[action], expected, atol=1e-6)


def test_top_group_filter_keeps_the_high_variance_group():
    trajectories = two_trajectories()
    flat = [Trajectory(seed=2, group=1, segments=[segment([1, 2], [0, 1], rewards=[0, 1.0])]),
            Trajectory(seed=3, group=1, segments=[segment([1, 2], [0, 1], rewards=[0, 1.0])])]
    batch = collate(trajectories + flat, pad_id=0)
    kept = filter_top_groups(batch, keep_frac=0.5)
    assert kept.group.tolist() == [0, 0, 0] and kept.trajectory.tolist() == [0, 0, 1]
    assert kept.input_ids.shape == (3, 5)


def test_micro_batches_by_length_pad_rows_of_similar_length_with_groups_side_by_side():
    """Lengths [9, 3, 7, 4] in groups [0, 1, 0, 1]: group 1 (longest 4) first, its rows 3 then 4 tokens long, then
    group 0 (longest 9), 7 then 9: rows [1, 3, 2, 0], cut by 2 into [1, 3] and [2, 0]. Singleton groups: by
    length alone. Drawn order: the rows as they come."""
    from r1trade.rl.batch import RolloutBatch

    lengths, groups = [9, 3, 7, 4], [0, 1, 0, 1]
    width = max(lengths)
    zeros = torch.zeros(4, width)
    batch = RolloutBatch(
        input_ids=torch.ones(4, width, dtype=torch.long),
        attention_mask=torch.tensor([[1] * n + [0] * (width - n) for n in lengths]),
        action_mask=zeros.long(), old_logprobs=zeros, rewards=zeros, trajectory=torch.arange(4),
        group=torch.tensor(groups), turn=zeros.long() - 1, decision=zeros.long() - 1,
    )
    assert [rows.tolist() for rows in batch.micro_batches(2, by_length=True)] == [[1, 3], [2, 0]]
    assert [rows.tolist() for rows in batch.micro_batches(3)] == [[0, 1, 2], [3]]
    batch.group = torch.tensor([10, 11, 12, 13])
    assert [rows.tolist() for rows in batch.micro_batches(3, by_length=True)] == [[1, 3, 2], [0]]
