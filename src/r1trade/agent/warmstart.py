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
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PrinterCallback, TrainerCallback

from r1trade.agent.baked_tools import bake_tools, without_baked_tools
from r1trade.agent.loop import ChatTokens
from r1trade.config import Config
from r1trade.env.information import SIGNAL_TOOL
from r1trade.env.trading_env import TradingEnv, make_envs
from r1trade.errors import ConfigError
from r1trade.outputs import write_file

TREND_BARS = 24


def demonstration_turn(env: TradingEnv) -> str:
    """The rule's turn for the env's current decision: one sentence of reasoning, then one trade call.

    Long half the equity with a 3 % stop when the last 24 bars rose more than 1 % and RSI is below 70; short
    (if allowed) on the mirror image; otherwise close an open position when the trend has faded, or hold.
    """
    change = env.replay.change_pct(env.bar, TREND_BARS)
    rsi_values = env.replay.feature_values.get("rsi_14")
    rsi = rsi_values[env.bar] if rsi_values else math.nan
    facts = f"{TREND_BARS} bars {change:+.2f}%" + (f", RSI {rsi:.0f}" if math.isfinite(rsi) else "")
    holding = env.portfolio.units != 0
    if change > 1.0 and not rsi >= 70:
        reason, call = f"Uptrend ({facts}), not overbought: go long half, stop 3%.", _order("long", "bullish")
    elif change < -1.0 and not rsi <= 30 and env.env_config.allow_short:
        reason, call = f"Downtrend ({facts}), not oversold: go short half, stop 3%.", _order("short", "bearish")
    elif holding and abs(change) < 0.3:
        reason, call = f"The trend has faded ({facts}): close the position.", _simple("close_position")
    else:
        reason, call = f"No clear signal ({facts}): hold.", _simple("hold")
    return f"{reason}\n<tool_call>{json.dumps(call)}</tool_call>"


def _order(side: str, view: str) -> dict:
    return {"name": "place_order", "arguments": {"side": side, "size": 0.5, "stop_loss": 3, "view": view}}


def _simple(name: str) -> dict:
    return {"name": name, "arguments": {"view": "neutral"}}


TRADE_ACTIONS = ("long", "short", "hold", "close")
ACTION_PROMPT = "Action:"
_SIZES = (0.25, 0.5, 0.75, 1.0)
_STOPS = (None, 1, 2, 3, 5)  # % from entry; None: no stop (the risk rule's penalty applies)
_TAKES = (None, None, 2, 4, 8)


def observed_changes(env: TradingEnv) -> str:
    """The price changes the observation shows over one and six decision intervals, as it shows them."""
    every = env.env_config.decision_every
    parts = []
    for bars in (every, 6 * every):
        change = env.replay.change_pct(env.bar, bars)
        parts.append(f"{bars} bars " + ("n/a" if math.isnan(change) else f"{change:+.2f}%"))
    return ", ".join(parts)


def random_turn(
    env: TradingEnv,
    rng: np.random.Generator,
    choices: Sequence[str] = TRADE_ACTIONS,
    *,
    plain: bool = False,
    looked: Sequence[str] = (),
    restate: Literal["all", "none"] = "all",
) -> str:
    """A uniformly random trade action after a line that restates the changes the agent has seen, and nothing else.

    The action is drawn from `choices` (long, short when allowed, hold and close by default); an order's size, stop
    and take-profit are drawn too, unless `plain` (the largest allowed size, no stop, no take-profit). The reasoning
    names no cause: it restates the changes the observation showed (`env.observation: full`), or one line of what
    each information tool `looked` at this decision returned (`restated_result`; nothing with `restate` none, so
    every trade turn is as short whatever was looked at), then `Action: <action>.`; the
    token after `Action:` is the one that picks the trade, and the call carries it out.
    """
    actions = [a for a in choices if a != "short" or env.env_config.allow_short]
    if not actions:
        raise ConfigError("warmstart.actions leaves nothing to do: add long, hold or close (shorts are not allowed)")
    action = actions[int(rng.integers(len(actions)))]
    if action in ("long", "short"):
        if plain:
            size, stop, take = min(1.0, env.env_config.max_position_frac), None, None
        else:
            size = min(_SIZES[int(rng.integers(len(_SIZES)))], env.env_config.max_position_frac)
            stop, take = _STOPS[int(rng.integers(len(_STOPS)))], _TAKES[int(rng.integers(len(_TAKES)))]
        arguments: dict = {"side": action, "size": size}
        if stop is not None:
            arguments["stop_loss"] = stop
        if take is not None:
            arguments["take_profit"] = take
        arguments["view"] = "bullish" if action == "long" else "bearish"
        call = {"name": "place_order", "arguments": arguments}
    else:
        call = _simple("hold" if action == "hold" else "close_position")
    if env.env_config.observation == "full":
        facts = [observed_changes(env)]
    else:  # each tool's answer restated alike (or none), so no tool's turn is longer to write than another's
        facts = [restated_result(env, name) for name in looked] if restate == "all" else []
    reasoning = "".join(f"{fact}. " for fact in facts) + f"{ACTION_PROMPT} {action}."
    return f"{reasoning}\n<tool_call>{json.dumps(call)}</tool_call>"


def information_arguments(env: TradingEnv, name: str) -> dict:
    """The plain arguments the random policy calls information tool `name` with."""
    return {"n": min(4, env.env_config.max_candles)} if name == "get_candles" else {}


def information_turn(env: TradingEnv, name: str) -> str:
    """A call of the information tool `name` with plain arguments, after a line that says only which tool."""
    call = {"name": name, "arguments": information_arguments(env, name)}
    return f"Check {name}.\n<tool_call>{json.dumps(call)}</tool_call>"


def restated_result(env: TradingEnv, name: str) -> str:
    """One line of what information tool `name` answers now: `get_changes` as `observed_changes`, the latest bar
    of `get_candles`, the first line of any other."""
    if name == SIGNAL_TOOL:
        return observed_changes(env)
    lines = env.registry[name].handler(information_arguments(env, name), env).text.splitlines()
    return lines[-1] if name == "get_candles" else lines[0]


def random_decision(
    env: TradingEnv,
    rng: np.random.Generator,
    choices: Sequence[str],
    *,
    plain: bool,
    max_info_calls: int,
    always_call: Sequence[str] = (),
    restate: Literal["all", "none"] = "all",
) -> list[str]:
    """The random policy's turns for one decision: the tools in `always_call`, then 0 to `max_info_calls` other
    distinct information tools (how many and which drawn at random), then `random_turn`, whose reasoning restates what they returned. Tools only read the
    market, so every turn can be written before the first is played."""
    count = int(rng.integers(max_info_calls + 1)) if max_info_calls else 0
    tools = sorted(env.info_tools - set(always_call))
    looked = [*always_call, *([tools[i] for i in rng.permutation(len(tools))[:count]] if count else [])]
    return [*(information_turn(env, name) for name in looked),
            random_turn(env, rng, choices, plain=plain, looked=looked, restate=restate)]


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
    planned: list[str] = []  # the random policy's turns left in this decision

    def next_turn(env: TradingEnv) -> str:
        nonlocal planned
        if warm.policy == "rule":
            return demonstration_turn(env)
        planned = planned or random_decision(
            env, actions, warm.actions, plain=warm.orders == "plain", max_info_calls=warm.max_info_calls,
            always_call=warm.always_call, restate=warm.restate,
        )
        return planned.pop(0)

    for env in make_envs(config, episodes, "train"):
        if unknown := sorted(set(warm.always_call) - env.info_tools):
            raise ConfigError(f"warmstart.always_call names {unknown[0]!r}, not one of the information tools "
                              f"{', '.join(sorted(env.info_tools))}")
        episode_seed = int(rng.integers(2**31 - 1))
        planned.clear()
        played, episode = _play_episode(env, episode_seed, chat, next_turn)
        examples += episode
        if warm.both_sides:  # the same episode again, every long a short and every short a long
            mirrored = iter([mirrored_turn(text) for text in played])
            examples += _play_episode(env, episode_seed, chat, lambda _env, turns=mirrored: next(turns))[1]
    return examples


def _play_episode(
    env: TradingEnv, seed: int, chat: ChatTokens, next_turn: Callable[[TradingEnv], str]
) -> tuple[list[str], list[dict]]:
    """Play one demonstration episode from `env.reset(seed)`, each turn from `next_turn`: the turns played and
    the tokenized examples."""
    played, examples = [], []
    messages, _ = env.reset(seed=seed)
    ids = chat.context(messages)
    mask = [0] * len(ids)
    while True:
        text = next_turn(env)
        played.append(text)
        turn = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
        end, *rest = chat.closing(turn)  # the model learns to emit the end-of-turn token, not what follows
        ids += [*turn, end, *rest]
        mask += [1] * (len(turn) + 1) + [0] * len(rest)
        messages, _, terminated, truncated, info = env.step(text)
        if terminated or truncated or info.get("context_reset"):
            examples.append({"input_ids": ids, "completion_mask": mask})
            if terminated or truncated:
                return played, examples
            ids = chat.context(messages)
            mask = [0] * len(ids)
            continue
        following = chat.continuation(messages)
        ids += following
        mask += [0] * len(following)


_OPPOSITE = {"long": "short", "short": "long", "bullish": "bearish", "bearish": "bullish"}


def mirrored_turn(text: str) -> str:
    """`text` with the side of its order swapped (reasoning, side and view); any other turn unchanged."""
    reasoning, _, rest = text.partition("\n<tool_call>")
    call = json.loads(rest.removesuffix("</tool_call>")) if rest else {}
    if call.get("name") != "place_order":
        return text
    side = call["arguments"]["side"]
    call["arguments"] = {key: _OPPOSITE.get(value, value) if key in ("side", "view") else value
                         for key, value in call["arguments"].items()}
    reasoning = reasoning.replace(f"{ACTION_PROMPT} {side}.", f"{ACTION_PROMPT} {_OPPOSITE[side]}.")
    return f"{reasoning}\n<tool_call>{json.dumps(call)}</tool_call>"


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

    `tools` (JSON schemas) are baked into the saved chat template (`r1trade.agent.baked_tools`), and the
    demonstrations rendered with them, for a model that TRL's GRPOTrainer will train: it renders the env's tools in
    the system turn. Progress shows as a Rich bar on `console` (default: a new one on stdout)."""
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from trl import SFTConfig, SFTTrainer

    from r1trade.agent.loading import load_base_model

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
    examples = collect_demonstrations(played, chat, episodes=settings.episodes, seed=config.seed)
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
        seed=config.seed,
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
    progress = RichProgress(f"warm start {config.name}", console)
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
    write_file(run_dir / "warmstart.json", json.dumps({"examples": len(examples), "log": history}, indent=1) + "\n")
    return out
