"""Bars per second of an SMA-crossover backtest: r1trade's vectorized engine vs vectorbt vs backtesting.py.

Each timed run does the whole job on synthetic hourly candles: signals (SMA 20/50, long or flat), the
simulation (fills at the next open, 10 bps fee, 5 bps slippage) and the statistics table. vectorbt is warmed
up first so its numba compilation is not timed, and gets a tz-naive index (with pandas 3 it turns a tz-aware
index into Python objects, which costs it seconds). backtesting.py loops over bars in Python; it runs only up
to --bt-max-bars bars. The "engine" columns time the simulation alone, from precomputed targets.

    python benchmarks/backtest_speed.py [--sizes 20000 200000 1000000] [--bt-max-bars 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from collections.abc import Callable

os.environ.setdefault("TQDM_DISABLE", "1")  # backtesting.py's progress bar

import numpy as np
import pandas as pd

from r1trade.backtest import run_vectorized
from r1trade.backtest.strategies import sma_crossover
from r1trade.runtime import cpu_header

FAST, SLOW = 20, 50
FEE_BPS, SLIPPAGE_BPS = 10.0, 5.0
CASH = 1_000_000.0


def synthetic_hourly(n: int, seed: int = 0) -> pd.DataFrame:
    """Geometric random-walk hourly candles in the project's schema."""
    rng = np.random.default_rng(seed)
    close = 30_000 * np.exp(np.cumsum(rng.normal(0, 0.006, n)))
    open_ = np.r_[30_000.0, close[:-1]]
    wick = np.abs(rng.normal(0, 0.002, n))
    index = pd.date_range("2000-01-01", periods=n, freq="1h", tz="UTC", name="timestamp")
    return pd.DataFrame(
        {
            "open": open_,
            "high": np.maximum(open_, close) * (1 + wick),
            "low": np.minimum(open_, close) * (1 - wick),
            "close": close,
            "volume": rng.uniform(1, 100, n),
        },
        index=index,
    )


def ours(candles: pd.DataFrame) -> float:
    """Signals + engine + metrics; returns Return [%]."""
    result = run_vectorized(
        candles,
        sma_crossover(candles, fast=FAST, slow=SLOW),
        initial_cash=CASH,
        fee_bps=FEE_BPS,
        slippage_bps=SLIPPAGE_BPS,
    )
    return result.metrics()["Return [%]"]


def ours_engine(candles: pd.DataFrame, target: pd.Series) -> None:
    """The simulation alone."""
    run_vectorized(candles, target, initial_cash=CASH, fee_bps=FEE_BPS, slippage_bps=SLIPPAGE_BPS)


def vectorbt_orders(candles: pd.DataFrame, target: pd.Series):
    """The same orders in vectorbt: at the open after each target change, valued at the fill price.

    vectorbt caps a buy at the cash on hand, so a 100 % target buys slightly fewer units than ours (which pays
    the entry fee on margin); returns differ by about the fees, the work done is the same.
    """
    import vectorbt as vbt

    values = target.to_numpy()
    previous = np.r_[0.0, values[:-1]]
    decided = np.flatnonzero(values[:-1] != previous[:-1])
    size, side = np.full(len(values), np.nan), np.zeros(len(values))
    size[decided + 1] = values[decided]
    side[decided + 1] = np.sign(values[decided] - previous[decided])
    opens = candles["open"].to_numpy()
    return vbt.Portfolio.from_orders(
        candles["close"],
        size=size,
        size_type="targetpercent",
        direction="both",
        price=opens,
        val_price=np.where(side != 0, opens * (1 + side * SLIPPAGE_BPS / 1e4), np.inf),
        fees=FEE_BPS / 1e4,
        slippage=SLIPPAGE_BPS / 1e4,
        init_cash=CASH,
        freq="1h",
    )


def vectorbt_full(candles: pd.DataFrame) -> float:
    """Signals + vectorbt simulation + its stats table; returns Total Return [%]."""
    portfolio = vectorbt_orders(candles, sma_crossover(candles, fast=FAST, slow=SLOW))
    return float(portfolio.stats()["Total Return [%]"])


def tz_naive(candles: pd.DataFrame) -> pd.DataFrame:
    """The same candles on a tz-naive index (vectorbt's fast path)."""
    return candles.set_axis(candles.index.tz_localize(None))


def backtesting_frame(candles: pd.DataFrame) -> pd.DataFrame:
    """backtesting.py's column names and a tz-naive index."""
    return tz_naive(candles).rename(columns=str.capitalize)


def backtesting_full(data: pd.DataFrame) -> float:
    """backtesting.py's own loop and stats (whole units at ~30k a unit, 1e6 cash: rounding stays small).

    Close, not identical, rules: it sizes a buy with the fee included and applies `spread` once per trade.
    """
    from backtesting import Backtest, Strategy

    class SmaCross(Strategy):
        def init(self) -> None:
            close = pd.Series(self.data.Close)
            self.fast = self.I(lambda: close.rolling(FAST).mean().to_numpy())
            self.slow = self.I(lambda: close.rolling(SLOW).mean().to_numpy())

        def next(self) -> None:
            above = self.fast[-1] > self.slow[-1]
            if above and not self.position:
                self.buy()
            elif not above and self.position:
                self.position.close()

    backtest = Backtest(
        data, SmaCross, cash=CASH, commission=FEE_BPS / 1e4, spread=SLIPPAGE_BPS / 1e4, finalize_trades=True
    )
    return float(backtest.run()["Return [%]"])


def best_seconds(repeats: int, fn: Callable[..., object], *args: object) -> tuple[float, object]:
    """Fastest wall time of fn(*args) over `repeats` calls, and the last call's value."""
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, value


def table_row(n: int, *, repeats: int, bt_max_bars: int) -> str:
    """Timings on n synthetic bars, formatted as one row of the printed table."""
    candles = synthetic_hourly(n, seed=1)
    naive = tz_naive(candles)
    target = sma_crossover(candles, fast=FAST, slow=SLOW)
    naive_target = sma_crossover(naive, fast=FAST, slow=SLOW)
    t_ours, r_ours = best_seconds(repeats, ours, candles)
    t_vbt, r_vbt = best_seconds(repeats, vectorbt_full, naive)
    t_ours_engine, _ = best_seconds(repeats, ours_engine, candles, target)
    t_vbt_engine, _ = best_seconds(repeats, vectorbt_orders, naive, naive_target)
    bt_rate, bt_ratio, bt_return = f"{'skipped':>12}", f"{'-':>8}", "-"
    if n <= bt_max_bars:
        t_bt, r_bt = best_seconds(1, backtesting_full, backtesting_frame(candles))
        bt_rate, bt_ratio, bt_return = f"{n / t_bt:12,.0f}", f"{t_bt / t_ours:8.0f}", f"{r_bt:.6g}"
    return (
        f"{n:>9,} | {n / t_ours:12,.0f} | {n / t_vbt:12,.0f} | {bt_rate} | {t_vbt / t_ours:8.2f} | "
        f"{bt_ratio} | {n / t_ours_engine:12,.0f} | {n / t_vbt_engine:12,.0f} | "
        f"{r_ours:.6g}, {r_vbt:.6g}, {bt_return}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    parser.add_argument("--bt-max-bars", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    warm = synthetic_hourly(2_000)
    vectorbt_full(tz_naive(warm))
    backtesting_full(backtesting_frame(warm))
    ours(warm)

    print(cpu_header())
    print(f"Python {platform.python_version()}, numpy {np.__version__}, pandas {pd.__version__}")
    header = (
        f"{'bars':>9} | {'ours':>12} | {'vectorbt':>12} | {'backtesting':>12} | {'ours/vbt':>8} | "
        f"{'ours/bt':>8} | {'engine ours':>12} | {'engine vbt':>12} | returns % (ours, vbt, bt)"
    )
    print(header + "\n" + "-" * len(header))
    for n in args.sizes:
        print(table_row(n, repeats=args.repeats, bt_max_bars=args.bt_max_bars), flush=True)
    print("bars/second, best of --repeats (backtesting.py: one run); ratios = how many times faster ours is")


if __name__ == "__main__":
    main()
