"""Learning curves of a training run, drawn from its `metrics.jsonl`."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from r1trade.errors import UsageError
from r1trade.outputs import write_through
from r1trade.rl.metrics_log import METRICS_FILE, read_records

log = logging.getLogger(__name__)

PANELS: list[tuple[str, list[str]]] = [
    ("episode return and PnL", ["episode_return", "episode_pnl_pct", "buy_and_hold_pct"]),
    ("valid tool calls", ["valid_call_rate"]),
    ("entropy", ["entropy"]),
    ("KL to reference / approx KL", ["kl_ref", "approx_kl"]),
    ("value loss / explained variance", ["value_loss", "explained_variance"]),
    ("grad norm", ["grad_norm"]),
]


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-update metric rows of a run directory (a cut-short last line is skipped with a warning)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise UsageError(f"no metrics in '{run_dir}': expected {path} (a directory written by `r1trade train`)")
    return read_records(path)


def plot_learning_curves(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write `learning_curves.png` (key diagnostics) and `reward_components.png`; return their paths."""
    rows = read_metrics(run_dir)
    if not rows:
        raise UsageError(f"'{run_dir}/metrics.jsonl' is empty: train at least one update first")
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    updates = [row["update"] for row in rows]

    fig, axes = plt.subplots(3, 2, figsize=(11, 9), sharex=True)
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        present = [key for key in keys if any(key in row for row in rows)]
        for key in present:
            ax.plot(updates, [row.get(key, float("nan")) for row in rows], marker=".", label=key)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if present:
            ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("update")
    fig.suptitle(f"{run_dir.name}: learning curves")
    fig.tight_layout()
    curves = out_dir / "learning_curves.png"
    write_through(curves, lambda temporary: fig.savefig(temporary, dpi=110, format="png"))
    plt.close(fig)

    names = sorted({key for row in rows for key in row if key.startswith("reward/")})
    fig, ax = plt.subplots(figsize=(11, 5))
    for name in names:
        ax.plot(updates, [row.get(name, float("nan")) for row in rows], marker=".", label=name.removeprefix("reward/"))
    ax.set_title(f"{run_dir.name}: reward components (weighted, mean per episode)")
    ax.set_xlabel("update")
    ax.grid(alpha=0.3)
    if names:
        ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    components = out_dir / "reward_components.png"
    write_through(components, lambda temporary: fig.savefig(temporary, dpi=110, format="png"))
    plt.close(fig)
    return [curves, components]


COMPARE_KEYS = ["episode_return", "valid_call_rate", "episode_pnl_pct", "entropy"]


def plot_comparison(run_dirs: list[Path], out: Path, keys: list[str] | None = None) -> Path:
    """Overlay several runs' curves (one panel per metric, one line per run, labelled by directory name).

    `out` without a suffix gets `.png` (the path written is returned); any other suffix is refused.
    """
    if len(run_dirs) < 2:
        raise UsageError("compare at least two run directories")
    if out.suffix.lower() not in (".png", "") or not out.name:
        raise UsageError(f"--out '{out}' is not a .png file: the comparison is drawn as a PNG")
    out = out if out.suffix else out.with_suffix(".png")
    runs = {run_dir.name: read_metrics(run_dir) for run_dir in run_dirs}
    known = sorted({key for rows in runs.values() for row in rows for key in row} - {"update"})
    unknown = [key for key in keys or [] if key not in known]
    if unknown:
        listed = ", ".join(known) or "none"
        raise UsageError(f"no run logs the metric '{unknown[0]}'; known metrics: {listed}")
    keys = keys or COMPARE_KEYS
    columns = 2
    rows_of_panels = -(-len(keys) // columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(11, 3.6 * rows_of_panels), sharex=True, squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for name, rows in runs.items():
            ax.plot([row["update"] for row in rows], [row.get(key, float("nan")) for row in rows],
                    marker=".", label=name)
        ax.set_title(key, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("update")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_through(out, lambda temporary: fig.savefig(temporary, dpi=110, format="png"))
    plt.close(fig)
    return out


def plot_probe(records: list[dict], out: Path, *, title: str = "") -> Path:
    """The held-out direction probe of a run (`r1trade probe-run`): accuracies and long share against updates."""
    if not records:
        raise UsageError("no probe results to draw")
    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [100 * r["expected_direction_accuracy"] for r in records], "o-", label="expected accuracy")
    ax.plot(steps, [100 * r["greedy_direction_accuracy"] for r in records], "s--", label="greedy accuracy")
    ax.plot(steps, [100 * r["long_share"] for r in records], ":", color="grey", label="P(long)")
    scored = [r for r in records if r.get("discrimination") is not None]
    if scored:
        ax.plot([r["step"] for r in scored], [100 * r["discrimination"] for r in scored], "^-", color="tab:green",
                label="discrimination: P(long | rose) - P(long | fell)")
        ax.axhline(0, color="black", linewidth=0.6)
    ax.axhline(50, color="black", linewidth=0.6)
    if "up_share" in records[-1]:
        ax.axhline(100 * records[-1]["up_share"], color="grey", linestyle="-.", linewidth=0.8,
                   label="always long (market rose)")
    ax.set_xlabel("update (0: the policy RL started from)")
    ax.set_ylabel("%")
    ax.set_title(title or f"held-out direction probe, {records[0]['points']} decisions")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_through(out, lambda temporary: fig.savefig(temporary, dpi=110, format="png"))
    plt.close(fig)
    return out
