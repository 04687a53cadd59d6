"""The probability of backtest overfitting (CSCV) against a split-by-split hand computation, and its defined
behaviour on identical and dominating trials."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from r1trade.backtest.overfitting import backtest_overfitting

# three trials (columns A, B, C) over four periods, one per block (S = 4, T = 4)
TINY = np.array([
    [0.0, -3.0, -1.0],
    [-1.0, -2.0, 3.0],
    [4.0, 2.0, -2.0],
    [1.0, 0.0, 2.0],
])


def test_pbo_of_a_tiny_matrix_worked_split_by_split() -> None:
    # A = (0, -1, 4, 1), B = (-3, -2, 2, 0), C = (-1, 3, -2, 2) over blocks 1-4. A half holds two returns
    # x, y: Sharpe = ((x + y) / 2) / (|x - y| / sqrt 2) = (x + y) / (sqrt 2 |x - y|), so halves rank by
    # k = (x + y) / |x - y|. N = 3: ω = rank / 4, λ = ln(ω / (1 - ω)): rank 1 → ln(1/3) = -1.0986,
    # rank 2 → 0, rank 3 → ln 3 = 1.0986.
    # in-sample {1,2}: A (0,-1) k -1, B (-3,-2) k -5, C (-1,3) k 0.5 → C; out {3,4}: A (4,1) 5/3,
    #   B (2,0) 1, C (-2,2) 0 → C ranks 1 → λ = -1.0986
    # in {1,3}: A (0,4) 1, B (-3,2) -0.2, C (-1,-2) -3 → A; out {2,4}: A (-1,1) 0, B (-2,0) -1, C (3,2) 5
    #   → A ranks 2 → λ = 0
    # in {1,4}: A (0,1) 1, B (-3,0) -1, C (-1,2) 1/3 → A; out {2,3}: A (-1,4) 0.6, B (-2,2) 0, C (3,-2) 0.2
    #   → A ranks 3 → λ = 1.0986
    # in {2,3}: A 0.6, B 0, C 0.2 → A; out {1,4}: A 1, B -1, C 1/3 → A ranks 3 → λ = 1.0986
    # in {2,4}: A 0, B -1, C 5 → C; out {1,3}: A 1, B -0.2, C -3 → C ranks 1 → λ = -1.0986
    # in {3,4}: A 5/3, B 1, C 0 → A; out {1,2}: A -1, B -5, C 0.5 → A ranks 2 → λ = 0
    # λ ≤ 0 in 4 of the 6 splits: PBO = 4/6
    result = backtest_overfitting(TINY, blocks=4)
    third = math.log(3)
    assert result.logits == pytest.approx([-third, 0.0, third, third, -third, 0.0], abs=1e-12)
    assert result.probability == pytest.approx(4 / 6)
    assert (result.blocks, result.trials, result.periods) == (4, 3, 4)


def test_two_trials_and_ties_share_their_average_rank() -> None:
    # A = (1, 3, 2, 5), B = (2, 4, 1, 3). N = 2: rank 1 → ω 1/3 → λ ln(1/2) = -0.6931; rank 2 → λ ln 2;
    # a tie out of sample → rank 1.5 → ω 1/2 → λ 0.
    # in {1,2}: A (1,3) k 2, B (2,4) 3 → B; out {3,4}: A (2,5) 7/3, B (1,3) 2 → B ranks 1 → λ -0.6931
    # in {1,3}: A (1,2) 3, B (2,1) 3: tied, the first (A); out {2,4}: A (3,5) 4, B (4,3) 7 → A ranks 1
    # in {1,4}: A (1,5) 1.5, B (2,3) 5 → B; out {2,3}: A (3,2) 5, B (4,1) 5/3 → B ranks 1
    # in {2,3}: A (3,2) 5, B (4,1) 5/3 → A; out {1,4}: A 1.5, B 5 → A ranks 1
    # in {2,4}: A (3,5) 4, B (4,3) 7 → B; out {1,3}: A 3, B 3: tied → B's rank 1.5 → λ = 0
    # in {3,4}: A (2,5) 7/3, B (1,3) 2 → A; out {1,2}: A 2, B 3 → A ranks 1
    # every λ ≤ 0: PBO = 1
    returns = np.array([[1.0, 2.0], [3.0, 4.0], [2.0, 1.0], [5.0, 3.0]])
    result = backtest_overfitting(returns, blocks=4)
    half = math.log(0.5)
    assert result.logits == pytest.approx([half, half, half, half, 0.0, half], abs=1e-12)
    assert result.probability == 1.0


def test_the_first_t_mod_s_periods_are_dropped() -> None:
    # a fifth period in front, whatever it holds, is left out: 5 periods in 4 blocks of 1
    padded = np.vstack([[100.0, -100.0, 7.0], TINY])
    result = backtest_overfitting(padded, blocks=4)
    assert result.periods == 4
    assert result.logits == pytest.approx(backtest_overfitting(TINY, blocks=4).logits, abs=1e-12)


def test_the_paper_default_of_16_blocks_makes_12870_splits() -> None:
    returns = np.random.default_rng(0).normal(0.0, 0.01, (160, 5))
    result = backtest_overfitting(returns)
    assert (result.blocks, len(result.logits)) == (16, math.comb(16, 8)) == (16, 12_870)
    assert 0.0 <= result.probability <= 1.0


@pytest.mark.parametrize(
    ("shape", "blocks", "message"),
    [((8, 1), 4, "at least 2 trials"), ((8, 2), 3, "even number"), ((8, 2), 0, "even number"),
     ((3, 2), 4, "fewer than 2 periods a half")],
)
def test_shapes_that_cannot_be_split(shape: tuple[int, int], blocks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backtest_overfitting(np.ones(shape), blocks=blocks)


def test_non_finite_returns_are_refused() -> None:
    returns = np.ones((8, 2))
    returns[3, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        backtest_overfitting(returns, blocks=4)


@settings(max_examples=40, deadline=None)
@given(
    noise=arrays(np.float64, 16, elements=st.floats(-1.0, 1.0, allow_nan=False)),
    trials=st.integers(2, 5),
)
def test_identical_trials_sit_on_the_median_so_pbo_is_1(noise: np.ndarray, trials: int) -> None:
    result = backtest_overfitting(np.repeat(noise[:, None], trials, axis=1), blocks=4)
    assert np.all(result.logits == 0.0)
    assert result.probability == 1.0


@settings(max_examples=40, deadline=None)
@given(
    noise=arrays(np.float64, 16, elements=st.floats(-1.0, 1.0, allow_nan=False)),
    shifts=st.lists(st.integers(-5, 5), min_size=2, max_size=5, unique=True),
)
def test_a_trial_that_dominates_every_block_is_never_overfit(noise: np.ndarray, shifts: list[int]) -> None:
    # every trial is the same noise plus its own constant: in any half the Sharpe ratios order as the shifts,
    # so the in-sample best is the largest shift and it is also best out of sample (ω = N / (N + 1), λ > 0)
    blocks = noise.reshape(4, 4)
    assume(all(np.ptp(block) > 1e-3 for block in blocks))  # the noise varies within every block
    returns = noise[:, None] + 0.1 * np.array(shifts, dtype=float)[None, :]
    result = backtest_overfitting(returns, blocks=4)
    assert result.probability == 0.0
    assert result.logits == pytest.approx(math.log(len(shifts)))
