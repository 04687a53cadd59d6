"""The side balance's gradient from the batch's sampled sides, worked by hand: its sign, its size, its zero at
even sides, and its value at each token that names a side, per place."""

from __future__ import annotations

import math

import pytest
import torch

from r1trade.rl.side_balance import balance_gradient, side_pull


@pytest.mark.parametrize(("longs", "shorts", "expected"), [
    (3, 3, 0.0),  # even sides: no pull
    (3, 1, math.log(2 / 4)),  # p̄ = 4/6: ln((1 - p̄) / p̄) = ln(1/2) = -0.6931, lowering P(long)
    (1, 3, math.log(4 / 2)),  # the mirror: +0.6931, raising P(long)
    (47, 0, math.log(1 / 48)),  # one side only: p̄ = 48/49, still finite (-3.8712)
    (0, 0, 0.0),  # nothing sampled there
])
def test_the_balance_gradient_by_hand(longs: int, shorts: int, expected: float) -> None:
    assert balance_gradient(longs, shorts) == pytest.approx(expected)


def test_each_side_token_takes_its_place_pull() -> None:
    # place 0 (the Action word) names long with token 7 and short with 8; place 1 (the call) with 5 and 6.
    # Place 0 was sampled long twice and short once over the batch: ln(2 / 3) = -0.4055 at each of its three tokens;
    # place 1 once each way: 0. Token 7 at -1 (not a side token) counts for nothing.
    input_ids = torch.tensor([[7, 5, 7, 3], [8, 6, 7, 9]])
    side_choice = torch.tensor([[0, 1, -1, -1], [0, 1, 0, -1]])
    pull = side_pull(input_ids, side_choice, [(7, 8), (5, 6)])
    ln = math.log(2 / 3)
    torch.testing.assert_close(pull, torch.tensor([[ln, 0.0, 0.0, 0.0], [ln, 0.0, ln, 0.0]]))
