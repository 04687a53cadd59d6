"""The trainer on the tiny model: it learns an easy reward, resumes exactly, skips NaN steps, saves on Ctrl-C."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from r1trade.config import Config, load_config
from r1trade.models.loading import load_agent_models
from r1trade.rl.checkpoint_paths import latest_checkpoint
from r1trade.rl.trainer import Trainer, TrainingInterrupted

VOWELS = set("aeiouAEIOU")


class VowelEnv:
    """`turns` turns per episode; each turn earns the share of vowels in what the model wrote (easy to learn).
    With `fresh_context` each later turn starts a new context (a new token segment), as a context reset does."""

    def __init__(self, turns: int = 1, fresh_context: bool = False) -> None:
        self.turns = turns
        self.fresh_context = fresh_context

    def reset(self, seed=None, options=None):
        self.t = 0
        return [{"role": "system", "content": "Write."}, {"role": "user", "content": f"Go {seed}"}], {}

    def step(self, text):
        self.t += 1
        letters = [c for c in text if c.isalpha()]
        reward = sum(c in VOWELS for c in letters) / max(1, len(letters))
        info = {"reward_components": {"vowels": reward}, "parse_error": None if letters else "no letters"}
        following = [{"role": "user", "content": f"again {self.t}"}]
        if self.fresh_context:
            info["context_reset"] = True
            following = [{"role": "system", "content": "Write."}, *following]
        return following, reward, self.t >= self.turns, False, info


class RaggedEnv(VowelEnv):
    """VowelEnv whose first observation's length follows the episode's seed: rows of several lengths."""

    def reset(self, seed=None, options=None):
        messages, info = super().reset(seed, options)
        messages[-1]["content"] += " go" * (seed % 7)
        return messages, info


def make_config(**train) -> Config:
    overrides = [
        "model.name_or_path=tiny-random", "model.lora.enabled=false", "rollout.num_envs=8",
        "rollout.max_new_tokens=6", "train.epochs=2", "train.minibatch_size=4", "train.micro_batch_size=2",
        "train.learning_rate=0.003", "train.critic_learning_rate=0.003", "train.kl_coef=0", "train.checkpoint_every=2",
    ]
    overrides += [f"train.{k}={v}" for k, v in train.items()]
    return load_config(None, overrides)


def make_trainer(config: Config, run_dir: Path, turns: int = 1, fresh_context: bool = False) -> Trainer:
    models = load_agent_models(config.model, seed=config.seed)
    return Trainer(config, models, lambda n: [VowelEnv(turns, fresh_context) for _ in range(n)], run_dir)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_an_easy_reward_rises_within_a_few_dozen_updates(tmp_path: Path, algorithm: str):
    extra = {"group_size": 4} if algorithm == "grpo" else {}
    config = make_config(updates=30, algorithm=algorithm, **extra)
    trainer = make_trainer(config, tmp_path)
    trainer.train()
    returns = [m["episode_return"] for m in read_metrics(tmp_path)]
    first, last = sum(returns[:5]) / 5, sum(returns[-5:]) / 5
    # an update's mean return varies by ~0.04 here, so a 5-update mean by ~0.02: a rise of 0.1 is > 3 std errors
    assert last > first + 0.1, returns


def test_resume_continues_exactly(tmp_path: Path):
    config = make_config(updates=4)
    straight = make_trainer(config, tmp_path / "straight", turns=2)
    straight.train()

    split = make_trainer(config.model_copy(update={"train": config.train.model_copy(update={"updates": 2})}),
                         tmp_path / "split", turns=2)
    split.train()
    resumed = make_trainer(config, tmp_path / "split", turns=2)
    assert resumed.resume() == tmp_path / "split" / "checkpoints" / "step-2"
    resumed.train()

    for a, b in zip(straight.models.policy.parameters(), resumed.models.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(straight.models.critic.parameters(), resumed.models.critic.parameters(), strict=True):
        assert torch.equal(a, b)
    timing = {"rollout_tokens_per_s", "update_tokens_per_s", "rollout_seconds", "score_seconds", "update_seconds",
              "peak_memory_mb"}
    clean = lambda rows: [{k: v for k, v in row.items() if k not in timing} for row in rows]
    assert clean(read_metrics(tmp_path / "straight")) == clean(read_metrics(tmp_path / "split"))


def test_metrics_cover_rewards_ppo_diagnostics_and_speed(tmp_path: Path):
    trainer = make_trainer(make_config(updates=1), tmp_path, turns=2)
    trainer.train()
    (row,) = read_metrics(tmp_path)
    for key in ("episode_return", "reward/vowels", "valid_call_rate", "approx_kl", "clipfrac", "entropy",
                "value_loss", "explained_variance", "grad_norm", "rollout_tokens_per_s", "update_tokens_per_s",
                "peak_memory_mb", "skipped_steps", "warnings"):
        assert key in row, key
    assert row["update"] == 1 and row["skipped_steps"] == 0
    assert row["optimizer_steps"] == 2 * 2  # 2 epochs over 8 one-segment episodes in minibatches of 4


def test_the_stabilisers_log_what_they_did(tmp_path: Path):
    """GiGPO's step groups, DAPO's dynamic sampling and sequence-level averaging: each update logs the share of step
    groups with more than one member and the share of groups dropped; the side balance, the side's entropy."""
    config = make_config(updates=2, algorithm="grpo", group_size=4, step_groups="true", dynamic_sampling="true",
                         loss_aggregation="sequence")
    make_trainer(config, tmp_path, turns=2).train()
    for row in read_metrics(tmp_path):
        # VowelEnv answers every member of a group alike, so every state is faced by all four members
        assert row["step_group_shared_rate"] == 1.0
        assert row["dynamic_sampling_dropped_rate"] in (0.0, 0.5)  # two groups, one kept at least
        assert row["skipped_steps"] == 0
    plain = make_config(updates=1)
    make_trainer(plain, tmp_path / "plain").train()
    (row,) = read_metrics(tmp_path / "plain")
    assert not {"step_group_shared_rate", "dynamic_sampling_dropped_rate", "side_entropy"} & row.keys()
    # the side balance logs the mean entropy of the side choice, in all and per place; VowelEnv's turns never
    # trade: 0 here
    sides = make_config(updates=1, side_balance_coef=0.1)
    make_trainer(sides, tmp_path / "sides").train()
    (row,) = read_metrics(tmp_path / "sides")
    assert row["side_entropy"] == row["side_entropy/action_word"] == row["side_entropy/side_argument"] == 0.0
    assert row["skipped_steps"] == 0


def test_optimizer_steps_count_segments_not_episodes(tmp_path: Path):
    """A context reset splits an episode into segments, and minibatches are counted in segments: 8 episodes of 2
    fresh-context turns are 16 rows, 4 minibatches of 4 per epoch."""
    trainer = make_trainer(make_config(updates=1, epochs=1), tmp_path, turns=2, fresh_context=True)
    trainer.train()
    (row,) = read_metrics(tmp_path)
    assert row["optimizer_steps"] == 4


def test_non_finite_loss_skips_the_step_and_keeps_weights(tmp_path: Path, monkeypatch):
    trainer = make_trainer(make_config(updates=1), tmp_path)
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    real_loss = Trainer.loss

    def poisoned(self, micro, **kwargs):
        loss, stats = real_loss(self, micro, **kwargs)
        return loss * math.nan, stats

    monkeypatch.setattr(Trainer, "loss", poisoned)
    trainer.train()
    (row,) = read_metrics(tmp_path)
    assert row["skipped_steps"] == row["skipped_steps"] and row["skipped_steps"] >= 1
    for a, b in zip(before, trainer.models.policy.parameters()):
        assert torch.equal(a, b)


def test_an_update_cut_off_is_never_saved(tmp_path: Path, monkeypatch):
    """A stop at once (a second signal) in the middle of update 4 keeps the checkpoint of update 2: update 3 was
    not due one, and update 4 had moved the weights only in part."""
    trainer = make_trainer(make_config(updates=5, checkpoint_every=2), tmp_path)
    real_update = Trainer.update
    calls = {"n": 0}

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real_update(self)

    monkeypatch.setattr(Trainer, "update", interrupted)
    with pytest.raises(TrainingInterrupted) as caught:
        trainer.train()
    assert caught.value.checkpoint == tmp_path / "checkpoints" / "step-2"
    assert latest_checkpoint(tmp_path) == caught.value.checkpoint
    assert len(read_metrics(tmp_path)) == 3


@pytest.mark.parametrize(
    "switches",
    [{"loss_mask": "false"}, {"advantage_mask": "false"}, {"loss_mask": "false", "advantage_mask": "false"}],
)
def test_mask_ablations_train(tmp_path: Path, switches: dict):
    trainer = make_trainer(make_config(updates=1, **switches), tmp_path, turns=2)
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    trainer.train()
    (row,) = read_metrics(tmp_path)
    assert row["skipped_steps"] == 0 and math.isfinite(row["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.models.policy.parameters()))


@pytest.mark.parametrize("algorithm", ["reinforce_pp", "ppo"])
def test_advantage_mask_changes_nothing_with_credit_per_turn_and_the_loss_mask(tmp_path: Path, algorithm: str):
    """With credit per turn a turn's advantage is one number for its tokens: the advantage mask only decides whether
    the observation tokens after it receive it too, and the loss mask keeps those out of the loss. Same loss, same
    gradient (why the ablation's no-advantage-mask row equals the full one; token-level GAE is where it bites)."""
    from r1trade.rl.advantages import compute_advantages
    from r1trade.rl.batch import collate

    results = []
    for switch in ("true", "false"):
        config = make_config(updates=1, algorithm=algorithm, credit="turn", gamma=0.9, advantage_mask=switch)
        trainer = make_trainer(config, tmp_path / switch, turns=2)
        rollout = collate(trainer.rollout(), pad_id=trainer.engine.pad_id)
        batch = compute_advantages(trainer.score(rollout), trainer.config.train)
        loss, _ = trainer.loss(batch)
        loss.backward()
        grads = [p.grad.clone() for p in trainer.models.policy.parameters() if p.grad is not None]
        results.append((batch, loss.detach(), grads))
    (masked, masked_loss, masked_grads), (unmasked, unmasked_loss, unmasked_grads) = results
    observation = (masked.action_mask == 0) & masked.attention_mask.bool()
    assert (masked.advantages[observation] == 0).all() and (unmasked.advantages[observation] != 0).any()
    action = masked.action_mask.bool()
    torch.testing.assert_close(unmasked.advantages[action], masked.advantages[action], rtol=0, atol=0)
    # equal up to float32 rounding: without the advantage mask the micro-batch is not cut after its last sampled
    # token, and kernels may sum a longer row in another order
    torch.testing.assert_close(unmasked_loss, masked_loss)
    assert len(masked_grads) == len(unmasked_grads) > 0
    for a, b in zip(masked_grads, unmasked_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_loss_mask_decides_whether_observation_tokens_get_gradient(tmp_path: Path, monkeypatch):
    """d loss / d log π(token) on observation tokens: exactly zero with the loss mask, non-zero without it."""
    from r1trade.models import scoring
    from r1trade.rl.advantages import compute_advantages
    from r1trade.rl.batch import collate

    captured = []
    real = scoring.token_logprobs_and_entropy

    def capture(*args, **kwargs):
        logprobs, entropy = real(*args, **kwargs)
        if torch.is_grad_enabled():
            logprobs.retain_grad()
            captured.append(logprobs)
        return logprobs, entropy

    monkeypatch.setattr(scoring, "token_logprobs_and_entropy", capture)  # what `token_outputs` calls
    for masked in (True, False):
        switch = str(masked).lower()  # both masks on, or both off (observation tokens then get advantages too)
        config = make_config(updates=1, loss_mask=switch, advantage_mask=switch)
        trainer = make_trainer(config, tmp_path / switch, turns=2)
        rollout = collate(trainer.rollout(), pad_id=trainer.engine.pad_id)
        batch = compute_advantages(trainer.score(rollout), trainer.config.train).select(torch.arange(1))
        captured.clear()
        loss, _ = trainer.loss(batch)
        loss.backward()
        grad = captured[0].grad[0].abs()  # (T,)
        observation = (batch.action_mask[0] == 0) & batch.attention_mask[0].bool()
        observation[0] = False  # the first token has no prefix: never scored
        action = batch.action_mask[0].bool()
        assert grad[action].sum() > 0
        assert (grad[observation].sum() == 0) == masked


def test_episode_metrics_count_direction_accuracy_over_decisions_only():
    from r1trade.rl.episode_metrics import episode_metrics
    from r1trade.rollout.loop import Trajectory, Turn

    def turn(right):
        return Turn(0, 0, 1, "x", 0.0, False, {"parse_error": None, "tool_error": None, "direction_right": right})

    first = Trajectory(seed=0, group=0, turns=[turn(None), turn(True), turn(False)])  # an info call, then 2 decisions
    second = Trajectory(seed=1, group=0, turns=[turn(True), turn(True)])
    metrics = episode_metrics([first, second])
    assert metrics["direction_accuracy"] == pytest.approx(3 / 4)
    assert "direction_accuracy" not in episode_metrics([Trajectory(seed=0, group=0, turns=[turn(None)])])


def test_the_trade_actions_shares_and_a_collapse_to_one_action_is_warned(tmp_path: Path):
    from r1trade.rl.episode_metrics import episode_metrics
    from r1trade.rollout.loop import Trajectory, Turn

    def turn(action=None, target=0.0, forced=False):
        order = None if action is None else {"action": action, "target": target}
        return Turn(0, 0, 1, "x", 0.0, False,
                    {"parse_error": None, "order": order, "forced_hold": forced, "decision_done": order is not None})

    looks_then_longs = Trajectory(seed=0, group=0, turns=[turn(), turn("place_order", 1.0), turn("place_order", 0.5)])
    others = Trajectory(seed=1, group=0, turns=[turn("place_order", -1.0), turn("hold", forced=True)])
    metrics = episode_metrics([looks_then_longs, others])  # 4 decisions: long 2, short 1, a forced hold 1
    assert {k: v for k, v in metrics.items() if k.startswith("action_rate/")} == {
        "action_rate/long": 0.5, "action_rate/short": 0.25, "action_rate/close": 0.0, "action_rate/hold": 0.0,
        "action_rate/forced_hold": 0.25}
    trainer = make_trainer(make_config(updates=1), tmp_path)
    healthy = {"reward_std": 1.0, "entropy": 1.0}  # only the action shares may warn here
    assert trainer.echo_trap_warnings({**metrics, **healthy}) == []
    collapsed = episode_metrics([Trajectory(seed=s, group=0, turns=[turn("place_order", 1.0)]) for s in range(19)]
                                + [Trajectory(seed=19, group=0, turns=[turn("place_order", -1.0)])])  # long: 19 of 20
    assert collapsed["action_rate/long"] == 0.95
    assert trainer.echo_trap_warnings({**collapsed, **healthy}) == ["one action took 95% of the decisions (long)"]


def test_the_temperature_reaches_the_sampler_and_the_scores(tmp_path: Path):
    config = make_config(updates=2)
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={"temperature": 0.7})})
    trainer = make_trainer(config, tmp_path)
    sampled, scored = [], []
    generate, temperature = trainer.engine.backend.generate, trainer._temperature
    def spy_generate(prompts, generator):
        sampled.append(trainer.engine.backend.sampling.temperature)
        return generate(prompts, generator)
    def spy_temperature():
        scored.append(temperature())
        return scored[-1]
    trainer.engine.backend.generate, trainer._temperature = spy_generate, spy_temperature
    trainer.train()
    assert sampled == [0.7, 0.7]  # one turn an episode: one generate call an update
    assert [row["temperature"] for row in read_metrics(tmp_path)] == [0.7, 0.7]
    assert scored and set(scored) == {0.7}


def test_micro_batches_cut_by_length_give_the_same_scores_and_step(tmp_path: Path):
    """`micro_batch_order: length` only regroups the rows of each gradient-accumulation pass: the scores come back
    in row order and one update moves the weights as the drawn order does, up to float rounding."""
    from r1trade.rl.advantages import compute_advantages
    from r1trade.rl.batch import collate

    outcomes = []
    for order in ("drawn", "length"):
        config = make_config(updates=1, micro_batch_order=order, minibatch_size=8, micro_batch_size=3, epochs=1)
        models = load_agent_models(config.model, seed=config.seed)
        trainer = Trainer(config, models, lambda n: [RaggedEnv(2) for _ in range(n)], tmp_path / order)
        rollout = collate(trainer.rollout(), pad_id=trainer.engine.pad_id)
        scored = compute_advantages(trainer.score(rollout), trainer.config.train)
        trainer.optimise(scored)
        outcomes.append((scored, [p.detach().clone() for p in trainer.models.policy.parameters()]))
    (drawn, drawn_weights), (by_length, length_weights) = outcomes
    lengths = drawn.attention_mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 1  # rows of several lengths: the two cuts differ
    assert torch.equal(drawn.input_ids, by_length.input_ids)
    sampled, valued = drawn.action_mask.bool(), drawn.value_mask.bool()
    for name, where in (("old_logprobs", sampled), ("ref_logprobs", sampled), ("advantages", sampled),
                        ("old_values", valued)):  # what the loss reads; a micro-batch's trimmed tail is not
        torch.testing.assert_close(getattr(by_length, name)[where], getattr(drawn, name)[where], msg=name)
    # Adam's first step divides each gradient by its own size, so an element whose gradient is ~0 turns rounding
    # into up to a step (lr 0.003): allow 1e-4, a thirtieth of one
    for a, b in zip(drawn_weights, length_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
