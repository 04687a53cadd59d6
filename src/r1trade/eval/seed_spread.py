"""How a recipe fares over its seeds: each figure's mean, sample standard deviation, worst seed and, from
four seeds on, interquartile mean.

Agarwal et al., "Deep RL at the Edge of the Statistical Precipice" (NeurIPS 2021): with a handful of runs the
mean follows one lucky or unlucky seed, the interquartile mean much less; and a recipe works when its worst
seed works, so the worst is shown, not hidden in a range. A figure is better when higher unless it is named
among the lower-is-better ones (a penalty): then its worst seed is its highest.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass

MIN_IQM_SEEDS = 4
"""Below four seeds the middle half is the whole sample or most of it, so no interquartile mean is given."""


@dataclass(frozen=True)
class SeedSpread:
    """One figure over n seeds. sd: with n - 1 in the denominator (None for one seed); worst: the lowest value
    (the highest where lower is better) and the seed that gave it (the first such seed on a tie); iqm: None
    under MIN_IQM_SEEDS seeds."""

    n: int
    mean: float
    sd: float | None
    worst: float
    worst_seed: int
    iqm: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half: floor(n / 4) values dropped from each end of the sorted values (as
    rliable's IQM, `scipy.stats.trim_mean(values, 0.25)`).

    >>> interquartile_mean([1.0, 9.0, 2.0, 3.0, 4.0])  # drops 1 and 9: (2 + 3 + 4) / 3
    3.0
    """
    if not values:
        raise ValueError("no values")
    cut = len(values) // 4
    middle = sorted(values)[cut : len(values) - cut]
    return sum(middle) / len(middle)


def seed_spread(values: Mapping[int, float], *, lower_is_better: bool = False) -> SeedSpread | None:
    """The spread of one figure given per seed (seed → value); None when no seed has a number for it."""
    if not values:
        return None
    numbers = list(values.values())
    n = len(numbers)
    mean = sum(numbers) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in numbers) / (n - 1)) if n > 1 else None
    sign = -1 if lower_is_better else 1
    worst_seed = min(values, key=lambda seed: (sign * values[seed], seed))
    iqm = interquartile_mean(numbers) if n >= MIN_IQM_SEEDS else None
    return SeedSpread(n=n, mean=mean, sd=sd, worst=values[worst_seed], worst_seed=worst_seed, iqm=iqm)


def spread_by_figure(
    per_seed: Mapping[int, Mapping[str, float | None]],
    figures: Sequence[str],
    *,
    lower_is_better: Collection[str] = (),
) -> dict[str, SeedSpread | None]:
    """Each of `figures` over the seeds of `per_seed` (seed → figure → value); a seed whose value is missing,
    None or NaN (a report without that row) is left out of that figure only; `lower_is_better`: the figures
    whose worst seed is their highest."""
    spreads = {}
    for figure in figures:
        values = {
            seed: float(value) for seed, row in per_seed.items()
            if (value := row.get(figure)) is not None and not math.isnan(value)
        }
        spreads[figure] = seed_spread(values, lower_is_better=figure in lower_is_better)
    return spreads
