"""`TradingToolEnv`: r1trade's TradingEnv as an environment for TRL's `GRPOTrainer(environment_factory=...)`.

TRL (1.16) makes every public method of the class a tool, with a JSON schema built from its type hints and its
Google-style docstring. Before a rollout it calls `reset(**row)` with the rollout's dataset row and appends the text
`reset` returns to the prompt's last user message; it runs the tools the model calls and shows what they return as
tool messages; once the rollout ends it asks `get_reward()` for the rollout's reward.

Every tool call goes to the real `TradingEnv` as the turn `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
with the arguments exactly as the model gave them: r1trade's parser checks them as it checks a native turn, and
fills, fees and every reward component are the env's own. A tool's result is the env's answer, followed by the next
observation once a decision ends (TRL has no user turn between two tool calls).

Dataset rows (`window_rows`) hold a start bar and a seed. TRL repeats a row once for each member of a group, so a
group trades the same window with the same slippage draws, as a native group does.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from r1trade.config import Config
from r1trade.env.parsing import CLOSE_TAG, OPEN_TAG
from r1trade.env.tools import View
from r1trade.env.trading_env import Message, TradingEnv, load_replay
from r1trade.errors import ConfigError

Side = Literal["long", "short"]
NOT_TOOLS = ("reset", "get_reward")
"""The public methods TRL does not offer the model as tools."""


@dataclass
class Episode:
    """What one rollout did in the env: each turn's text, reward and step info, in order."""

    start: int
    seed: int
    turns: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    played_out: int = 0
    """Turns the env played after the rollout ended early, each as a turn without a tool call."""
    done: bool = False

    @property
    def reward(self) -> float:
        """The episode's reward: the sum of the env's weighted reward components over all its turns."""
        return sum(reward for _, reward, _ in self.turns)


def _env_tool(stub: Callable[..., str]) -> Callable[..., str]:
    """The tool that `stub` declares (its name, typed arguments and docstring are the schema TRL shows the model),
    handing whatever arguments the model gave to the env, whose parser checks them as it checks a native turn: a
    missing or unknown argument is the env's format error, not a Python one that TRL would answer itself."""

    @functools.wraps(stub)
    def call(self: TradingToolEnv, **arguments: Any) -> str:
        return self._call(stub.__name__, arguments)

    return call


class TradingToolEnv:
    """One `TradingEnv` episode at a time, played through TRL's tool calls (see the module docstring).

    `config`: the run's config (its data, env and rewards sections); `split`: the data split of the windows;
    `on_episode`: called once with each finished episode (e.g. to log training metrics). The tools match the env's
    own tool set; under `env.observation: price_only` that set has `get_changes`: use `PriceOnlyTradingToolEnv`
    (`environment_factory` picks the class).
    """

    def __init__(
        self, config: Config, *, split: str = "train", on_episode: Callable[[Episode], None] | None = None
    ) -> None:
        self._env = TradingEnv(load_replay(config, split), config.env, config.rewards)
        declared, offered = sorted(tool_names(type(self))), sorted(self._env.registry.names)
        if declared != offered:
            raise ConfigError(
                f"{type(self).__name__} declares the tools {', '.join(declared)}, but this env config offers "
                f"{', '.join(offered)}: build it with r1trade.integrations.trl.environment_factory(config)"
            )
        self._on_episode = on_episode
        self._episode: Episode | None = None
        self._reported = False

    @property
    def env(self) -> TradingEnv:
        """The wrapped environment (its state: portfolio, fills, equity curve)."""
        return self._env

    @property
    def episode(self) -> Episode:
        """The current episode's turns so far."""
        if self._episode is None:
            raise RuntimeError("call reset() first")
        return self._episode

    def reset(self, *, start: int, seed: int, **row: Any) -> str:
        """Start an episode on the row's window: flat at bar `start`, slippage drawn from `seed`. Returns the first
        observation, which TRL appends to the prompt's user message (the row's prompt holds the system prompt)."""
        messages, _ = self._env.reset(seed=seed, options={"start": start})
        self._episode = Episode(start=start, seed=seed)
        self._reported = False
        return messages[-1]["content"]

    def get_reward(self) -> float:
        """The episode's reward under the run's `rewards:` config: the sum of the env's weighted components.

        A rollout can end before its episode does: the model answered without a tool call, or its completion ran out
        of tokens. The env then plays each remaining turn as a turn without a call, as it would score such turns
        natively (a format penalty each, a penalised forced hold once a decision's calls run out, the market moving
        with the position held), so stopping early is never cheaper than trading on.
        """
        episode = self.episode
        while not episode.done:
            self._step("")
            episode.played_out += 1
        if not self._reported and self._on_episode is not None:
            self._on_episode(episode)
        self._reported = True
        return episode.reward

    # ------------------------------------------------------------------------------------ the tools

    @_env_tool
    def get_candles(self, n: int) -> str:
        """Last n bars: time, open, high, low, close, volume.

        Args:
            n: number of bars, at least 1 and at most the env's max_candles
        """

    @_env_tool
    def get_indicators(self, names: list[str] | None = None) -> str:
        """Indicator values at the current bar.

        Args:
            names: indicator names, as the system prompt lists them; all when omitted
        """

    @_env_tool
    def get_sentiment(self) -> str:
        """Fear/greed index 0-100 and its source."""

    @_env_tool
    def get_portfolio(self) -> str:
        """Cash, position, entry, PnL, stops, equity."""

    @_env_tool
    def place_order(
        self, side: Side, size: float, view: View, stop_loss: float | None = None, take_profit: float | None = None
    ) -> str:
        """Hold size of equity long or short from the next open; sets stop/take. Ends the decision.

        Args:
            side: direction
            size: fraction of equity to hold, above 0 and at most the limit the system prompt states
            view: your market view for the next bars
            stop_loss: % from entry, above 0 and at most 50
            take_profit: % from entry, above 0 and at most 100
        """

    @_env_tool
    def close_position(self, view: View) -> str:
        """Go flat at the next open. Ends the decision.

        Args:
            view: your market view for the next bars
        """

    @_env_tool
    def hold(self, view: View) -> str:
        """Keep the position. Ends the decision.

        Args:
            view: your market view for the next bars
        """

    # ------------------------------------------------------------------------------------ the env

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.episode.done:  # TRL keeps running tools while the model calls them
            return "Error: the episode is over."
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return self._step(f"{OPEN_TAG}{call}{CLOSE_TAG}")

    def _step(self, text: str) -> str:
        """One env turn; returns the text of the messages the env answered it with."""
        episode = self.episode
        messages, reward, terminated, truncated, info = self._env.step(text)
        episode.turns.append((text, reward, info))
        episode.done = terminated or truncated
        return "\n\n".join(message["content"] for message in _after_last_turn(messages))


class PriceOnlyTradingToolEnv(TradingToolEnv):
    """`TradingToolEnv` for `env.observation: price_only`, where the recent changes sit behind a tool."""

    @_env_tool
    def get_changes(self) -> str:
        """Price change in % over the last 1 bar, decision interval and 6 intervals."""


def _after_last_turn(messages: list[Message]) -> list[Message]:
    """The env's answer to a turn: all it returned, or after a context reset (a whole new context) what follows
    the last assistant turn."""
    last = max((i for i, message in enumerate(messages) if message["role"] == "assistant"), default=-1)
    return messages[last + 1 :]


def tool_names(cls: type) -> list[str]:
    """The tools TRL takes from an environment class: its public functions other than `reset` and `get_reward`."""
    return [
        name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in NOT_TOOLS
    ]


def environment_factory(
    config: Config, *, split: str = "train", on_episode: Callable[[Episode], None] | None = None
) -> Callable[[], TradingToolEnv]:
    """What `GRPOTrainer(environment_factory=...)` takes: a maker of envs whose tools match `config`'s env."""
    cls = PriceOnlyTradingToolEnv if config.env.observation == "price_only" else TradingToolEnv
    return functools.partial(cls, config, split=split, on_episode=on_episode)


def tool_schemas(config: Config) -> list[dict[str, Any]]:
    """The JSON schemas of the tools TRL offers the model in `config`'s env, in TRL's order: what its chat template
    renders in the system turn (`r1trade.models.baked_tools`)."""
    from transformers.utils import get_json_schema

    env = environment_factory(config)()
    return [get_json_schema(getattr(env, name)) for name in tool_names(type(env))]


def window_seed(seed: int, index: int) -> int:
    """The seed of the `index`-th training window of a run seeded `seed`."""
    return (seed * 1_000_003 + index) % (2**31 - 1)


def window_rows(config: Config, count: int, *, split: str = "train", first: int = 0) -> list[dict[str, Any]]:
    """`count` dataset rows from the run's `first`-th training window on, each one window: the prompt (the system
    prompt, and an empty user turn that `reset` fills with the first observation), a start bar drawn as the env
    draws one, and the seed of the window. A window depends on its index alone, so a resumed run's rows (`first`
    after the windows it played) are the ones a run that never stopped plays next."""
    env = TradingEnv(load_replay(config, split), config.env, config.rewards)
    prompt = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": ""}]
    rows = []
    for index in range(first, first + count):
        seed = window_seed(config.seed, index)
        _, info = env.reset(seed=seed)
        rows.append({"prompt": prompt, "start": info["start_bar"], "seed": seed})
    return rows
