"""A pull toward both sides at the level of the batch, for a choice that sampling noise alone drifts to one side.

Before a policy reads its information, long and short pay the same in expectation, so each update's sampling noise
moves the side's log-odds at random until one side is almost never sampled, and RL can no longer learn why one
side pays. An entropy bonus at each side token would pull every state's choice toward even odds, the decided ones
too: those of a policy whose side follows what it read. This term ascends instead the entropy H(p̄) of the batch's
share p̄ of long, whose gradient is dH/dp̄ = ln((1 - p̄) / p̄) times each side token's ∂P(long)/∂θ, over the batch.
A policy whose sides follow balanced information has p̄ near 1/2 and feels almost no pull; a drifting one is pulled
back, the harder the further it has drifted. H(p̄) is the marginal half of the mutual information between what the
policy saw and the side it took, I = H(p̄) - E[H(p)]: the term discriminative clustering ascends so that its
classifier cannot put every point in one class (Krause, Perona and Gomes, "Discriminative clustering by
regularized information maximization", NeurIPS 2010).

p̄ is each place's share of long among the side tokens sampled there in the batch, with one of each side added, so
that a batch that went one way only still has a finite pull.
"""

from __future__ import annotations

import math

import torch


def balance_gradient(longs: int, shorts: int) -> float:
    """dH/dp̄ = ln((1 - p̄) / p̄) at p̄ = (longs + 1) / (longs + shorts + 2), that is ln((shorts + 1) / (longs + 1)):
    negative when long leads (the pull lowers P(long)), 0 when the sides are even."""
    return math.log((shorts + 1) / (longs + 1))


def side_pull(input_ids: torch.Tensor, side_choice: torch.Tensor, choice_ids: list[tuple[int, int]]) -> torch.Tensor:
    """(R, T) float32: at each token that names a side (`side_choice` k >= 0), the `balance_gradient` of the tokens
    sampled at place k over the whole batch (`choice_ids[k]`: long's token, then short's); 0 elsewhere."""
    pull = torch.zeros(side_choice.shape, dtype=torch.float32, device=side_choice.device)
    for place, (long_id, short_id) in enumerate(choice_ids):
        at = side_choice == place
        sampled = input_ids[at]
        pull[at] = balance_gradient(int((sampled == long_id).sum()), int((sampled == short_id).sum()))
    return pull
