"""The faster update paths are exact. Shared-prefix scoring and training: the rows' common prefix run once gives
the log-probs, values, losses and gradients of the plain pass (float32), with LoRA and with full fine-tuning, for a
value head and for a separate critic. Old log-probs taken from the rollout equal a fresh scoring pass."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from r1trade.config import load_config
from r1trade.models.loading import load_agent_models
from r1trade.models.prefix import common_prefix_length
from r1trade.models.scoring import backbone_hidden
from r1trade.rl.advantages import compute_advantages
from r1trade.rl.batch import RolloutBatch, collate
from r1trade.rl.losses import sequence_weights
from r1trade.rl.trainer import Trainer, _epoch_order

VOCAB = 580  # the tiny tokenizer has 586 tokens


def test_common_prefix_length_stops_at_the_first_difference_or_padding():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 5], [1, 2, 3, 4, 5]])
    assert common_prefix_length(ids, torch.ones_like(ids)) == 3
    padded = torch.ones_like(ids)
    padded[2, 2:] = 0  # the third row ends after two tokens
    assert common_prefix_length(ids, padded) == 2
    same = torch.tensor([[7, 8, 9], [7, 8, 9]])
    assert common_prefix_length(same, torch.ones_like(same)) == 2  # each row keeps its last token to itself
    assert common_prefix_length(torch.tensor([[1, 2], [3, 2]]), torch.ones(2, 2, dtype=torch.long)) == 0


def shared_batch(rows: int = 4, prefix: int = 24, own: int = 18, seed: int = 0) -> RolloutBatch:
    """Rows that start with the same `prefix` tokens, then differ; right padding; rows 0-1 and 2-3 are two groups,
    each pair sharing a few more tokens (a group's first observation); every third own token is sampled."""
    generator = torch.Generator().manual_seed(seed)
    common = torch.randint(3, VOCAB, (prefix,), generator=generator)
    group_part = [torch.randint(3, VOCAB, (5,), generator=generator) for _ in range(rows // 2)]
    ids = torch.stack([
        torch.cat([common, group_part[r // 2], torch.randint(3, VOCAB, (own,), generator=generator)])
        for r in range(rows)
    ])  # (R, T)
    width = ids.shape[1]
    attention = torch.ones_like(ids)
    attention[1, width - 4 :] = 0
    attention[3, width - 7 :] = 0
    action = torch.zeros(rows, width)
    action[:, prefix + 5 :: 3] = 1
    action *= attention
    rewards = torch.zeros(rows, width)
    rewards[torch.arange(rows), attention.sum(dim=1) - 1] = torch.tensor([1.0, -0.5, 0.25, 2.0])[:rows]
    turn = torch.where(action.bool(), 0, -1)
    return RolloutBatch(
        input_ids=ids, attention_mask=attention, action_mask=action, old_logprobs=torch.zeros(rows, width),
        rewards=rewards, trajectory=torch.arange(rows), group=torch.arange(rows) // 2, turn=turn, decision=turn.clone(),
    )


def make_trainer(
    tmp_path: Path, *, lora: bool, critic: str = "value_head", share: bool, algorithm: str = "ppo",
    extra: tuple[str, ...] = (),
) -> Trainer:
    config = load_config(None, [
        "model.name_or_path=tiny-random", f"model.lora.enabled={str(lora).lower()}", f"model.critic={critic}",
        f"train.algorithm={algorithm}", "train.group_size=2", "train.kl_coef=0.05", "train.entropy_coef=0.01",
        "train.minibatch_size=4",
        "train.micro_batch_size=4", "train.logprob_chunk=7", f"train.share_prefix={str(share).lower()}",
        "train.old_logprobs=recompute", *extra,
    ])
    models = load_agent_models(config.model, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every trainable weight off its init (LoRA's B starts at zero: no gradient to A)
        for module in (models.policy, models.critic):
            for p in module.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=generator) * 0.02)
    return Trainer(config, models, lambda n: [], tmp_path)


def gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    named = [*trainer.models.policy.named_parameters(), *trainer.models.critic.named_parameters(prefix="critic")]
    return {name: p.grad.clone() for name, p in named if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize(("lora", "critic"), [(True, "value_head"), (False, "value_head"), (True, "separate")])
def test_shared_prefix_gives_the_plain_log_probs_values_losses_and_gradients(tmp_path, lora, critic):
    results = {}
    for share in (False, True):
        trainer = make_trainer(tmp_path / str(share), lora=lora, critic=critic, share=share)
        batch = compute_advantages(trainer.score(shared_batch()), trainer.config.train)
        trainer.optimizer.zero_grad(set_to_none=True)
        loss, stats = trainer.loss(batch)
        loss.backward()
        results[share] = batch, loss.item(), stats, gradients(trainer)
    (plain, plain_loss, plain_stats, plain_grads), (shared, shared_loss, shared_stats, shared_grads) = results.values()
    real = plain.attention_mask.bool()  # padding positions hold values nothing reads
    for name in ("old_logprobs", "ref_logprobs", "old_values", "advantages", "returns"):
        torch.testing.assert_close(
            getattr(shared, name)[real], getattr(plain, name)[real], rtol=1e-5, atol=1e-5, msg=name
        )
    assert plain.old_logprobs.abs().sum() > 0 and plain.old_values.abs().sum() > 0
    assert shared_loss == pytest.approx(plain_loss, rel=1e-5, abs=1e-6)
    assert shared_stats == pytest.approx(plain_stats, rel=1e-4, abs=1e-6)
    assert shared_grads.keys() == plain_grads.keys() and len(plain_grads) > 0
    for name, grad in plain_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_group_minibatches_keep_each_groups_rows_together_in_batch_order():
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    generator = torch.Generator().manual_seed(0)
    rows = _epoch_order(group, "rows", generator)
    assert sorted(rows.tolist()) == list(range(8))
    orders = {tuple(_epoch_order(group, "groups", generator).tolist()) for _ in range(20)}
    members = {0: (0, 1, 2), 1: (3, 4), 2: (5, 6, 7)}
    assert len(orders) > 1  # the groups are shuffled
    for order in orders:
        assert sorted(order) == list(range(8))
        for rows_of_group in members.values():  # side by side, in batch order
            at = [order.index(row) for row in rows_of_group]
            assert at == list(range(at[0], at[0] + len(at)))


def test_group_minibatches_with_a_shared_prefix_train_the_same_weights(tmp_path):
    """A whole `optimise` (2 epochs, minibatches of one group, micro-batches of 2) with and without sharing: each
    micro-batch is one group, whose rows share the first observation too; the weights come out the same."""
    weights = {}
    for share in (False, True):
        trainer = make_trainer(tmp_path / str(share), lora=True, share=share,
                               extra=("train.minibatches=groups", "train.minibatch_size=2", "train.micro_batch_size=2"))
        batch = compute_advantages(trainer.score(shared_batch()), trainer.config.train)
        trainer.optimise(batch)
        weights[share] = {n: p.detach().clone() for n, p in trainer.models.policy.named_parameters() if p.requires_grad}
    for name, weight in weights[False].items():
        torch.testing.assert_close(weights[True][name], weight, rtol=1e-4, atol=1e-6, msg=name)


def test_the_micro_batch_size_changes_no_trained_weight(tmp_path):
    """Gradient accumulation weighs each micro-batch's policy terms by its share of the minibatch's loss tokens
    and its value loss by its share of the value positions (PPO with a value head here), so a minibatch of 4 rows
    run as 4 micro-batches of 1 or as one of 4 (its prefix once) trains the same weights."""
    def trained(trainer: Trainer) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in trainer.models.policy.named_parameters() if p.requires_grad}

    weights = {}
    for micro in (1, 4):
        trainer = make_trainer(tmp_path / str(micro), lora=True, share=True, extra=(f"train.micro_batch_size={micro}",))
        before = trained(trainer)
        batch = compute_advantages(trainer.score(shared_batch()), trainer.config.train)
        trainer.optimise(batch)
        weights[micro] = trained(trainer)
    assert weights[1] and all(not torch.equal(weights[1][n], w) for n, w in before.items())  # every tensor trained
    for name, weight in weights[1].items():
        torch.testing.assert_close(weights[4][name], weight, rtol=1e-4, atol=1e-6, msg=name)


def test_sequence_level_averaging_is_the_same_whatever_the_micro_batch_size(tmp_path):
    """Under `train.loss_aggregation: sequence` each micro-batch is weighed by its share of the minibatch's token
    weights (1 / its episode's loss tokens), so the cut changes no weight; the rows have 4 to 6 sampled tokens, so
    the weights differ from the token-level mean's."""
    def trained(aggregation: str, micro: int) -> dict[str, torch.Tensor]:
        trainer = make_trainer(tmp_path / f"{aggregation}{micro}", lora=True, share=True, algorithm="grpo", extra=(
            f"train.micro_batch_size={micro}", f"train.loss_aggregation={aggregation}", "train.epochs=1"))
        batch = compute_advantages(trainer.score(shared_batch()), trainer.config.train)
        if aggregation == "sequence":
            batch.loss_weight = sequence_weights(batch.action_mask, batch.trajectory)
        trainer.optimise(batch)
        return {n: p.detach().clone() for n, p in trainer.models.policy.named_parameters() if p.requires_grad}

    one, four, token = trained("sequence", 1), trained("sequence", 4), trained("token", 4)
    for name, weight in one.items():
        torch.testing.assert_close(four[name], weight, rtol=1e-4, atol=1e-6, msg=name)
    assert any(not torch.allclose(token[name], weight, rtol=1e-4, atol=1e-6) for name, weight in one.items())


def test_shared_prefix_hidden_states_match_with_padding_and_shared_sampled_tokens(tiny_agent):
    policy, _ = tiny_agent
    batch = shared_batch(seed=3)
    two = batch.input_ids[:2]  # one group: the prefix runs into the group's own tokens
    mask = batch.attention_mask[:2]
    assert common_prefix_length(two, mask) == 29
    for ids, attention in ((batch.input_ids, batch.attention_mask), (two, mask)):
        with torch.no_grad():
            plain = backbone_hidden(policy, ids, attention)
            shared = backbone_hidden(policy, ids, attention, share_prefix=True)
        real = attention.bool()
        torch.testing.assert_close(shared[real], plain[real], rtol=1e-5, atol=1e-5)


class CountingEnv:
    """Two turns per episode; the reward is the length of what the model wrote (any text is fine)."""

    def reset(self, seed=None, options=None):
        self.t = 0
        return [{"role": "system", "content": "Count."}, {"role": "user", "content": f"Start {seed}"}], {}

    def step(self, text):
        self.t += 1
        return [{"role": "user", "content": f"more {self.t}"}], float(len(text)), self.t >= 2, False, {}


@pytest.mark.parametrize("algorithm", ["rloo", "ppo"])
def test_old_log_probs_from_the_rollout_equal_a_fresh_scoring_pass(tmp_path, algorithm):
    config = load_config(None, [
        "model.name_or_path=tiny-random", "rollout.num_envs=4", "rollout.max_new_tokens=5", "train.group_size=2",
        f"train.algorithm={algorithm}", "train.old_logprobs=rollout",
    ])
    trainer = Trainer(config, load_agent_models(config.model, seed=0), lambda n: [CountingEnv() for _ in range(n)],
                      tmp_path)
    batch = collate(trainer.rollout(), pad_id=trainer.engine.pad_id)
    sampled = batch.old_logprobs.clone()
    scored = trainer.score(batch)
    assert torch.equal(scored.old_logprobs, sampled)  # kept as sampled
    assert scored.ref_logprobs is not None and (scored.old_values is not None) == (algorithm == "ppo")
    fresh = Trainer(config.model_copy(update={"train": config.train.model_copy(update={"old_logprobs": "recompute"})}),
                    trainer.models, lambda n: [], tmp_path).score(collate_again(batch))
    action = batch.action_mask.bool()
    assert action.sum() > 10
    torch.testing.assert_close(fresh.old_logprobs[action], sampled[action], atol=1e-4, rtol=0)


def collate_again(batch: RolloutBatch) -> RolloutBatch:
    """The batch with its old log-probs wiped, so that a scoring pass has to fill them."""
    return replace(batch, old_logprobs=torch.zeros_like(batch.old_logprobs))


def with_trailing_observation(batch: RolloutBatch, extra: int = 9, seed: int = 5) -> RolloutBatch:
    """The batch with `extra` more real tokens after every row's end (a tool result nothing was sampled after)."""
    generator = torch.Generator().manual_seed(seed)
    rows, width = batch.input_ids.shape
    grown = {}
    for name in ("input_ids", "attention_mask", "action_mask", "old_logprobs", "rewards", "turn", "decision"):
        tensor = getattr(batch, name)
        fill = -1 if name in ("turn", "decision") else 0
        grown[name] = torch.cat([tensor, tensor.new_full((rows, extra), fill)], dim=1)
    for row in range(rows):
        end = int(batch.attention_mask[row].sum())
        grown["input_ids"][row, end : end + extra] = torch.randint(3, VOCAB, (extra,), generator=generator)
        grown["attention_mask"][row, end : end + extra] = 1
    return replace(batch, **grown)


@pytest.mark.parametrize("algorithm", ["ppo", "rloo"])
def test_tokens_after_the_last_sampled_token_change_nothing(tmp_path, algorithm):
    """The update runs only up to the last sampled token: a trailing observation leaves every score, loss and
    gradient as it was (causal attention), so the trainer may cut it off."""
    results = []
    for batch in (shared_batch(), with_trailing_observation(shared_batch())):
        trainer = make_trainer(tmp_path, lora=True, share=True, algorithm=algorithm)
        scored = compute_advantages(trainer.score(batch), trainer.config.train)
        trainer.optimizer.zero_grad(set_to_none=True)
        loss, _ = trainer.loss(scored)
        loss.backward()
        results.append((scored, loss.item(), gradients(trainer)))
    (short, short_loss, short_grads), (long, long_loss, long_grads) = results
    width = short.input_ids.shape[1]
    assert long.input_ids.shape[1] > width
    for name in ("old_logprobs", "ref_logprobs", "advantages"):
        torch.testing.assert_close(getattr(long, name)[:, :width], getattr(short, name), rtol=1e-5, atol=1e-6)
    assert long_loss == pytest.approx(short_loss, rel=1e-5, abs=1e-7)
    for name, grad in short_grads.items():
        torch.testing.assert_close(long_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_a_kl_placed_in_the_loss_adds_its_mean_to_the_ppo_loss(tmp_path):
    # With train.kl_placement loss the advantages carry no KL, so the two losses differ by kl_coef times the mean
    # k3 estimate over the sampled tokens (the `kl_ref` statistic).
    results = {}
    for coef in (0.0, 0.5):
        trainer = make_trainer(tmp_path / str(coef), lora=True, share=False, algorithm="ppo",
                               extra=(f"train.kl_coef={coef}", "train.kl_placement=loss"))
        batch = compute_advantages(trainer.score(shared_batch()), trainer.config.train)
        results[coef] = trainer.loss(batch)
    (plain, _), (anchored, anchored_stats) = results[0.0], results[0.5]
    assert anchored_stats["kl_ref"] > 0
    assert anchored.item() - plain.item() == pytest.approx(0.5 * anchored_stats["kl_ref"], rel=1e-4)


def test_the_side_balance_takes_its_share_of_the_token_mean_from_the_ppo_loss(tmp_path):
    # Two sampled tokens name a side, one at each place, with pulls -0.7 and +1.1. The term is zero elsewhere, so
    # the two losses differ by the coefficient times the pulls times P(long) there, summed over the minibatch's
    # sampled tokens; each P(long) is the side choice renormalised from a plain forward pass ("l" against "sh" at
    # both places on the tiny tokenizer, ids 78 and 292). The logged entropies are those of the same choices.
    batch = shared_batch()
    side_choice = torch.full_like(batch.input_ids, -1)
    side_pull = torch.zeros_like(batch.action_mask)
    picked = batch.action_mask.nonzero()[[0, 5]]  # (2, 2): (row, token)
    side_choice[picked[:, 0], picked[:, 1]] = torch.tensor([0, 1])
    side_pull[picked[:, 0], picked[:, 1]] = torch.tensor([-0.7, 1.1])
    results = {}
    for coef in (0.0, 0.5):
        trainer = make_trainer(tmp_path / str(coef), lora=True, share=False, algorithm="ppo",
                               extra=(f"train.side_balance_coef={coef}",))
        sided = replace(batch, side_choice=side_choice, side_pull=side_pull)
        results[coef] = trainer.loss(compute_advantages(trainer.score(sided), trainer.config.train))
    with torch.no_grad():
        logits = trainer.models.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    longs = [float(torch.softmax(logits[row, token - 1, [78, 292]].float(), dim=-1)[0])  # drawn from state - 1
             for row, token in picked.tolist()]
    entropies = [-(p * math.log(p) + (1 - p) * math.log(1 - p)) for p in longs]
    (plain, plain_stats), (pulled, pulled_stats) = results[0.0], results[0.5]
    assert "side_entropy" not in plain_stats
    assert pulled_stats["side_entropy"] == pytest.approx(sum(entropies) / 2, rel=1e-4)
    assert pulled_stats["side_entropy/action_word"] == pytest.approx(entropies[0], rel=1e-4)
    assert pulled_stats["side_entropy/side_argument"] == pytest.approx(entropies[1], rel=1e-4)
    sampled = float(batch.action_mask.sum())
    term = -0.7 * longs[0] + 1.1 * longs[1]
    assert plain.item() - pulled.item() == pytest.approx(0.5 * term / sampled, rel=1e-3)
