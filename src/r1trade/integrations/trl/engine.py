"""`r1trade train` with `train.engine: trl`: TRL's GRPOTrainer on `TradingToolEnv`, into r1trade's run folder.

`TRLTrainer` stands where `r1trade.rl.trainer.Trainer` stands in `r1trade.train.train_run` (same lock, same
`--force`, same progress bar, `config.yaml` and `splits.json`), builds the GRPOTrainer from the run's config
(`settings`), and writes r1trade's metrics and checkpoints (`run_log`, `checkpoints`). Generation and scoring run
the model as transformers builds it (no oneDNN linears, no decoding kernel, SDPA attention), as on any GPU.

`--resume` continues a run from its last complete checkpoint as the native trainer does (`TRLTrainer.resume`):
TRL trains the updates left, numbered after the checkpoint's, on the windows a run that never stopped would play
next, from the checkpoint's weights, optimiser, scheduler and random-number states.

The model's chat template must be one whose tool calls TRL parses (`add_response_schema`: Qwen 2.5/3, Llama 3.1/3.2,
GLM-4-MoE, gpt-oss, ...) and whose call syntax is r1trade's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the Qwen templates): the env's system prompt and the warm start teach that syntax. `tiny-random-qwen` is the
built-in model with such a template.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from accelerate.utils import DistributedType
from datasets import Dataset
from peft import LoraConfig as PeftLoraConfig
from transformers import PreTrainedTokenizerBase, PrinterCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import add_response_schema, parse_response

from r1trade.config import Config, ModelConfig
from r1trade.errors import ConfigError, TrainingInterrupted, UsageError
from r1trade.integrations.trl.checkpoints import RestoreTraining, load_trl_policy, read_training_states
from r1trade.integrations.trl.environment import environment_factory, tool_schemas, window_rows
from r1trade.integrations.trl.run_log import RunLog
from r1trade.integrations.trl.settings import grpo_arguments, steps_per_update
from r1trade.models.baked_tools import baked_tools, without_baked_tools
from r1trade.models.chat_template import render_chat
from r1trade.models.loading import load_named_model
from r1trade.rl.checkpoint import TrainingState
from r1trade.rl.checkpoint_paths import checkpoint_dir, latest_checkpoint
from r1trade.rl.metrics_log import METRICS_FILE, truncate_records
from r1trade.safe_load import first_line

_PROBE_CALL = '<tool_call>{"name": "hold", "arguments": {"view": "neutral"}}</tool_call>'
_PROBE_PARSED = [{"type": "function", "function": {"name": "hold", "arguments": {"view": "neutral"}}}]


class TRLTrainer:
    """Trains `config` with TRL's GRPOTrainer into `run_dir`; `on_update` gets each update's metrics record."""

    def __init__(self, config: Config, run_dir: Path, *, on_update: Callable[[dict], None] | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        try:
            args = GRPOConfig(**grpo_arguments(config, run_dir))
        except (TypeError, ValueError) as exc:  # an unknown or invalid train.trl_args entry
            raise ConfigError(f"train.engine trl: GRPOConfig refused the settings: {first_line(exc)}") from None
        _refuse_sharded_weights(args)
        # transformers' own linears and attention: TRL generates with `generate` and scores with gradients, where
        # r1trade's CPU fast paths bring nothing
        model, tokenizer = load_named_model(config.model)  # a folder that would need code of its own is refused
        trl_tokenizer = without_tools_of(tokenizer, config)
        require_r1trade_calls(trl_tokenizer, config.model.name_or_path)
        self.state = TrainingState()
        self.log = RunLog(config, run_dir, tokenizer, on_update=on_update)
        self.windows_per_update = config.rollout.num_envs // config.train.group_size * args.world_size
        self.trainer = GRPOTrainer(
            model=model,
            args=args,
            train_dataset=self._windows_after(0),
            processing_class=trl_tokenizer,
            peft_config=_peft_config(config.model),
            environment_factory=environment_factory(config, on_episode=self.log.add_episode),
            callbacks=[self.log],
        )
        self.trainer.remove_callback(PrinterCallback)  # r1trade prints its own progress

    def resume(self) -> Path | None:
        """Continue the run from its last complete checkpoint, as `r1trade.rl.trainer.Trainer.resume` does: load its
        policy now, restore its optimiser, scheduler and random-number states as training starts (`RestoreTraining`:
        TRL builds the optimiser only then), leave TRL the updates after it, and cut the metrics log back to it.
        Returns the checkpoint, or None when the run has none."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            return None
        saved = read_training_states(checkpoint)
        if saved.optimizer is None or self.trainer.args.deepspeed_plugin is not None:
            raise UsageError(
                f"cannot resume '{self.run_dir}' under DeepSpeed or from a checkpoint written under it: train.engine "
                "trl keeps no DeepSpeed optimiser state; resume without DeepSpeed a run trained without it"
            )
        load_trl_policy(self.config, self.trainer.model, self.trainer.processing_class, checkpoint / "policy")
        self.trainer.add_callback(RestoreTraining(saved))
        self._continue_after(saved.update)
        truncate_records(self.run_dir / METRICS_FILE, saved.update)
        return checkpoint

    def _continue_after(self, done: int) -> None:
        """Leave TRL the updates after the first `done`: their windows and their optimiser steps. TRL counts its
        steps from 0 again; `RunLog` numbers its updates from `done` + 1."""
        self.state = TrainingState(step=done)
        self.log.earlier_updates = done
        self.trainer.train_dataset = self._windows_after(done)
        self.trainer.args.max_steps = self._updates_after(done) * steps_per_update(self.config)

    def _updates_after(self, done: int) -> int:
        return max(self.config.train.updates - done, 0)  # none: `r1trade.train` refuses to resume a finished run

    def _windows_after(self, done: int) -> Dataset:
        """The dataset rows of the updates after the first `done`: the windows `window_rows` draws for them, the
        same whether the run stopped after `done` updates or not (TRL takes the rows in order)."""
        count, first = self._updates_after(done) * self.windows_per_update, done * self.windows_per_update
        return Dataset.from_list(window_rows(self.config, count, first=first))

    def train(self) -> Path:
        """Run the updates left; return the final checkpoint. Signals stop the run as they stop the native
        trainer's (`r1trade.rl.stopping`), with `TrainingInterrupted`."""
        with self.log.stop.listening():
            try:
                self.trainer.train()
            except KeyboardInterrupt:
                raise TrainingInterrupted(latest_checkpoint(self.run_dir)) from None
        if self.log.stopped_at is not None:
            raise TrainingInterrupted(self.log.stopped_at)
        return checkpoint_dir(self.run_dir, self.config.train.updates)  # (written by the main process)


def _refuse_sharded_weights(args: GRPOConfig) -> None:
    """r1trade's checkpoints save the policy from the main process, which must hold the whole weights."""
    plugin = args.deepspeed_plugin
    if (plugin is not None and plugin.zero_stage == 3) or args.distributed_state.distributed_type == DistributedType.FSDP:
        raise UsageError(
            "train.engine trl saves r1trade checkpoints from the main process, which needs the whole weights: launch "
            "with DDP or DeepSpeed ZeRO stage 1 or 2, not ZeRO-3 or FSDP"
        )


def without_tools_of(tokenizer: PreTrainedTokenizerBase, config: Config) -> PreTrainedTokenizerBase:
    """What GRPOTrainer gets: `tokenizer`, or for a model warm-started for TRL a copy without the baked tools (TRL
    passes the env's tools itself and recognises a template by its text), after checking that the baked tools are the
    env's."""
    baked = baked_tools(tokenizer.chat_template)
    if baked is None:
        return tokenizer
    if baked != tool_schemas(config):
        raise ConfigError(
            f"train.engine trl: model '{config.model.name_or_path}' was warm-started for other tools than this "
            "config's env offers; warm-start it again with this config and train.engine trl"
        )
    trl_tokenizer = copy.deepcopy(tokenizer)
    trl_tokenizer.chat_template = without_baked_tools(tokenizer.chat_template)
    return trl_tokenizer


def require_r1trade_calls(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Set the tokenizer's response template (TRL's `add_response_schema`), and refuse a chat template that TRL
    cannot parse tool calls from, or whose call syntax is not r1trade's (TRL would read none of the model's calls)."""
    try:
        add_response_schema(tokenizer)
    except ValueError:
        raise ConfigError(
            f"train.engine trl: model '{name}' has a chat template TRL parses no tool calls from; use a model with a "
            "Qwen 2.5/3 template (e.g. tiny-random-qwen)"
        ) from None
    prefix = render_chat(tokenizer, [{"role": "user", "content": "x"}], add_generation_prompt=True)
    ids = tokenizer(f"Flat.\n{_PROBE_CALL}", add_special_tokens=False)["input_ids"]
    parsed = parse_response(tokenizer, ids, prefix=tokenizer(prefix, add_special_tokens=False)["input_ids"])
    if parsed.get("tool_calls") != _PROBE_PARSED:
        raise ConfigError(
            f"train.engine trl: the chat template of model '{name}' calls tools in another syntax than r1trade's "
            "<tool_call>{...}</tool_call>, which its prompt and warm start teach; use a model with a Qwen template"
        )


def _peft_config(model_config: ModelConfig) -> PeftLoraConfig | None:
    """The LoRA adapter of `model.lora` (as r1trade's own loop builds it), or None for full fine-tuning."""
    lora = model_config.lora
    if not lora.enabled:
        return None
    targets = "all-linear" if lora.target_modules == ["all-linear"] else lora.target_modules
    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                          task_type="CAUSAL_LM")
