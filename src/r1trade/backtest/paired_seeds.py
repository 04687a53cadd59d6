"""A variant of a recipe against the recipe itself, seed by seed, on the same held-out decisions.

An ablation asks what one part of a recipe is worth. Run from the same warm starts (`seeds --warmstart-from`),
both arms share each seed's starting model, and both are scored on the same test decisions, so the difference
in `Direction Accuracy [%]` is paired twice: per seed and per decision. Its interval resamples both levels at
once (a two-stage bootstrap): the seeds with replacement, since a recipe's worth is over the seeds a user may
draw, and the decisions in stationary blocks (Politis & Romano 1994), since neighbouring decisions share the
market; one resample of the decisions serves every seed, as every seed faced the same market. With three seeds
the seed level dominates: the interval says how far a handful of seeds pins a difference down, no further.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from r1trade.backtest.bootstrap import percentile_interval, stationary_indices
from r1trade.backtest.report import HITS_FILE
from r1trade.errors import UsageError
from r1trade.eval.ladder import AGENT_PREFIX
from r1trade.safe_load import first_line, read_json_object

SUMMARY_FILE = "seeds.json"
"""What `r1trade seeds` writes into its folder: each seed's test report and figures, and their spread."""


@dataclass(frozen=True)
class PairedDifference:
    """`Direction Accuracy [%]` of both arms on each shared seed, the variant's mean difference over those seeds
    in percentage points, and its 95 % interval."""

    seeds: tuple[int, ...]
    reference: dict[int, float]
    variant: dict[int, float]
    difference: float
    interval: tuple[float, float]

    @property
    def per_seed(self) -> dict[int, float]:
        """Each seed's difference, variant minus reference, in points."""
        return {seed: self.variant[seed] - self.reference[seed] for seed in self.seeds}


def paired_difference(
    reference: Mapping[int, np.ndarray],
    variant: Mapping[int, np.ndarray],
    *,
    resamples: int = 2000,
    mean_block: float = 10.0,
    seed: int = 0,
) -> PairedDifference:
    """Variant minus reference over the seeds both ran: each seed's hits (1 right, 0 wrong, one per decision,
    the same decisions in both arms), and the two-stage bootstrap's percentile interval of the mean difference."""
    seeds = tuple(sorted(set(reference) & set(variant)))
    if not seeds:
        raise UsageError("the two arms share no seed")
    hits = {arm: np.stack([np.asarray(found[s], dtype=float) for s in seeds]) for arm, found in
            (("reference", reference), ("variant", variant))}
    if hits["reference"].shape != hits["variant"].shape:
        raise UsageError("the two arms were scored on different numbers of decisions")
    differences = 100.0 * (hits["variant"] - hits["reference"])  # (seeds, decisions), in points
    rng = np.random.default_rng(seed)
    decisions = stationary_indices(differences.shape[1], resamples=resamples, mean_block=mean_block, rng=rng)
    # (resamples, seeds): each seed on the same resampled decisions, one seed at a time to bound the memory
    per_seed = np.stack([row[decisions].mean(axis=1) for row in differences], axis=1)
    drawn = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
    resampled = np.take_along_axis(per_seed, drawn, axis=1).mean(axis=1)
    accuracy = {arm: dict(zip(seeds, 100.0 * found.mean(axis=1), strict=True)) for arm, found in hits.items()}
    return PairedDifference(
        seeds=seeds,
        reference={s: float(v) for s, v in accuracy["reference"].items()},
        variant={s: float(v) for s, v in accuracy["variant"].items()},
        difference=float(differences.mean()),
        interval=percentile_interval(resampled),
    )


def agent_hits(report: Path) -> pd.Series:
    """The hits of a report's one agent, indexed by the decisions' times."""
    path = report / HITS_FILE
    if not path.is_file():
        raise UsageError(f"{report}: no {HITS_FILE} (a report written before it existed: run its backtest again)")
    try:
        frame = pd.read_csv(path, index_col=0)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable CSV ({first_line(exc)})") from None
    agents = [name for name in frame.columns if str(name).startswith(AGENT_PREFIX)]
    if len(agents) != 1 or not frame[agents[0]].isin([0.0, 1.0]).all():
        raise UsageError(f"{path}: expected one agent column of 0s and 1s")
    return frame[agents[0]]


def compare_seeds(reference: Path, variant: Path, *, resamples: int, mean_block: float) -> PairedDifference:
    """A variant's seeds folder against its recipe's: `Direction Accuracy [%]` paired by seed and by decision
    (`paired_difference`); both must have tested their agents on the same decisions."""
    reference_hits, variant_hits = seeds_hits(reference), seeds_hits(variant)
    times = {folder: next(iter(hits.values())).index for folder, hits in
             ((reference, reference_hits), (variant, variant_hits))}
    if not times[reference].equals(times[variant]):
        raise UsageError(f"{variant} and {reference} tested their agents on different decisions")
    return paired_difference(
        {seed: hits.to_numpy() for seed, hits in reference_hits.items()},
        {seed: hits.to_numpy() for seed, hits in variant_hits.items()},
        resamples=resamples, mean_block=mean_block,
    )


def seeds_hits(folder: Path) -> dict[int, pd.Series]:
    """Each finished seed's agent hits on its test decisions, from the reports `folder`'s seeds.json lists; every
    seed must have been tested on the same decisions."""
    path = folder / SUMMARY_FILE
    if not path.is_file():
        raise UsageError(f"{folder}: not a seeds folder (no {SUMMARY_FILE}; `r1trade seeds` writes it)")
    entries = read_json_object(path).get("seeds")
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path} lists no seed")
    found: dict[int, pd.Series] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("seed"), int) or "report" not in entry:
            raise UsageError(f"{path}: a seed without its number and report")
        found[entry["seed"]] = agent_hits(Path(str(entry["report"])))
    first = next(iter(found.values())).index
    if any(not hits.index.equals(first) for hits in found.values()):
        raise UsageError(f"{path}: its seeds were tested on different decisions")
    return found
