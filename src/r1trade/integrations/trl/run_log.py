"""A TrainerCallback that gives a TRL run r1trade's run folder: one `metrics.jsonl` record per update, with the
native trainer's episode figures, and checkpoints every `train.checkpoint_every` updates and at the end.

A signal that asks the run to stop (`r1trade.rl.stopping`; `stop`) ends it after the update under way, checkpointed
(`stopped_at`), on every process alike.

An update is one generation round (`settings.steps_per_update` optimiser steps); a resumed run numbers its updates
after the checkpoint's (`earlier_updates`), as TRL counts its steps from 0 again. The episode figures (return, each
reward component, valid-call rate, direction accuracy, PnL, information-tool use) come from the episodes the
environments finished during the round, through the native `episode_metrics`; the optimisation figures are TRL's
logs averaged over the round's steps, under r1trade's names where one exists (`kl_ref`, `entropy`, `grad_norm`,
`clipfrac`) and as `trl/<name>` otherwise. `update_seconds` is the update's whole wall time (TRL reports no
phases), so a ladder record's training time (`r1trade.eval.ladder.training_cost`) counts all of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object
from transformers import PreTrainedTokenizerBase, TrainerCallback

from r1trade.config import Config
from r1trade.integrations.trl.checkpoints import save_trl_checkpoint
from r1trade.integrations.trl.environment import Episode
from r1trade.integrations.trl.settings import steps_per_update
from r1trade.outputs import append_line
from r1trade.rl.checkpoint_paths import checkpoint_dir
from r1trade.rl.episode_metrics import episode_metrics
from r1trade.rl.metrics_log import METRICS_FILE
from r1trade.rl.stopping import StopRequest
from r1trade.rollout.loop import Trajectory, Turn

TRL_NAMES = {"kl": "kl_ref", "entropy": "entropy", "grad_norm": "grad_norm", "loss": "loss",
             "learning_rate": "learning_rate", "clip_ratio/region_mean": "clipfrac"}
"""TRL's log keys that have an r1trade name (plot-run draws these)."""


def trajectory(episode: Episode) -> Trajectory:
    """An episode as the native trainer's record of it (its turns and infos; no tokens)."""
    turns = [Turn(segment=0, start=0, end=0, text=text, reward=reward, truncated=False, info=info)
             for text, reward, info in episode.turns]
    return Trajectory(seed=episode.seed, group=episode.start, turns=turns)


def update_metrics(episodes: Sequence[Episode], logs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One update's record: the episodes' figures as the native trainer computes them, the share of rollouts that
    ended before their episode (`ended_early_rate`), and TRL's logs of the update's steps averaged."""
    metrics = episode_metrics([trajectory(episode) for episode in episodes])
    metrics["ended_early_rate"] = sum(episode.played_out > 0 for episode in episodes) / max(len(episodes), 1)
    for key in sorted({key for log in logs for key in log}):
        values = [log[key] for log in logs if isinstance(log.get(key), int | float) and not isinstance(log[key], bool)]
        if values:
            metrics[TRL_NAMES.get(key, f"trl/{key}")] = sum(values) / len(values)
    return metrics


class RunLog(TrainerCallback):
    """Collects finished episodes (`add_episode`, the environments' `on_episode`) and TRL's per-step logs; at the
    end of each update writes its metrics record, calls `on_update` with it, and writes the checkpoints."""

    def __init__(
        self, config: Config, run_dir: Path, tokenizer: PreTrainedTokenizerBase, *,
        on_update: Callable[[dict], None] | None = None,
    ) -> None:
        """`tokenizer` is what checkpoints save: the model's own, with its baked tools, not TRL's copy."""
        self.config = config
        self.run_dir = run_dir
        self.tokenizer = tokenizer
        self.on_update = on_update
        self.per_update = steps_per_update(config)
        self.earlier_updates = 0
        """Updates finished before TRL started: those of the checkpoint a resumed run continues from."""
        self.episodes: list[Episode] = []
        self.logs: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.stop = StopRequest()
        self.stopped_at: Path | None = None
        """The checkpoint of the update a stop signal ended the run after."""

    def add_episode(self, episode: Episode) -> None:
        self.episodes.append(episode)

    def on_log(self, args, state, control, logs=None, model=None, optimizer=None, lr_scheduler=None,
               **kwargs) -> None:
        """Every process logs each optimiser step (logging_steps 1); the run's closing summary has no loss."""
        if not logs or "loss" not in logs:
            return
        self.logs.append(dict(logs))
        if state.global_step % self.per_update:
            return
        update = self.earlier_updates + state.global_step // self.per_update
        episodes = gather_object(self.episodes)  # every process's episodes (a collective: all processes get here)
        stopping = any(gather_object([self.stop.asked is not None]))
        metrics = {"update": update, **update_metrics(episodes, self.logs)}
        metrics["update_seconds"] = time.perf_counter() - self.started
        self.episodes, self.logs, self.started = [], [], time.perf_counter()
        train = self.config.train
        if stopping and update < train.updates:
            control.should_training_stop = True
            self.stopped_at = checkpoint_dir(self.run_dir, update)
        if not state.is_world_process_zero:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        append_line(self.run_dir / METRICS_FILE, json.dumps(metrics, default=float))
        if stopping or update % train.checkpoint_every == 0 or update == train.updates:
            save_trl_checkpoint(
                self.config, self.run_dir, update, model=model, tokenizer=self.tokenizer, optimizer=optimizer,
                scheduler=lr_scheduler, sharded_optimizer=args.deepspeed_plugin is not None,
            )
        if self.on_update is not None:
            self.on_update(metrics)
