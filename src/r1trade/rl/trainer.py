"""Masked multi-turn policy optimisation: PPO (with a critic), GRPO and REINFORCE++ on whole trajectories.

One update reads top to bottom, CleanRL-style:
  1. rollout  — play `rollout.num_envs` episodes with the current policy (groups of `group_size` share a start);
     optionally drop groups (DAPO's dynamic sampling, StarPO-S);
  2. score    — without gradients: the policy's log-probs, the reference log-probs (adapter off) and values;
  3. advantages — GAE over turns or action tokens (PPO), group baselines (GRPO, Dr. GRPO, RLOO, optionally per
     decision or per anchor state as GiGPO) or normalised returns (REINFORCE++);
  4. optimise — epochs × minibatches × micro-batches; losses are means over the loss mask (per token, or per
     episode), less the entropy bonus over every sampled token and the side-balance term (the batch's share of
     long against short); clipped gradients; a non-finite loss or gradient skips the step;
  5. log and checkpoint (also after the update under way when a signal asks the run to stop).
Under `accelerate launch` every process plays its own episodes and gradients are averaged before each step
(`r1trade.rl.distributed`).
Loss, KL, entropy and advantages count only the tokens the model sampled unless the ablation switches
`train.loss_mask` / `train.advantage_mask` are off.
"""

from __future__ import annotations

import json
import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from r1trade.config import Config
from r1trade.errors import TrainingInterrupted
from r1trade.models.agent_models import AgentModels, reference_context, trainable_parameters
from r1trade.models.scoring import token_logprobs, token_outputs
from r1trade.outputs import append_line
from r1trade.rl.advantages import (
    compute_advantages,
    explained_variance,
    kl_in_loss,
    shared_step_group_rate,
    uses_kl,
)
from r1trade.rl.batch import RolloutBatch, collate
from r1trade.rl.checkpoint import TrainingState, load_checkpoint, save_checkpoint
from r1trade.rl.checkpoint_paths import latest_checkpoint
from r1trade.rl.distributed import Distributed
from r1trade.rl.episode_metrics import episode_metrics
from r1trade.rl.group_filters import drop_uniform_groups, filter_top_groups
from r1trade.rl.losses import (
    entropy_bonus,
    kl_penalty,
    policy_loss,
    sequence_weights,
    token_mean,
    value_loss,
)
from r1trade.rl.masks import masked_mean
from r1trade.rl.side_balance import side_pull
from r1trade.rl.metrics_log import METRICS_FILE, truncate_records
from r1trade.rl.stopping import StopRequest
from r1trade.rollout.backend import sampling_from_config
from r1trade.rollout.build import transformers_engine
from r1trade.rollout.decisions import side_choices, side_positions
from r1trade.rollout.loop import TextEnv, Trajectory

EnvFactory = Callable[[int], Sequence[TextEnv]]  # number of environments -> environments


@dataclass
class Trainer:
    config: Config
    models: AgentModels
    env_factory: EnvFactory
    run_dir: Path
    on_update: Callable[[dict], None] | None = None
    state: TrainingState = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config.train
        self.uses_critic = cfg.algorithm == "ppo"
        self.sides = side_choices(self.models.tokenizer) if cfg.side_balance_coef > 0 else None
        # Data parallel under `accelerate launch`: every process plays its own episodes and gradients are
        # averaged across processes before each optimiser step; on one CPU this is a plain single process.
        self.distributed = Distributed()
        for module in (self.models.policy, self.models.critic, self.models.reference):
            if module is not None:
                module.to(self.distributed.device)
        trained = trainable_parameters(self.models)
        groups = [{"params": trained["policy"], "lr": cfg.learning_rate}]
        if self.uses_critic:
            groups.append({"params": trained["critic"], "lr": cfg.critic_learning_rate})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        warmup = max(cfg.warmup_updates, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        trained_critic = self.models.critic if self.uses_critic else None
        self.distributed.prepare(self.models.policy, trained_critic, self.optimizer, cfg)  # DeepSpeed, if launched so
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.sampling = sampling_from_config(self.config.rollout)  # the engine samples with this very object
        self.engine = transformers_engine(self.models.policy, self.models.tokenizer, self.sampling)
        self.state = TrainingState()
        self.grad_norm_mean: float | None = None

    # ------------------------------------------------------------------ the loop

    def resume(self) -> Path | None:
        """Load the newest checkpoint of `run_dir` (if any) and cut the metrics log back to it."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is not None:
            self.state, self.grad_norm_mean = load_checkpoint(
                checkpoint, models=self.models, optimizer=self.optimizer, scheduler=self.scheduler,
                generator=self.generator, distributed=self.distributed,
            )
            truncate_records(self.run_dir / METRICS_FILE, self.state.step)
        return checkpoint

    def train(self) -> Path:
        """Run the remaining updates; return the final checkpoint. A first SIGINT or SIGTERM ends the run after
        the update under way, checkpointed; a second at once, keeping the last complete checkpoint
        (`r1trade.rl.stopping`). Either way `TrainingInterrupted` names the checkpoint to resume from."""
        cfg = self.config.train
        checkpoint = None
        with StopRequest().listening() as stop:
            try:
                while self.state.step < cfg.updates:
                    metrics = self.update()
                    self.state.step += 1
                    metrics["update"] = self.state.step
                    self._log(metrics)
                    stopping = self._asked_anywhere(stop)
                    if stopping or self.state.step % cfg.checkpoint_every == 0 or self.state.step == cfg.updates:
                        checkpoint = self.save()
                    if stopping and self.state.step < cfg.updates:
                        raise TrainingInterrupted(checkpoint)
            except KeyboardInterrupt:
                raise TrainingInterrupted(latest_checkpoint(self.run_dir)) from None
        assert checkpoint is not None
        return checkpoint

    def _asked_anywhere(self, stop: StopRequest) -> bool:
        """Whether any process was asked to stop: all of them then stop after the same update."""
        asked = torch.tensor([float(stop.asked is not None)])
        return bool(self.distributed.reduce(asked, "max").item())

    def save(self) -> Path:
        """Checkpoint the run at its current step."""
        return save_checkpoint(
            self.run_dir, self.state, config=self.config, models=self.models, optimizer=self.optimizer,
            scheduler=self.scheduler, generator=self.generator, grad_norm_mean=self.grad_norm_mean,
            distributed=self.distributed,
        )

    def update(self) -> dict:
        """One rollout → score → advantages → optimise round; returns its metrics."""
        cfg = self.config.train
        # 1. rollout
        started = time.perf_counter()
        trajectories = self.rollout()
        rollout_seconds = time.perf_counter() - started
        sides = None
        if self.sides is not None:
            sides = [side_positions(trajectory, self.sides, self.models.tokenizer) for trajectory in trajectories]
        batch = collate(trajectories, pad_id=self.engine.pad_id, sides=sides).to(self.distributed.device)
        if batch.side_choice is not None:
            batch.side_pull = side_pull(batch.input_ids, batch.side_choice, self._side_ids())
        stabilisers: dict[str, float] = {}  # what the optional stabilisers did this update
        if cfg.dynamic_sampling:
            batch, stabilisers["dynamic_sampling_dropped_rate"] = drop_uniform_groups(batch)
        batch = filter_top_groups(batch, cfg.top_group_frac)
        # 2. score and 3. advantages (no gradients)
        started = time.perf_counter()
        batch = compute_advantages(self.score(batch), cfg)
        if cfg.step_groups:
            stabilisers["step_group_shared_rate"] = shared_step_group_rate(batch)
        if cfg.loss_aggregation == "sequence":
            batch.loss_weight = sequence_weights(self._loss_mask(batch), batch.trajectory)
        score_seconds = time.perf_counter() - started
        # 4. optimise
        started = time.perf_counter()
        stats = self.optimise(batch)
        update_seconds = time.perf_counter() - started
        # 5. metrics
        metrics = episode_metrics(trajectories)
        sampled = sum(t.num_action_tokens for t in trajectories)
        trained = int(batch.attention_mask.sum()) * cfg.epochs
        metrics.update(stats)
        metrics.update(stabilisers)
        metrics.update(
            rollout_tokens_per_s=sampled / max(rollout_seconds, 1e-9),
            update_tokens_per_s=trained / max(update_seconds, 1e-9),
            rollout_seconds=rollout_seconds,
            score_seconds=score_seconds,
            update_seconds=update_seconds,
            trained_tokens=trained,
            scored_tokens=int(batch.attention_mask.sum()),
            peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            learning_rate=self.scheduler.get_last_lr()[0],
            temperature=self.sampling.temperature,
        )
        if self.uses_critic:
            metrics["explained_variance"] = explained_variance(batch.old_values, batch.returns, batch.value_mask)
        metrics["warnings"] = self.echo_trap_warnings(metrics)
        return metrics

    def rollout(self) -> list[Trajectory]:
        """Episodes for this update (`rollout_starts`)."""
        groups, seeds = rollout_starts(self.config, self.state.step, self.distributed.process_index)
        return self.engine.run(self.env_factory(len(seeds)), seeds, groups=groups, generator=self.generator)

    @torch.no_grad()
    def score(self, batch: RolloutBatch) -> RolloutBatch:
        """Old log-probs and values from the current models, reference log-probs with the adapter off.

        With `train.old_logprobs: rollout` (and the loss mask on) the old log-probs are those the rollout sampled
        with, already in `batch`: the policy's pass here then only runs for a critic's values."""
        cfg = self.config.train
        reuse = cfg.old_logprobs == "rollout" and cfg.loss_mask
        old_logprobs, ref_logprobs, values = [], [], []
        temperature = self._temperature()
        micro_batches = batch.micro_batches(cfg.micro_batch_size, by_length=cfg.micro_batch_order == "length")
        for rows in micro_batches:
            micro = self._through_last_action(batch.select(rows))
            ids, mask, scored = micro.input_ids, micro.attention_mask, self._scored(micro.action_mask)
            if self.uses_critic or not reuse:
                out = token_outputs(
                    self.models.policy, self.models.critic, ids, mask, temperature=temperature,
                    chunk=cfg.logprob_chunk, with_values=self.uses_critic, token_mask=scored,
                    share_prefix=cfg.share_prefix,
                )
                old_logprobs.append(out.logprobs)
                values.append(out.values)
            with reference_context(self.models) as reference:
                ref_logprobs.append(token_logprobs(
                    reference, ids, mask, token_mask=scored, temperature=temperature, chunk_size=cfg.logprob_chunk,
                    share_prefix=cfg.share_prefix,
                ))
        order = torch.cat(micro_batches)
        if not reuse:
            batch.old_logprobs = _stack(old_logprobs, order, tuple(batch.input_ids.shape))
        batch.ref_logprobs = _stack(ref_logprobs, order, tuple(batch.input_ids.shape))
        batch.old_values = _stack(values, order, tuple(batch.input_ids.shape)) if self.uses_critic else None
        return batch

    def optimise(self, batch: RolloutBatch) -> dict:
        """Epochs × shuffled minibatches of segments, gradient accumulation over micro-batches."""
        cfg = self.config.train
        totals: dict[str, list[float]] = {}
        skipped = steps = 0
        order_generator = torch.Generator().manual_seed(self.config.seed * 7919 + self.state.step)
        most_rows = int(self.distributed.reduce(torch.tensor([batch.rows]), "max"))
        filler = None  # under DeepSpeed short minibatches are padded with rows of this batch, weighted by zero
        if self.distributed.deepspeed:
            filler = batch.select(torch.arange(min(batch.rows, cfg.micro_batch_size)))
        group = batch.group.cpu()  # row indices stay on the CPU, whatever device the batch is on
        for _ in range(cfg.epochs):
            order = _epoch_order(group, cfg.minibatches, order_generator)
            for start in range(0, most_rows, cfg.minibatch_size):  # every process takes the same number of steps
                rows = order[start : start + cfg.minibatch_size]
                # rows of one group side by side: a micro-batch of them shares more prefix (same gradient)
                minibatch = batch.select(rows[torch.argsort(group[rows], stable=True)])
                stats, finite = self.step(minibatch, filler)
                steps += 1
                skipped += not finite
                for key, value in stats.items():
                    totals.setdefault(key, []).append(value)
        summary = {key: sum(values) / len(values) for key, values in totals.items()}
        summary["skipped_steps"] = skipped
        summary["optimizer_steps"] = steps  # minibatches of token segments, not episodes
        return summary

    def step(self, minibatch: RolloutBatch, filler: RolloutBatch | None = None) -> tuple[dict, bool]:
        """One optimiser step over a minibatch; returns its stats and whether it was applied.

        Under DeepSpeed every process runs the same number of micro-batches (the optimiser steps after a fixed
        number, and ZeRO-2 reduces gradients during each backward, bucket by bucket in the order the graph
        produces them): a short minibatch is padded with `filler`, real rows of this process weighted by zero,
        so that the padding's backward reaches the parameters in the same order as a real one."""
        cfg = self.config.train
        self.distributed.zero_grad(self.optimizer)
        # each micro-batch's means weighed by its share of the minibatch's loss tokens (and value positions): the
        # gradient is the minibatch mean's, however the minibatch is cut into micro-batches
        tokens = self._loss_tokens(minibatch).sum().clamp(min=1e-12)
        positions = minibatch.value_mask.sum().clamp(min=1) if self.uses_critic else None
        stats: dict[str, float] = {}
        total_loss = 0.0
        micro_batches = minibatch.micro_batches(cfg.micro_batch_size, by_length=cfg.micro_batch_order == "length")
        padding = self.distributed.padding_micro_batches(len(micro_batches))
        for rows in micro_batches:
            micro = minibatch.select(rows)
            weight = float(self._loss_tokens(micro).sum() / tokens)
            value_weight = float(micro.value_mask.sum() / positions) if positions is not None else 0.0
            loss, micro_stats = self.loss(micro, weights=(weight, value_weight))
            self.distributed.backward(loss)
            total_loss += float(loss.detach())
            for key, value in micro_stats.items():  # counts (`*_tokens`) add up, means are weighed
                scale = 1.0 if key.endswith("_tokens") else value_weight if key.startswith("value_") else weight
                stats[key] = stats.get(key, 0.0) + value * scale
        for _ in range(padding):
            self.distributed.backward(self.loss(filler, weights=(0.0, 0.0))[0])
        grad_norm, finite = self.distributed.apply_gradients(self.optimizer, total_loss, cfg.max_grad_norm)
        stats.update(loss=total_loss, grad_norm=grad_norm)
        if finite:
            self.scheduler.step()
        return stats, finite

    def loss(
        self, micro: RolloutBatch, weights: tuple[float, float] = (1.0, 1.0)
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's loss on a micro-batch: the policy terms' mean over its loss-mask tokens times
        `weights[0]`, plus the value loss's mean over its value positions times `weights[1]`; the statistics are
        the unweighted means."""
        cfg = self.config.train
        micro = self._through_last_action(micro)
        mask = self._loss_mask(micro)
        out = token_outputs(
            self.models.policy, self.models.critic, micro.input_ids, micro.attention_mask,
            temperature=self._temperature(), chunk=cfg.logprob_chunk, with_values=self.uses_critic,
            token_mask=self._scored(micro.action_mask), share_prefix=cfg.share_prefix,
            choice=micro.side_choice, choice_ids=self._side_ids(),
        )
        pg, stats = policy_loss(
            out.logprobs, micro.old_logprobs, micro.advantages, mask, cfg.clip_low, cfg.clip_high,
            weights=micro.loss_weight,
        )
        entropy = entropy_bonus(out.entropy, mask, micro.loss_weight)
        loss = pg - cfg.entropy_coef * entropy
        if out.choice_probability is not None and micro.side_choice is not None and micro.side_pull is not None:
            # each side token weighs in the loss's token mean as its token's advantage does
            balance = token_mean(micro.side_pull * out.choice_probability, mask, micro.loss_weight)
            loss = loss - cfg.side_balance_coef * balance
            stats.update(self._side_entropy_stats(out.choice_probability.detach(), micro.side_choice))
        kl_tokens = kl_penalty(out.logprobs, micro.ref_logprobs, kind="k3")
        kl = masked_mean(kl_tokens, mask)
        if kl_in_loss(cfg) and uses_kl(cfg):
            loss = loss + token_mean(cfg.kl_coef * kl_tokens, mask, micro.loss_weight)
        stats = {**stats, "policy_loss": float(pg.detach()), "entropy": float(entropy.detach()), "kl_ref": float(kl.detach())}
        loss = loss * weights[0]
        if self.uses_critic:
            vf, vstats = value_loss(out.values, micro.old_values, micro.returns, micro.value_mask, cfg.value_clip)
            loss = loss + cfg.value_coef * vf * weights[1]
            stats.update(value_loss=float(vf.detach()), **{f"value_{k}": v for k, v in vstats.items()})
        return loss, stats

    # ------------------------------------------------------------------ helpers

    def _loss_tokens(self, batch: RolloutBatch) -> torch.Tensor:
        """Each token's weight in the loss's mean: the loss mask, times `loss_weight` under sequence aggregation."""
        mask = self._loss_mask(batch)
        return mask if batch.loss_weight is None else mask * batch.loss_weight

    def _loss_mask(self, batch: RolloutBatch) -> torch.Tensor:
        if self.config.train.loss_mask:
            return batch.action_mask
        valid = batch.attention_mask.float().clone()
        valid[:, 0] = 0.0  # the first token of a row has no prefix to predict it from
        return valid

    def _through_last_action(self, batch: RolloutBatch) -> RolloutBatch:
        """The batch cut after its last sampled token when both masks are on: attention is causal, so no later
        token changes a log-prob, value or loss term the update reads (with a mask off, later tokens count)."""
        cfg = self.config.train
        sampled = batch.action_mask.any(dim=0).nonzero()
        if not (cfg.loss_mask and cfg.advantage_mask) or len(sampled) == 0:
            return batch
        return batch.through_column(int(sampled.max()) + 1)

    def _scored(self, action_mask: torch.Tensor) -> torch.Tensor | None:
        """Tokens whose log-probs are needed: the sampled ones, or all when the loss mask is off (ablation)."""
        return action_mask if self.config.train.loss_mask else None

    def _side_ids(self) -> list[tuple[int, int]] | None:
        """Each place's long and short tokens, when the side-balance term is on."""
        return None if self.sides is None else [choice.ids for choice in self.sides]

    def _side_entropy_stats(self, long: torch.Tensor, side_choice: torch.Tensor) -> dict[str, float]:
        """The side choice's mean entropy, from P(long) (B, T), over every token that names a side and over each
        place's own (`side_entropy/action_word` near 0 with a high `side_entropy/side_argument` is a call that
        chooses again; the other way round, a call that copies its Action word)."""
        entropy = -(torch.special.xlogy(long, long) + torch.special.xlogy(1 - long, 1 - long))  # (B, T)
        stats = {"side_entropy": float(masked_mean(entropy, side_choice >= 0))}
        for index, choice in enumerate(self.sides or []):
            stats[f"side_entropy/{choice.place}"] = float(masked_mean(entropy, side_choice == index))
        return stats

    def _temperature(self) -> float:
        """The sampling temperature (1 for greedy, whose log-probs are untempered)."""
        t = self.config.rollout.temperature
        return t if t > 0 else 1.0

    def echo_trap_warnings(self, metrics: dict) -> list[str]:
        """RAGEN's echo trap: collapsing reward variance or entropy, or a spiking gradient norm; and a policy
        collapsed to one trade action."""
        cfg = self.config.train
        warnings = []
        if metrics.get("reward_std", 1.0) < cfg.echo_min_reward_std:
            warnings.append(f"reward std collapsed to {metrics['reward_std']:.2g}")
        if metrics.get("entropy", 1.0) < cfg.echo_min_entropy:
            warnings.append(f"entropy collapsed to {metrics['entropy']:.3g}")
        shares = {key.removeprefix("action_rate/"): v for key, v in metrics.items() if key.startswith("action_rate/")}
        if shares and max(shares.values()) >= cfg.echo_max_action_share:
            name = max(shares, key=shares.__getitem__)
            warnings.append(f"one action took {shares[name]:.0%} of the decisions ({name})")
        grad_norm = metrics.get("grad_norm")
        if grad_norm is not None and math.isfinite(grad_norm):
            if self.grad_norm_mean is not None and grad_norm > cfg.echo_grad_spike * self.grad_norm_mean:
                warnings.append(f"grad norm spiked to {grad_norm:.3g} (running mean {self.grad_norm_mean:.3g})")
            self.grad_norm_mean = grad_norm if self.grad_norm_mean is None else 0.9 * self.grad_norm_mean + 0.1 * grad_norm
        return warnings

    def _log(self, metrics: dict) -> None:
        metrics = self.distributed.mean_metrics(metrics)
        if not self.distributed.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        append_line(self.run_dir / METRICS_FILE, json.dumps(metrics, default=float))
        if self.on_update is not None:
            self.on_update(metrics)


def rollout_starts(config: Config, step: int, process_index: int = 0) -> tuple[list[int], list[int]]:
    """The groups and episode seeds of the rollout after `step` updates: `num_envs` environments, consecutive
    groups of `group_size` sharing a start; other processes play other start states."""
    n, size = config.rollout.num_envs, config.train.group_size
    groups = [process_index * n + i // size for i in range(n)]
    return groups, [_episode_seed(config.seed, step, g) for g in groups]


def _episode_seed(seed: int, update: int, group: int) -> int:
    return (seed * 1_000_003 + update * 10_007 + group) % (2**31 - 1)


def _stack(pieces: list[torch.Tensor], order: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Micro-batch outputs (r, t ≤ T), of rows `order` in turn, put back into (R, T) in the batch's row order;
    zeros after each piece's last column."""
    out = pieces[0].new_zeros(shape)
    start = 0
    for piece in pieces:
        out[order[start : start + piece.shape[0]].to(out.device), : piece.shape[1]] = piece
        start += piece.shape[0]
    return out


def _epoch_order(group: torch.Tensor, by: str, generator: torch.Generator) -> torch.Tensor:
    """The order an epoch visits the batch's rows in: a random permutation of the rows (`by="rows"`), or of the
    groups with each group's rows side by side in their batch order (`by="groups"`)."""
    if by == "rows":
        return torch.randperm(len(group), generator=generator)
    groups = group.unique()  # sorted
    shuffled = groups[torch.randperm(len(groups), generator=generator)]
    return torch.cat([(group == g).nonzero().flatten() for g in shuffled])

