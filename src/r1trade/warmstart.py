"""Supervised warm start: teach the tool-call format before RL, with TRL's SFTTrainer on demonstrations.

A small instruct model almost never ends its turn with a valid `<tool_call>` in this environment, so RL would get
no signal. Demonstrations are played through the real `TradingEnv` by one of two policies (`warmstart.policy`):
- `rule`: a trend-following rule that reads only what the observation shows (the 24-bar change and RSI). The model
  learns the format and the rule's commonest openings: a strategy RL then has to unlearn.
- `random`: trade actions drawn uniformly (long, short, hold, close; sizes and stops varied) after a reasoning line
  that restates the observed changes and claims nothing more. The model learns the format and keeps entropy over
  actions, so RL has actions to compare and whatever strategy it finds is RL's.
Each example is the exact token context the rollout engine would build (same chat rendering, from ids) followed by
the policy's turn, and the loss covers the turn only. The LoRA adapter is then merged and saved as a full model
directory that `model.name_or_path` can point to.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PrinterCallback, TrainerCallback

from r1trade.config import Config
from r1trade.env.demonstrations import demonstration_turn, random_decision
from r1trade.env.trading_env import make_envs
from r1trade.errors import ConfigError
from r1trade.eval.action_balance import first_update_shares
from r1trade.models.baked_tools import bake_tools, without_baked_tools
from r1trade.models.chat import ChatTokens
from r1trade.outputs import write_file


def warm_start_seed(seed: int, draw: int) -> int:
    """The seed of draw `draw` of seed `seed`'s warm start (demonstrations and SFT order): the seed itself for
    draw 0, so a config without `warmstart.draw` draws as before; else a 31-bit seed spawned from both.

    >>> warm_start_seed(4, 0), warm_start_seed(0, 1), warm_start_seed(1, 1)
    (4, 1817441348, 1189033389)
    """
    if draw == 0:
        return seed
    return int(np.random.SeedSequence([seed, draw]).generate_state(1)[0]) & 0x7FFFFFFF


def collect_demonstrations(config: Config, chat: ChatTokens, *, episodes: int, seed: int) -> list[dict]:
    """Play `warmstart.policy` through `episodes` train-split episodes; one tokenized example per conversation.

    An example is laid out exactly as the rollout engine lays out a trajectory segment: the first context, then
    per decision the rule's turn and its end-of-turn token (`completion_mask` 1), the template's closing and the
    next observation (mask 0). The system prompt is paid for once per episode rather than once per turn. A
    context reset starts a new example, as it starts a new segment in a rollout.
    """
    examples = []
    rng = np.random.default_rng(seed)
    actions = np.random.default_rng([seed, 1])  # the random policy's draws, apart from the episode seeds
    warm = config.warmstart
    if warm.policy == "random" and warm.max_info_calls + len(warm.always_call) >= config.env.max_tool_calls:
        raise ConfigError(
            f"warmstart.max_info_calls ({warm.max_info_calls}) plus always_call ({len(warm.always_call)}) must be "
            f"below env.max_tool_calls "
            f"({config.env.max_tool_calls}): the trade would be a forced hold"
        )
    for env in make_envs(config, episodes, "train"):
        if unknown := sorted(set(warm.always_call) - env.info_tools):
            raise ConfigError(f"warmstart.always_call names {unknown[0]!r}, not one of the information tools "
                              f"{', '.join(sorted(env.info_tools))}")
        messages, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
        ids = chat.context(messages)
        mask = [0] * len(ids)
        planned: list[str] = []  # the random policy's turns left in this decision
        while True:
            if warm.policy == "rule":
                text = demonstration_turn(env)
            else:
                planned = planned or random_decision(
                    env, actions, warm.actions, plain=warm.orders == "plain", max_info_calls=warm.max_info_calls,
                    always_call=warm.always_call, restate=warm.restate,
                )
                text = planned.pop(0)
            turn = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
            end, *rest = chat.closing(turn)  # the model learns to emit the end-of-turn token, not what follows
            ids += [*turn, end, *rest]
            mask += [1] * (len(turn) + 1) + [0] * len(rest)
            messages, _, terminated, truncated, info = env.step(text)
            if terminated or truncated or info.get("context_reset"):
                examples.append({"input_ids": ids, "completion_mask": mask})
                if terminated or truncated:
                    break
                ids = chat.context(messages)
                mask = [0] * len(ids)
                continue
            following = chat.continuation(messages)
            ids += following
            mask += [0] * len(following)
    return examples


def longest_turn(examples: list[dict]) -> int:
    """Tokens the longest demonstration turn needs from the model, up to its `</tool_call>` (the rollout engine
    stops there; the end-of-turn token that follows in the examples is not sampled)."""
    longest = run = 0
    for example in examples:
        for bit in [*example["completion_mask"], 0]:
            run = run + 1 if bit else 0
            longest = max(longest, run - 1)
    return longest


def check_turns_fit(examples: list[dict], max_new_tokens: int) -> None:
    """Refuse demonstrations whose turns the rollout would cut off: a model that learned them could never finish a
    trade within `rollout.max_new_tokens`, and every trade it tried would be a malformed turn."""
    needed = longest_turn(examples)
    if needed > max_new_tokens:
        raise ConfigError(
            f"demonstration turns take up to {needed} tokens but rollout.max_new_tokens is {max_new_tokens}: "
            f"raise it to at least {needed} (--set rollout.max_new_tokens={needed})"
        )


class RichProgress(TrainerCallback):
    """The trainer's steps as a Rich progress bar with the latest loss and token accuracy, in place of the log
    dicts the trainer prints by default (they are kept in `warmstart.json`)."""

    def __init__(self, description: str, console: Console | None = None) -> None:
        self.description = description
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), console=console or Console(),
        )
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.task = self.progress.add_task(self.description, total=state.max_steps, figures="")
        self.progress.start()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if logs and "loss" in logs:
            self.progress.update(self.task, figures=_figures(logs))

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.progress.update(self.task, completed=state.global_step)
        self.stop()

    def stop(self) -> None:
        """End the live display (also after an error, so the terminal is left as it was)."""
        if self.progress.live.is_started:
            self.progress.stop()


def _figures(logs: dict) -> str:
    """The key numbers of a trainer log entry (values may be numbers or formatted strings)."""
    parts = [f"loss {float(logs['loss']):.3f}"]
    if "mean_token_accuracy" in logs:
        parts.append(f"token accuracy {float(logs['mean_token_accuracy']):.0%}")
    return " · ".join(parts)


def warmstart(
    config: Config, run_dir: Path, *, tools: list[dict] | None = None, console: Console | None = None
) -> Path:
    """Fine-tune the configured model on demonstrations; returns the merged model's directory.

    `tools` (JSON schemas) are baked into the saved chat template (`r1trade.models.baked_tools`), and the
    demonstrations rendered with them, for a model that TRL's GRPOTrainer will train: it renders the env's tools in
    the system turn. Progress shows as Rich bars on `console` (default: a new one on stdout). With
    `warmstart.min_action_share`, each draw is checked once trained (`first_update_shares`), and the next is trained
    in its place while the check fails, `warmstart.draws` at most; `warmstart.json` keeps every draw's shares."""
    settings = config.warmstart
    if tools is not None and settings.min_action_share is not None:
        raise ConfigError("warmstart.min_action_share checks a warm start in r1trade's own rollout, not in TRL's "
                          "GRPOTrainer (train.engine trl): leave it unset")
    console = console or Console()
    checks = []
    for draw in range(settings.draw, settings.draw + settings.draws):
        out, log = _train_draw(config, run_dir, draw, tools=tools, console=console)
        if settings.min_action_share is None:
            break
        shares = first_update_shares(config, out)
        passed = min(shares.values()) >= settings.min_action_share
        checks.append({"draw": draw, "action_shares": shares, "passed": passed})
        sampled = ", ".join(f"{action} {share:.0%}" for action, share in shares.items())
        console.print(f"warm start draw {draw} samples {sampled} of its first update's trades: " + (
            "kept" if passed else f"an action under {settings.min_action_share:.0%}" + (
                ", the next draw is trained" if draw + 1 < settings.draw + settings.draws else ", kept as the last")
        ))
        if passed:
            break
    if checks:
        log["checks"] = checks
    write_file(run_dir / "warmstart.json", json.dumps(log, indent=1) + "\n")
    return out


def _train_draw(
    config: Config, run_dir: Path, draw: int, *, tools: list[dict] | None, console: Console
) -> tuple[Path, dict]:
    """Train draw `draw` of the warm start into `run_dir / "model"` (replacing an earlier draw's); returns that
    directory and the draw's log (examples, seed, the trainer's loss history)."""
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from trl import SFTConfig, SFTTrainer

    from r1trade.models.loading import load_base_model

    settings = config.warmstart
    # the adapter is merged into the weights saved below: with `auto` they stay float32, so the saved model is the
    # same on every machine (bfloat16 only where asked for by name)
    model_config = config.model
    if model_config.dtype == "auto":
        model_config = model_config.model_copy(update={"dtype": "float32"})
    model, tokenizer = load_base_model(model_config)
    if tools is not None:
        tokenizer.chat_template = bake_tools(without_baked_tools(tokenizer.chat_template), tools)
    chat = ChatTokens(tokenizer)
    played = config
    if settings.episode_decisions is not None:
        env = config.env.model_copy(update={"episode_decisions": settings.episode_decisions})
        played = config.model_copy(update={"env": env})
    seed = warm_start_seed(config.seed, draw)
    examples = collect_demonstrations(played, chat, episodes=settings.episodes, seed=seed)
    check_turns_fit(examples, config.rollout.max_new_tokens)
    lora = config.model.lora
    peft_config = (
        PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                       target_modules=lora.target_modules, task_type="CAUSAL_LM")
        if lora.enabled else None
    )
    args = SFTConfig(
        output_dir=str(run_dir / "sft"),
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(5, settings.max_steps // 5),
        logging_steps=max(1, settings.max_steps // 10),
        save_strategy="no",
        report_to=[],
        completion_only_loss=True,
        max_length=None,
        seed=seed,
        disable_tqdm=True,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        activation_checkpointing=config.model.gradient_checkpointing,  # TRL turns it on by default; memory is ample
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer, peft_config=peft_config,
    )
    progress = RichProgress(f"warm start {config.name}" + (f" (draw {draw})" if draw else ""), console)
    trainer.remove_callback(PrinterCallback)  # its printed log dicts are replaced by the progress bar
    trainer.add_callback(progress)
    try:
        trainer.train()
    finally:
        progress.stop()
    trained = trainer.model.merge_and_unload() if peft_config is not None else trainer.model
    out = run_dir / "model"
    trained.save_pretrained(out)
    tokenizer.save_pretrained(out)
    history = [row for row in trainer.state.log_history if "loss" in row]
    return out, {"examples": len(examples), "seed": seed, "draw": draw, "log": history}
