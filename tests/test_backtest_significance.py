"""The probabilistic and deflated Sharpe ratios and the minimum track record against hand computations (and
the DSR paper's example), and how the DSR moves with trials and evidence."""

import math

import numpy as np
import pytest

from r1trade.backtest.significance import (
    EULER_GAMMA,
    deflated_sharpe,
    expected_max_sharpe,
    min_track_record,
    min_track_record_length,
    probabilistic_sharpe,
    probabilistic_sharpe_ratio,
)


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


def test_probabilistic_sharpe_and_min_track_record_worked_example() -> None:
    # the returns above: SR = 0.5477225575 (SR² = 0.3), skewness 0, kurtosis 1.36, T = 4
    # spread = 1 - 0 × SR + (1.36 - 1) / 4 × 0.3 = 1 + 0.09 × 0.3 = 1.027
    # PSR(0) = Φ(0.5477225575 × sqrt(3) / sqrt(1.027)) = Φ(0.9486832981 / 1.0134100848) = Φ(0.9361297191)
    #        = 0.8253967984
    # PSR(0.2) = Φ(0.3477225575 × 1.7320508076 / 1.0134100848) = Φ(0.5943034765) = 0.7238454231
    # MinTRL(0, 95 %) = 1 + 1.027 × (Φ⁻¹(0.95) / SR)² = 1 + 1.027 × (1.6448536270 / 0.5477225575)²
    #                 = 1 + 1.027 × 9.0184781803 = 10.2619770912 returns
    # MinTRL(0.2, 95 %) = 1 + 1.027 × (1.6448536270 / 0.3477225575)² = 23.9804869363
    returns = np.array([0.02, -0.01, 0.03, 0.00])
    psr = probabilistic_sharpe(returns)
    assert psr.probability == pytest.approx(0.8253967984, rel=1e-9)
    assert (psr.sharpe, psr.kurtosis, psr.observations) == pytest.approx((0.5477225575, 1.36, 4), rel=1e-9)
    assert probabilistic_sharpe(returns, benchmark=0.2).probability == pytest.approx(0.7238454231, rel=1e-9)
    # one return every 4 hourly bars: a period is 4 / 8760 of a 365-day year → 10.2619770912 × 4 / 8760 years
    record = min_track_record(returns, period_years=4 / 8760)
    assert record.periods == pytest.approx(10.2619770912, rel=1e-9)
    assert record.years == pytest.approx(10.2619770912 * 4 / 8760, rel=1e-9)
    assert (record.observed, record.confidence, record.benchmark) == (4, 0.95, 0.0)
    assert min_track_record(returns, period_years=1.0, benchmark=0.2).periods == pytest.approx(
        23.9804869363, rel=1e-9
    )


def test_min_track_record_is_infinite_when_the_sharpe_ratio_does_not_beat_the_benchmark() -> None:
    assert min_track_record_length(0.1, skewness=0.0, kurtosis=3.0, benchmark=0.1) == math.inf
    assert min_track_record_length(-0.2, skewness=0.0, kurtosis=3.0) == math.inf
    # normal returns, SR 0.5 against 0: 1 + (1 + 0.5 × 0.25) × (1.6448536270 / 0.5)² = 1 + 1.125 × 10.8221738164
    #   = 13.1749455434
    assert min_track_record_length(0.5, skewness=0.0, kurtosis=3.0) == pytest.approx(13.1749455434, rel=1e-9)


def test_deflated_sharpe_ratio_of_the_papers_numerical_example() -> None:
    # Bailey & López de Prado (2014), numerical example: an annualised SR of 2.5 found after N = 100 trials on
    # T = 1250 daily returns (5 years of 250 days), the trials' annualised Sharpe ratios of variance 1/2,
    # skewness -3, kurtosis 10. Per day: SR = 2.5 / sqrt(250) = 0.1581138830, V = 0.5 / 250 = 0.002.
    # Φ⁻¹(1 - 1/100) = 2.3263478740; Φ⁻¹(1 - 1/(100 e)) = Φ⁻¹(0.9963212056) = 2.6802104450
    # SR0 = sqrt(0.002) × (0.4227843351 × 2.3263478740 + 0.5772156649 × 2.6802104450)
    #     = 0.0447213595 × 2.5306028932 = 0.1131720019
    # spread = 1 + 3 × 0.1581138830 + (10 - 1) / 4 × 0.025 = 1 + 0.4743416490 + 0.05625 = 1.5305916490
    # z = (0.1581138830 - 0.1131720019) × sqrt(1249) / sqrt(1.5305916490) = 0.0449418811 × 35.3411941 / 1.2371708
    #   = 1.2838160365; DSR = Φ(1.2838160365) = 0.9003968344 (the paper: SR0 ≈ 0.1132, DSR ≈ 0.9004)
    sharpe = 2.5 / math.sqrt(250)
    benchmark = expected_max_sharpe(100, 0.5 / 250)
    assert benchmark == pytest.approx(0.1131720019, rel=1e-8)
    probability = probabilistic_sharpe_ratio(sharpe, observations=1250, skewness=-3.0, kurtosis=10.0,
                                             benchmark=benchmark)
    assert probability == pytest.approx(0.9003968344, rel=1e-8)


def test_deflated_sharpe_takes_the_trials_variance_and_says_where_the_trials_come_from() -> None:
    returns = np.array([0.02, -0.01, 0.03, 0.00])
    # V = 0.25 in place of 1 / 3: SR0 = 0.5 × 1.5745983013 = 0.7872991507
    # z = (0.5477225575 - 0.7872991507) × sqrt(3) / sqrt(1.027) = -0.4094678333; DSR = Φ(z) = 0.3410981841
    result = deflated_sharpe(returns, trials=10, variance=0.25, trials_source="the 10 btc records")
    assert result.expected_max == pytest.approx(0.7872991507, rel=1e-9)
    assert result.probability == pytest.approx(0.3410981841, rel=1e-8)
    assert result.trials_source == "the 10 btc records"
