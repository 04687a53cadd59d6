"""r1trade: train a small language model with multi-turn RL to trade crypto through tools, then backtest it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("r1trade")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
