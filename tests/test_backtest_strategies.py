import numpy as np
import pandas as pd
import pytest

from r1trade.backtest.engine import run_vectorized
from r1trade.backtest.strategies import (
    STRATEGIES,
    buy_and_hold,
    make_targets,
    random_strategy,
    rsi_mean_reversion,
    sma_crossover,
)


def candles_from_closes(closes: np.ndarray) -> pd.DataFrame:
    index = pd.date_range("2024-01-01", periods=len(closes), freq="1h", tz="UTC", name="timestamp")
    opens = np.r_[closes[0], closes[:-1]]
    return pd.DataFrame(
        {
            "open": opens,
            "high": np.maximum(opens, closes),
            "low": np.minimum(opens, closes),
            "close": closes,
            "volume": 1.0,
        },
        index=index,
    )


def random_walk(n: int, seed: int) -> pd.DataFrame:
    return candles_from_closes(100 * np.exp(np.cumsum(np.random.default_rng(seed).normal(0, 0.02, n))))


def with_garbage_after(data: pd.DataFrame, t: int, seed: int) -> pd.DataFrame:
    """Same bars up to t; every later value replaced by random garbage."""
    altered = data.copy()
    garbage = np.random.default_rng(seed).uniform(1, 1e6, size=(len(data) - t - 1, len(data.columns)))
    altered.iloc[t + 1 :] = garbage
    return altered


ALL_CONFIGS = [(name, {}) for name in STRATEGIES] + [
    (name, {"allow_short": True}) for name, spec in STRATEGIES.items() if "allow_short" in spec.defaults
]


@pytest.mark.parametrize("name, overrides", ALL_CONFIGS)
def test_no_look_ahead(name: str, overrides: dict) -> None:
    data = random_walk(300, seed=0)
    full = make_targets(name, data, **overrides)
    for t in [0, 19, 49, 50, 120, 298]:
        altered = make_targets(name, with_garbage_after(data, t, seed=t), **overrides)
        truncated = make_targets(name, data.iloc[: t + 1], **overrides)
        pd.testing.assert_series_equal(altered.iloc[: t + 1], full.iloc[: t + 1])
        pd.testing.assert_series_equal(truncated, full.iloc[: t + 1])


@pytest.mark.parametrize("name, overrides", ALL_CONFIGS)
def test_targets_are_valid_for_the_engine(name: str, overrides: dict) -> None:
    data = random_walk(300, seed=1)
    target = make_targets(name, data, **overrides)
    assert target.index.equals(data.index) and target.notna().all()
    assert target.between(-1 if overrides.get("allow_short") else 0, 1).all()
    result = run_vectorized(data, target, initial_cash=1000, fee_bps=10, slippage_bps=5)
    assert np.isfinite(result.equity).all()


def test_buy_and_hold_is_always_long() -> None:
    data = random_walk(5, seed=0)
    assert buy_and_hold(data).tolist() == [1.0] * 5


def test_sma_crossover_follows_the_trend() -> None:
    closes = np.r_[np.full(5, 100.0), np.arange(101.0, 111.0), np.arange(109.0, 99.0, -1.0)]
    data = candles_from_closes(closes)
    long_flat = sma_crossover(data, fast=2, slow=4)
    long_short = sma_crossover(data, fast=2, slow=4, allow_short=True)
    assert (long_flat.iloc[:3] == 0).all()  # warm-up: the slow average needs 4 bars
    assert long_flat.iloc[3] == 0 and long_short.iloc[3] == -1  # flat prices: fast == slow is not "above"
    assert (long_flat.iloc[5:15] == 1).all()  # rising
    assert (long_flat.iloc[17:] == 0).all() and (long_short.iloc[17:] == -1).all()  # falling
    with pytest.raises(ValueError):
        sma_crossover(data, fast=4, slow=4)


def test_rsi_mean_reversion_buys_oversold_and_exits_overbought() -> None:
    closes = np.r_[np.linspace(100, 70, 20), np.linspace(71, 120, 30)]
    data = candles_from_closes(closes)
    long_flat = rsi_mean_reversion(data, window=5, low=30, high=70)
    long_short = rsi_mean_reversion(data, window=5, low=30, high=70, allow_short=True)
    assert (long_flat.iloc[:4] == 0).all()  # warm-up
    assert long_flat.iloc[19] == 1  # falling → oversold
    assert long_flat.iloc[-1] == 0 and long_short.iloc[-1] == -1  # rising → overbought
    first_exit = long_flat.iloc[20:].ne(1).idxmax()
    assert long_flat.loc[first_exit:].eq(0).all()


def test_random_strategy_is_seeded_and_uses_its_levels() -> None:
    data = random_walk(500, seed=0)
    first, again = random_strategy(data, seed=3, p_change=0.1), random_strategy(data, seed=3, p_change=0.1)
    pd.testing.assert_series_equal(first, again)
    assert not first.equals(random_strategy(data, seed=4, p_change=0.1))
    assert set(first.unique()) == {0.0, 1.0}
    assert set(random_strategy(data, seed=3, p_change=0.1, allow_short=True).unique()) == {-1.0, 0.0, 1.0}
    assert (random_strategy(data, seed=3, p_change=0.0) == 0).all()


def test_registry_applies_defaults_and_overrides() -> None:
    data = random_walk(100, seed=2)
    pd.testing.assert_series_equal(make_targets("sma_crossover", data), sma_crossover(data, fast=20, slow=50))
    pd.testing.assert_series_equal(
        make_targets("sma_crossover", data, fast=5), sma_crossover(data, fast=5, slow=50)
    )
    with pytest.raises(KeyError, match="unknown strategy"):
        make_targets("nope", data)
    with pytest.raises(TypeError, match="window"):
        make_targets("sma_crossover", data, window=3)
