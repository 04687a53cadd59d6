"""The trading environment: market replay, portfolio, tools, turn parsing, prompts and rewards."""

from r1trade.env.market import MarketReplay
from r1trade.env.parsing import ParseError, ToolCall, parse_tool_call
from r1trade.env.portfolio import Fill, Portfolio
from r1trade.env.trading_env import TradingEnv, load_replay, make_envs

__all__ = [
    "Fill",
    "MarketReplay",
    "ParseError",
    "Portfolio",
    "ToolCall",
    "TradingEnv",
    "load_replay",
    "make_envs",
    "parse_tool_call",
]
