"""Does any strategy of a report beat a benchmark once every strategy compared is counted? Hansen's test of
superior predictive ability (SPA, Hansen 2005) and the Romano–Wolf stepwise test (StepM, Romano & Wolf 2005),
both from the `arch` package (`arch.bootstrap.SPA`, `arch.bootstrap.StepM`).

The loss of a strategy at a decision is minus its return over that decision's bars (`superiority_test`), or on
a mandate the decision's miss of it (`superiority_on_losses`, `r1trade.backtest.mandate`). SPA tests the null
hypothesis that no strategy has a lower expected loss than the benchmark; its p-value accounts for the best of
the k strategies having been picked after the fact. StepM names the strategies whose expected loss is below
the benchmark's, controlling the family-wise error rate at `size`. Both resample the decisions with the
stationary bootstrap (Politis & Romano 1994) of mean block length `block`, as the report's intervals do.

A candidate whose losses equal the benchmark's at every decision cannot beat it and is left out (`tied`):
arch's SPA would count its zero mean difference as never exceeded by the resamples' zeros and answer p = 0.
Without any other candidate the p-values are 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

SIZE = 0.05
"""The tests' size: a p-value below it rejects; StepM's family-wise error rate."""
RETURN_LOSS = "minus each decision's excess return"


@dataclass(frozen=True)
class SuperiorityTest:
    """SPA and StepM of `candidates` against `benchmark` on per-decision losses."""

    benchmark: str
    candidates: tuple[str, ...]
    """Every run compared with the benchmark, the tied ones included."""
    pvalues: dict[str, float]
    """SPA p-values: "consistent" (Hansen's), and its "lower" and "upper" bounds."""
    superior: tuple[str, ...]
    """The candidates StepM finds better than the benchmark at `size` (family-wise)."""
    tied: tuple[str, ...]
    """Candidates with the benchmark's losses at every decision, left out of the tests."""
    loss: str
    """What a decision's loss is (`RETURN_LOSS`, or a mandate's miss)."""
    size: float
    observations: int
    block: int
    resamples: int
    seed: int

    @property
    def pvalue(self) -> float:
        """Hansen's consistent p-value."""
        return self.pvalues["consistent"]


def superiority_test(
    returns: Mapping[str, np.ndarray],
    benchmark: str,
    *,
    block: int,
    resamples: int,
    seed: int,
    size: float = SIZE,
) -> SuperiorityTest:
    """SPA and StepM of every series of `returns` but `benchmark` against it; all are per-decision returns of
    one length (losses are their negatives). ValueError without a candidate or with fewer than 3 decisions."""
    losses = {name: -np.asarray(series, dtype=float) for name, series in returns.items()}
    return superiority_on_losses(losses, benchmark, loss=RETURN_LOSS, block=block, resamples=resamples, seed=seed,
                                 size=size)


def superiority_on_losses(
    losses: Mapping[str, np.ndarray],
    benchmark: str,
    *,
    loss: str,
    block: int,
    resamples: int,
    seed: int,
    size: float = SIZE,
) -> SuperiorityTest:
    """SPA and StepM of every series of `losses` (per decision, of one length, lower is better; `loss` says what
    they are) but `benchmark` against it. ValueError without a candidate or with fewer than 3 decisions."""
    from arch.bootstrap import StepM  # arch loads in about a second: only when a report is tested

    candidates = tuple(name for name in losses if name != benchmark)
    if not candidates:
        raise ValueError("SPA needs at least one strategy besides the benchmark")
    table = np.column_stack([np.asarray(losses[name], dtype=float) for name in candidates])  # (D, k)
    reference = np.asarray(losses[benchmark], dtype=float)  # (D,)
    if len(reference) < 3 or table.shape[0] != len(reference):
        raise ValueError("SPA needs at least 3 decisions, the same for every strategy")
    differs = np.any(table != reference[:, None], axis=0)  # (k,)
    tested = [name for name, keep in zip(candidates, differs, strict=True) if keep]
    pvalues = dict.fromkeys(("lower", "consistent", "upper"), 1.0)
    superior: tuple[str, ...] = ()
    if tested:
        stepm = StepM(
            reference, table[:, differs], size=size, block_size=block, reps=resamples, bootstrap="stationary",
            seed=seed,
        )
        stepm.compute()
        stepm.spa.compute()  # StepM's own SPA back on every candidate: the first step's p-values, same draws
        pvalues = {kind: float(value) for kind, value in stepm.spa.pvalues.items()}
        superior = tuple(tested[int(i)] for i in stepm.superior_models)
    return SuperiorityTest(
        benchmark=benchmark,
        candidates=candidates,
        pvalues=pvalues,
        superior=superior,
        tied=tuple(name for name in candidates if name not in tested),
        loss=loss,
        size=size,
        observations=len(reference),
        block=block,
        resamples=resamples,
        seed=seed,
    )
