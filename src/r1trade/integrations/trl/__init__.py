"""TradingEnv as a TRL environment (`TradingToolEnv`), and `r1trade train` through TRL's GRPOTrainer
(`train.engine: trl`, `r1trade.integrations.trl.engine`)."""

from r1trade.integrations.trl.environment import (
    Episode,
    PriceOnlyTradingToolEnv,
    TradingToolEnv,
    environment_factory,
    tool_schemas,
    window_rows,
)

__all__ = ["Episode", "PriceOnlyTradingToolEnv", "TradingToolEnv", "environment_factory", "tool_schemas", "window_rows"]
