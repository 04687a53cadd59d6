"""Typed configuration: one pydantic model per section, loaded from YAML with `--set a.b=c` overrides.

A config names everything a run depends on, so a run directory's `config.yaml` is enough to repeat it.
Unknown keys are rejected (with the closest valid key), and wrong types name the field and the expected type.
"""

from __future__ import annotations

import difflib
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from r1trade.errors import ConfigError, UsageError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The source checkout holding `configs/` and `data/` (for an editable or source install)."""


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- data


class SplitConfig(Section):
    """Time-ordered train / validation / test split; never shuffled across time."""

    method: Literal["fraction", "dates"] = "fraction"
    train: float = Field(0.7, gt=0, lt=1, description="fraction of bars for training (method=fraction)")
    validation: float = Field(0.15, ge=0, lt=1)
    test: float = Field(0.15, gt=0, lt=1)
    train_end: datetime | None = Field(None, description="last timestamp of the train split (method=dates)")
    validation_end: datetime | None = Field(None, description="last timestamp of the validation split")
    embargo_bars: int = Field(0, ge=0, description="bars dropped between consecutive splits")

    @model_validator(mode="after")
    def _check(self) -> SplitConfig:
        if self.method == "fraction" and abs(self.train + self.validation + self.test - 1.0) > 1e-9:
            raise ValueError(
                f"train + validation + test must add up to 1, got {self.train + self.validation + self.test:g}"
            )
        if self.method == "dates":
            if self.train_end is None or self.validation_end is None:
                raise ValueError("method 'dates' needs both train_end and validation_end")
            if self.validation_end <= self.train_end:
                raise ValueError("validation_end must be after train_end")
        return self


class DataConfig(Section):
    """Where the candles come from and how they are split."""

    path: str = "data/sample/btc_usd_1h.parquet"
    sentiment_path: str | None = Field(None, description="optional CSV with a sentiment series (e.g. Fear & Greed)")
    split: SplitConfig = SplitConfig()


# --------------------------------------------------------------------------- environment


class EnvConfig(Section):
    """The trading environment: replay, portfolio, frictions and episode shape."""

    initial_cash: float = Field(10_000.0, gt=0)
    fee_bps: float = Field(10.0, ge=0, description="fee on every fill, basis points of notional")
    slippage_bps: float = Field(2.0, ge=0, description="fixed slippage, basis points of price")
    slippage_vol_frac: float = Field(0.05, ge=0, description="random slippage scale, fraction of recent volatility")
    allow_short: bool = True
    max_position_frac: float = Field(1.0, gt=0, description="largest position as a fraction of equity")
    max_leverage: float = Field(1.0, ge=1)
    decision_every: int = Field(4, ge=1, description="bars between two decisions")
    episode_decisions: int = Field(12, ge=1, description="decisions per episode")
    warmup_bars: int = Field(100, ge=1, description="history bars before the first decision")
    max_tool_calls: int = Field(3, ge=1, description="tool calls per decision before a forced hold")
    history_turns: int = Field(2, ge=0, description="past turns kept in full in the prompt")
    indicators: list[str] = ["rsi_14", "macd_hist", "bb_pctb", "atr_14", "sma_20", "ema_50", "volume_z"]


class RewardsConfig(Section):
    """Weights of each reward component; the outcome (PnL) terms dominate by default."""

    valid_call: float = 0.05
    format_penalty: float = -0.2
    tool_error: float = -0.1
    pattern: float = 0.05
    pattern_horizon_bars: int = Field(4, ge=1)
    pattern_threshold: float = Field(0.002, ge=0, description="forward return beyond which a view counts as right")
    risk: float = 0.02
    pnl: float = 1.0
    terminal: float = 1.0
    bankruptcy_penalty: float = -1.0


# --------------------------------------------------------------------------- model, rollout, training


class LoraConfig(Section):
    enabled: bool = True
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelConfig(Section):
    """The policy (and critic) language model."""

    name_or_path: str = "smollm2-135m-instruct"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    cache_dir: str | None = Field(None, description="where converted weights are kept (default: ~/.cache/r1trade)")
    lora: LoraConfig = LoraConfig()
    critic: Literal["value_head", "separate"] = "value_head"


class RolloutConfig(Section):
    """How episodes are sampled from the policy."""

    num_envs: int = Field(8, ge=1)
    max_new_tokens: int = Field(96, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)


class TrainConfig(Section):
    """The RL algorithm and its optimisation settings."""

    algorithm: Literal["ppo", "grpo", "reinforce_pp"] = "ppo"
    updates: int = Field(20, ge=1)
    learning_rate: float = Field(1e-5, gt=0)


class BacktestConfig(Section):
    """Held-out evaluation."""

    split: Literal["train", "validation", "test"] = "test"
    strategies: list[str] = ["buy_and_hold", "sma_crossover", "rsi_mean_reversion", "random"]
    random_seeds: int = Field(5, ge=1, description="seeds averaged for the random baseline")
    risk_free_rate: float = Field(0.0, description="annual risk-free rate used by Sharpe and Sortino")
    report_dir: str = "reports"


class Config(Section):
    """A whole run."""

    name: str = "run"
    seed: int = 0
    output_dir: str = "runs"
    data: DataConfig = DataConfig()
    env: EnvConfig = EnvConfig()
    rewards: RewardsConfig = RewardsConfig()
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    backtest: BacktestConfig = BacktestConfig()

    def to_yaml(self) -> str:
        """The fully resolved config as YAML (what `show-config` prints and each run stores)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def save(self, directory: Path) -> Path:
        """Write `config.yaml` into `directory` (created if needed) and return its path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "config.yaml"
        path.write_text(self.to_yaml())
        return path


# --------------------------------------------------------------------------- loading


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
            raise ConfigError(f"bad --set '{item}': expected section.key=value, e.g. env.fee_bps=5")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"bad --set '{item}': '{part}' is set both as a value and as a section")
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


def load_config(name_or_path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load and validate a config (defaults when no file is given), applying `--set` overrides."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if name_or_path is not None:
        path = resolve_config_path(name_or_path)
        source = str(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "invalid YAML"
            raise ConfigError(f"{source}:{where}: {problem}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        raw = loaded
    if overrides:
        raw = deep_merge(raw, parse_overrides(overrides))
        source += " with --set overrides"
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
        return f"unknown key '{dotted}'" + (f" (did you mean '{hint}'?)" if hint else "")
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" (got {given!r})"
    more = f"; {len(exc.errors()) - 1} more problem(s)" if len(exc.errors()) > 1 else ""
    return f"{dotted or 'config'}: {error['msg']}{shown}{more}"


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


def resolve_path(path: str | Path) -> Path:
    """A data path from a config: absolute as is, else relative to the working directory or the project root."""
    given = Path(path).expanduser()
    if given.is_absolute() or given.exists():
        return given
    in_project = PROJECT_ROOT / given
    return in_project if in_project.exists() else given
