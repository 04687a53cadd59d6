"""Each reward component: the pure function by hand, then where the env pays it."""

from __future__ import annotations

import doctest
import math

import pytest
from env_fixtures import call, close, flat_then, hold, long, make_env, short

from r1trade.config import RewardsConfig
from r1trade.env import parsing, rewards
from r1trade.env.rewards import COMPONENTS


@pytest.mark.parametrize("module", [rewards, parsing])
def test_docstring_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_every_component_has_a_config_weight_and_outcome_dominates() -> None:
    config = RewardsConfig()
    assert set(rewards.weigh({}, rewards.component_weights(config))) == set(COMPONENTS)
    for field in COMPONENTS.values():
        assert isinstance(getattr(config, field), float)
    # A 1 % move over one decision outweighs every process nudge of that decision together.
    process = ("valid_call", "format", "tool_error", "forced_hold", "pattern", "risk_no_stop",
               "risk_oversize", "risk_turnover")
    assert config.pnl * math.log(1.01) > sum(abs(getattr(config, COMPONENTS[name])) for name in process)


def test_pure_functions_by_hand() -> None:
    assert rewards.log_return(equity_before=100, equity_after=100) == 0
    assert rewards.terminal_return(initial_equity=100, final_equity=121, start_price=10, end_price=11,
                                   vs_buy_and_hold=False) == pytest.approx(math.log(1.21))
    assert rewards.terminal_return(initial_equity=100, final_equity=121, start_price=10, end_price=11,
                                   vs_buy_and_hold=True) == pytest.approx(math.log(1.21) - math.log(1.1))
    # Differential Sharpe: A = 0.01, B = 0.0002 (variance 1e-4), r = 0.03 → ΔA = 0.02, ΔB = 0.0007.
    d, mean, mean_sq = rewards.differential_sharpe(0.03, mean=0.01, mean_sq=0.0002, eta=0.5)
    assert d == pytest.approx((0.0002 * 0.02 - 0.5 * 0.01 * 0.0007) / 1e-4**1.5)
    assert (mean, mean_sq) == (pytest.approx(0.02), pytest.approx(0.00055))
    assert rewards.pattern_score("neutral", 0.001, threshold=0.002) == 1.0
    assert rewards.pattern_score("bearish", -0.003, threshold=0.002) == 1.0
    assert rewards.pattern_score("bearish", -0.001, threshold=0.002) == -1.0
    assert rewards.opened_without_stop(old_target=0.5, new_target=-0.25, stop_loss_pct=None) == 1.0  # a flip
    assert rewards.opened_without_stop(old_target=0.0, new_target=0.5, stop_loss_pct=2.0) == 0.0
    assert rewards.turnover_violation(recent_notional=[], equity=1.0, limit=1.0) == 0.0


RISING = flat_then([101, 102.01, 103.03, 104.06, 105.1, 106.15, 107.21, 108.28])  # +1 % a bar from bar 3


def test_valid_call_is_paid_once_per_decision_and_format_penalty_on_malformed_turns() -> None:
    env = make_env(RISING, episode_decisions=2)
    env.reset(options={"start": 2})
    paid = [env.step(text)[4]["reward_components"]["valid_call"]
            for text in (call("get_portfolio"), call("get_candles", n=2), hold())]
    assert paid == [0.05, 0.0, 0.0]
    _, reward, _, _, info = env.step("<tool_call>{bad}</tool_call>")
    assert info["reward_components"]["format"] == -0.2 and reward == pytest.approx(-0.2)
    assert info["reward_components"]["valid_call"] == 0.0
    assert env.step(call("get_portfolio"))[4]["reward_components"]["valid_call"] == 0.05


@pytest.mark.parametrize(("view", "expected"), [("bullish", 0.05), ("bearish", -0.05), ("neutral", -0.05)])
def test_pattern_compares_the_view_with_the_forward_return(view: str, expected: float) -> None:
    env = make_env(RISING, episode_decisions=1)
    env.reset(options={"start": 3})
    info = env.step(hold(view))[4]
    # The close moves +1 % a bar; over pattern_horizon_bars = 4 that is +4 % > 0.2 %.
    assert info["reward_components"]["pattern"] == pytest.approx(expected)


def test_pattern_is_zero_when_the_horizon_runs_past_the_data() -> None:
    env = make_env(RISING, episode_decisions=1)
    env.reset(options={"start": 8})
    assert env.step(hold("bullish"))[4]["reward_components"]["pattern"] == 0.0


def test_risk_rules() -> None:
    env = make_env(RISING, episode_decisions=5, max_position_frac=0.8)
    env.reset(options={"start": 2})
    parts = env.step(long(0.5))[4]["reward_components"]
    assert (parts["risk_no_stop"], parts["risk_oversize"]) == (-0.02, 0.0)
    parts = env.step(long(0.25))[4]["reward_components"]  # reducing needs no stop
    assert parts["risk_no_stop"] == 0.0
    parts = env.step(long(1.0, stop_loss=5))[4]["reward_components"]
    assert (parts["risk_no_stop"], parts["risk_oversize"]) == (0.0, -0.02)


def test_turnover_limit() -> None:
    rewards_config = RewardsConfig(max_turnover=1.5, turnover_window=2)
    env = make_env(RISING, rewards_config, episode_decisions=4)
    env.reset(options={"start": 2})
    def turnover(text: str) -> float:
        return env.step(text)[4]["reward_components"]["risk_turnover"]

    assert turnover(long(1.0, stop_loss=50)) == 0.0  # 1× equity traded
    assert turnover(short(1.0, stop_loss=50)) == -0.02  # +2× equity: 3× in the window
    assert turnover(hold()) == 0.0  # no trade, no penalty


def test_pnl_terminal_and_sharpe_are_log_returns_of_equity() -> None:
    config = RewardsConfig(sharpe=1.0, sharpe_eta=0.5)
    env = make_env(RISING, config, episode_decisions=3)
    env.reset(options={"start": 2})
    first = env.step(long(1.0, stop_loss=50))[4]
    # Bought 100 units at the open of bar 3 (100), marked at its close 101: equity 10 100.
    assert first["equity"] == pytest.approx(10_100)
    assert first["reward_components"]["pnl"] == pytest.approx(100 * math.log(1.01))
    assert first["reward_components"]["sharpe"] == 0.0  # no variance estimate yet
    assert first["reward_components"]["terminal"] == 0.0
    second = env.step(hold())[4]
    r1, r2 = 0.01, second["equity"] / first["equity"] - 1
    expected_d, _, _ = rewards.differential_sharpe(r2, mean=0.5 * r1, mean_sq=0.5 * r1 * r1, eta=0.5)
    assert second["reward_components"]["sharpe"] == pytest.approx(expected_d)
    last = env.step(close())[4]
    # Long 100 units from the open of bar 3 (100) to the open of bar 5 (102.01), where it closes; buy and hold
    # runs from the close of bar 2 (100) to the close of bar 5 (103.03).
    assert last["equity"] == pytest.approx(10_201)
    assert last["reward_components"]["terminal"] == pytest.approx(50 * (math.log(1.0201) - math.log(1.0303)))
    no_baseline = make_env(RISING, RewardsConfig(terminal_baseline="none"), episode_decisions=1)
    no_baseline.reset(options={"start": 2})
    assert no_baseline.step(hold())[4]["reward_components"]["terminal"] == 0.0  # flat: log(1) = 0
    no_baseline.reset(options={"start": 2, "decisions": 2})
    no_baseline.step(long(1.0, stop_loss=50))
    info = no_baseline.step(hold())[4]
    assert info["reward_components"]["terminal"] == pytest.approx(50 * math.log(102.01 / 100))


def test_tool_error_component() -> None:
    env = make_env(RISING, allow_short=False)
    env.reset(options={"start": 2})
    _, reward, _, _, info = env.step(short(0.5))
    assert info["reward_components"]["tool_error"] == -0.1 and reward == pytest.approx(-0.1)
