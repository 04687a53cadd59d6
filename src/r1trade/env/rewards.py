"""Reward components as pure, typed functions; the env logs each one separately and sums them with weights.

Each function returns a raw value; `weigh` multiplies by the `rewards:` config weights (`component_weights`).
Outcome components (pnl, sharpe, terminal, bankruptcy) and the risk penalties on them (variance, drawdown) are
in log-return units and the outcome dominates by default; under the volatility-target mandate (`env.mandate`)
the `mandate` component, how far each decision's volatility missed the target, is the outcome instead;
process components (valid_call, format, tool_error, forced_hold, pattern, risk_*) are small nudges, because a
process reward that grows stronger than PnL can raise accuracy while lowering returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from r1trade.config import RewardsConfig

COMPONENTS: dict[str, str] = {
    "pnl": "pnl",
    "sharpe": "sharpe",
    "variance": "variance",
    "drawdown": "drawdown",
    "terminal": "terminal",
    "bankruptcy": "bankruptcy_penalty",
    "valid_call": "valid_call",
    "format": "format_penalty",
    "tool_error": "tool_error",
    "forced_hold": "forced_hold",
    "info_call": "info_call",
    "pattern": "pattern",
    "risk_no_stop": "risk_no_stop",
    "risk_oversize": "risk_oversize",
    "risk_turnover": "risk_turnover",
    "mandate": "mandate",
}
"""Component name → the `RewardsConfig` field holding its weight."""

MIN_EQUITY_RATIO = 0.01
"""Equity ratios are floored here before the log, so a wipe-out scores log(0.01) ≈ −4.6 rather than −inf."""


def zero_components() -> dict[str, float]:
    """Every component at 0.0 (the raw values of a turn before anything applies)."""
    return dict.fromkeys(COMPONENTS, 0.0)


def component_weights(config: RewardsConfig) -> dict[str, float]:
    """The weight of every component, read from the `rewards:` config section.

    >>> component_weights(RewardsConfig())["format"]
    -0.2
    """
    return {name: getattr(config, field) for name, field in COMPONENTS.items()}


def weigh(raw: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted value of every component (0 for components absent from `raw`).

    >>> weigh({"pnl": 0.01, "format": 1.0}, component_weights(RewardsConfig()))["pnl"]
    1.0
    """
    return {name: weight * raw.get(name, 0.0) for name, weight in weights.items()}


def log_return(*, equity_before: float, equity_after: float) -> float:
    """log(after / before), with the ratio floored at MIN_EQUITY_RATIO (equity can reach zero or below).

    >>> round(log_return(equity_before=100.0, equity_after=110.0), 6)
    0.09531
    >>> round(log_return(equity_before=100.0, equity_after=-5.0), 4)
    -4.6052
    """
    return math.log(max(equity_after / equity_before, MIN_EQUITY_RATIO))


def differential_sharpe(ret: float, *, mean: float, mean_sq: float, eta: float) -> tuple[float, float, float]:
    """Moody & Saffell's differential Sharpe ratio of one return; returns (D, new mean, new mean of squares).

    D = (B ΔA − ½ A ΔB) / (B − A²)^1.5 with A, B exponential moving averages of r and r²; 0 until the
    variance estimate is positive.

    >>> differential_sharpe(0.01, mean=0.0, mean_sq=0.0, eta=0.1)[0]
    0.0
    >>> round(differential_sharpe(0.02, mean=0.0, mean_sq=1e-4, eta=0.1)[0], 6)
    2.0
    """
    delta_mean, delta_sq = ret - mean, ret * ret - mean_sq
    variance = mean_sq - mean * mean
    d = (mean_sq * delta_mean - 0.5 * mean * delta_sq) / variance**1.5 if variance > 1e-12 else 0.0
    return d, mean + eta * delta_mean, mean_sq + eta * delta_sq


def squared_return(log_ret: float) -> float:
    """The variance penalty's raw value: a decision's squared log-return.

    Summed over decisions it is their second moment, the variance for returns near zero; with the pnl term it
    pays mean-variance utility, which is highest for a position scaled down as volatility rises.

    >>> round(squared_return(-0.02), 10)
    0.0004
    """
    return log_ret * log_ret


def drawdown_step(marks: Sequence[float], *, peak: float, deepest: float) -> tuple[float, float, float]:
    """How far a decision's equity marks deepen the episode's maximum drawdown; returns (increase, new peak,
    new deepest).

    The drawdown at a mark is log(peak / equity), peak being the highest equity so far (the ratio floored at
    MIN_EQUITY_RATIO, as equity can reach zero); `deepest` is the largest drawdown so far. The increases of an
    episode add up to its maximum drawdown, each charged to the decision that made it.

    >>> [round(v, 6) for v in drawdown_step([110.0, 99.0, 104.5], peak=100.0, deepest=0.0)]
    [0.105361, 110.0, 0.105361]
    >>> drawdown_step([105.0], peak=110.0, deepest=0.105361)[0]
    0.0
    """
    start = deepest
    for equity in marks:
        peak = max(peak, equity)
        deepest = max(deepest, -math.log(max(equity / peak, MIN_EQUITY_RATIO)))
    return deepest - start, peak, deepest


def terminal_return(
    *, initial_equity: float, final_equity: float, start_price: float, end_price: float, vs_buy_and_hold: bool
) -> float:
    """Episode log-return, minus buy-and-hold's log price change over the same bars when asked.

    >>> round(terminal_return(initial_equity=100, final_equity=110, start_price=10, end_price=11,
    ...                       vs_buy_and_hold=True), 9)
    0.0
    """
    outcome = log_return(equity_before=initial_equity, equity_after=final_equity)
    return outcome - math.log(end_price / start_price) if vs_buy_and_hold else outcome


def pattern_score(view: str, forward_return: float | None, *, threshold: float) -> float:
    """+1 if the stated view matched the realized forward return, −1 if not, 0 when it cannot be known.

    bullish is right above +threshold, bearish below −threshold, neutral within ±threshold.

    >>> pattern_score("bullish", 0.01, threshold=0.002), pattern_score("neutral", 0.01, threshold=0.002)
    (1.0, -1.0)
    >>> pattern_score("bearish", None, threshold=0.002)
    0.0
    """
    if forward_return is None:
        return 0.0
    right = {
        "bullish": forward_return > threshold,
        "bearish": forward_return < -threshold,
        "neutral": abs(forward_return) <= threshold,
    }[view]
    return 1.0 if right else -1.0


def opened_without_stop(*, old_target: float, new_target: float, stop_loss_pct: float | None) -> float:
    """1 when an order opens, flips or enlarges a position without a stop-loss, else 0.

    >>> opened_without_stop(old_target=0.0, new_target=0.5, stop_loss_pct=None)
    1.0
    >>> opened_without_stop(old_target=0.5, new_target=0.25, stop_loss_pct=None)
    0.0
    """
    grows = abs(new_target) > abs(old_target) or new_target * old_target < 0
    return 1.0 if grows and stop_loss_pct is None else 0.0


def oversized(*, requested_size: float, limit: float) -> float:
    """1 when the order asked for more than the position limit (it was clipped), else 0.

    >>> oversized(requested_size=1.5, limit=1.0), oversized(requested_size=1.0, limit=1.0)
    (1.0, 0.0)
    """
    return 1.0 if requested_size > limit else 0.0


def turnover_violation(*, recent_notional: Sequence[float], equity: float, limit: float) -> float:
    """1 when this decision traded and the traded notional over the recent window exceeds limit × equity.

    `recent_notional` holds one entry per decision, this one last.

    >>> turnover_violation(recent_notional=[20_000.0, 15_000.0], equity=10_000.0, limit=3.0)
    1.0
    >>> turnover_violation(recent_notional=[20_000.0, 0.0], equity=10_000.0, limit=1.0)
    0.0
    """
    traded_now = bool(recent_notional) and recent_notional[-1] > 0
    if not traded_now:
        return 0.0
    return 1.0 if equity <= 0 or sum(recent_notional) > limit * equity else 0.0


def vol_target_miss(*, exposure: float, realised_vol: float, target_vol: float) -> float:
    """The volatility mandate's raw penalty of one decision:
    ((exposure × realised_vol − target_vol) / target_vol)².

    `exposure` is the long size held over the decision's interval (fraction of equity), `realised_vol` the
    market's annualised volatility over the bars of that interval (known only after them: a reward, never an
    observation), `target_vol` the annualised target. Cash misses by exactly 1, whatever the market does. A
    constant size w pays the spread of the market's volatility around σ*/w; a size that follows a forecast σ̂,
    w = σ*/σ̂, pays only the forecast's error, so in a market whose volatility clusters it beats every
    constant.

    >>> vol_target_miss(exposure=0.0, realised_vol=0.9, target_vol=0.4)
    1.0
    >>> vol_target_miss(exposure=0.5, realised_vol=0.8, target_vol=0.4)  # on target
    0.0
    >>> round(vol_target_miss(exposure=0.5, realised_vol=1.2, target_vol=0.4), 6)  # (0.6 − 0.4) / 0.4 = 0.5
    0.25
    """
    return ((exposure * realised_vol - target_vol) / target_vol) ** 2
