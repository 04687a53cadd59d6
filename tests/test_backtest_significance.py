"""The deflated Sharpe ratio against a hand computation, and how it moves with trials and evidence."""

import math

import numpy as np
import pytest

from r1trade.backtest.significance import EULER_GAMMA, deflated_sharpe, expected_max_sharpe


def test_deflated_sharpe_worked_example() -> None:
    # returns 0.02, -0.01, 0.03, 0.00 (T = 4), the best of N = 10 trials
    # mean 0.01; deviations 0.01, -0.02, 0.02, -0.01
    # std(ddof=1) = sqrt((1 + 4 + 4 + 1)e-4 / 3) = 0.0182574186
    #   → SR = 0.01 / 0.0182574186 = 0.5477225575 (SR² = 0.3)
    # population moments: m2 = 10e-4 / 4 = 2.5e-4, m3 = (1 - 8 + 8 - 1)e-6 / 4 = 0 → skewness 0,
    #   m4 = (1 + 16 + 16 + 1)e-8 / 4 = 8.5e-8 → kurtosis = 8.5e-8 / 6.25e-8 = 1.36
    # V = 1 / (T - 1) = 1/3; Φ⁻¹(1 - 1/10) = Φ⁻¹(0.9) = 1.2815515655; Φ⁻¹(1 - 1/(10 e)) = Φ⁻¹(0.9632120559)
    #   = 1.7892417646; γ = 0.5772156649
    # SR0 = sqrt(1/3) × (0.4227843351 × 1.2815515655 + 0.5772156649 × 1.7892417646)
    #     = 0.5773502692 × 1.5745983013 = 0.9090947531
    # z = (0.5477225575 - 0.9090947531) × sqrt(3) / sqrt(1 - 0 × SR + (1.36 - 1) / 4 × 0.3)
    #   = -0.3613721956 × 1.7320508076 / sqrt(1.027) = -0.6176324991
    # DSR = Φ(-0.6176324991) = 0.2684088083
    result = deflated_sharpe(np.array([0.02, -0.01, 0.03, 0.00]), trials=10)
    assert result.sharpe == pytest.approx(0.5477225575, rel=1e-9)
    assert result.skewness == pytest.approx(0.0, abs=1e-12)
    assert result.kurtosis == pytest.approx(1.36, rel=1e-12)
    assert result.expected_max == pytest.approx(0.9090947531, rel=1e-9)
    assert result.probability == pytest.approx(0.2684088083, rel=1e-8)
    assert (result.trials, result.observations) == (10, 4)


def test_expected_max_sharpe_formula() -> None:
    # with unit variance: (1 - γ) Φ⁻¹(1 - 1/N) + γ Φ⁻¹(1 - 1/(N e)); for N = 2: Φ⁻¹(0.5) = 0 and
    # Φ⁻¹(1 - 1/(2e)) = Φ⁻¹(0.8160602794) = 0.9004525966 → 0.5772156649 × 0.9004525966 = 0.5197553443
    assert expected_max_sharpe(2, 1.0) == pytest.approx(0.5197553443, rel=1e-9)
    assert expected_max_sharpe(2, 1.0) == pytest.approx(EULER_GAMMA * 0.9004525966, rel=1e-9)
    assert expected_max_sharpe(10, 4.0) == pytest.approx(2 * 1.5745983013, rel=1e-9)
    with pytest.raises(ValueError, match="at least 2 trials"):
        expected_max_sharpe(1, 1.0)


def test_more_trials_deflate_more_and_more_evidence_deflates_less() -> None:
    rng = np.random.default_rng(0)
    returns = rng.normal(0.002, 0.01, 500)  # per-period Sharpe about 0.2
    by_trials = [deflated_sharpe(returns, trials=n).probability for n in (2, 10, 100, 1000)]
    assert by_trials == sorted(by_trials, reverse=True)
    assert deflated_sharpe(returns[:50], trials=10).probability < by_trials[1]


def test_undefined_without_spread_or_enough_returns() -> None:
    assert math.isnan(deflated_sharpe(np.full(10, 0.01), trials=5).probability)
    assert math.isnan(deflated_sharpe(np.array([0.01, 0.02]), trials=5).probability)
