"""Memory of one optimiser step over whole multi-turn episodes (SmolLM2-135M-Instruct, the tool-gated rung).

`configs/tool_gated.yaml` trains on minibatches of 12 episodes, each one row of up to five turns. As one
micro-batch of 12 they went past 24 GB, so the config takes micro-batches of 6. This benchmark samples the
episodes once with the config's model and saves them (safetensors), then in a fresh process per mode (so that
each peak is its own) scores them and takes one optimiser step over all of them. It prints, per mode, the
resident memory after loading the models, after the scoring pass (no gradients) and at the step's peak, the
step's seconds, and how far its gradient (Adam's first moment after the step, divided by 1 - beta1) is from the
first mode's: the norm of the difference over the norm of the first mode's gradient. The modes differ in how the
step is cut and stored, not in what it computes, so that is float rounding. (The weights' update after one Adam
step is no such measure: it divides each gradient element by its own size, so an element that rounding flips
from +1e-9 to -1e-9 moves the whole learning rate the other way.) Run:
`python benchmarks/update_memory.py [--config tool_gated] [--episodes 12] [--set a.b=c ...]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from r1trade.runtime import cpu_header

MODES = {
    "micro6": ["train.micro_batch_size=6"],  # configs/tool_gated.yaml
    "micro12": ["train.micro_batch_size=12"],
    "micro6-by-length": ["train.micro_batch_size=6", "train.micro_batch_order=length"],
    "micro12-checkpointing": ["train.micro_batch_size=12", "model.gradient_checkpointing=true"],
}
"""Micro-batches of 6 or 12 episodes, cut in drawn order or by length, with or without activation checkpointing.
The first mode run is the reference the others' trained weights are compared with."""


def step_config(name: str, episodes: int, overrides: list[str]):
    """`name` with one optimiser step over `episodes` episodes: one epoch, one minibatch of all of them."""
    from r1trade.config import load_config

    return load_config(name, [f"rollout.num_envs={episodes}", f"train.minibatch_size={episodes}",
                              "train.epochs=1", "train.group_size=1", *overrides])


def trainer_for(config, run_dir: Path):
    from r1trade.env.trading_env import make_envs
    from r1trade.models.loading import load_agent_models
    from r1trade.rl.trainer import Trainer

    torch.manual_seed(config.seed)
    models = load_agent_models(config.model, seed=config.seed)
    return Trainer(config, models, lambda n: make_envs(config, n, "train"), run_dir)


def sample_episodes(name: str, episodes: int, overrides: list[str], out: Path) -> dict:
    """Sample `episodes` episodes with the config's model and save their collated batch to `out`."""
    from r1trade.rl.batch import collate

    config = step_config(name, episodes, [*overrides, *MODES[next(iter(MODES))]])
    trainer = trainer_for(config, out.parent / "sampling")
    started = time.perf_counter()
    batch = collate(trainer.rollout(), pad_id=trainer.engine.pad_id)
    tensors = {f.name: getattr(batch, f.name) for f in fields(batch)}
    save_file({k: v.contiguous() for k, v in tensors.items() if isinstance(v, torch.Tensor)}, str(out))
    lengths = batch.attention_mask.sum(dim=1)
    return {"rows": batch.rows, "width": batch.input_ids.shape[1], "mean_tokens": float(lengths.float().mean()),
            "max_tokens": int(lengths.max()), "sampled_tokens": int(batch.action_mask.sum()),
            "rollout_s": time.perf_counter() - started}


def resident_gb() -> float:
    """The process's resident memory now (VmRSS), in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024**2
    return float("nan")


def one_mode(name: str, episodes: int, overrides: list[str], mode: str, batch_file: Path, weights: Path) -> dict:
    """Score the saved episodes and take one optimiser step in `mode`; save its gradient of the trained weights
    to `weights`."""
    from r1trade.rl.advantages import compute_advantages
    from r1trade.rl.batch import RolloutBatch

    config = step_config(name, episodes, [*overrides, *MODES[mode]])
    trainer = trainer_for(config, weights.parent / "run")
    loaded = resident_gb()
    batch = RolloutBatch(**load_file(str(batch_file)))
    batch = compute_advantages(trainer.score(batch), config.train)
    scored = resident_gb()
    started = time.perf_counter()
    trainer.optimise(batch)
    seconds = time.perf_counter() - started
    optimizer = trainer.optimizer
    beta1 = optimizer.param_groups[0]["betas"][0]
    gradient = {name: (optimizer.state[p]["exp_avg"] / (1 - beta1)).contiguous()
                for name, p in trainer.models.policy.named_parameters() if p.requires_grad}
    save_file(gradient, str(weights))
    return {"mode": mode, "loaded_gb": loaded, "scored_gb": scored,
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, "step_s": seconds}


def relative_difference(reference: Path, other: Path) -> float:
    """||other - reference|| / ||reference||, over all trained weights' tensors."""
    first, second = load_file(str(reference)), load_file(str(other))
    apart = sum(float((first[k].double() - second[k].double()).square().sum()) for k in first)
    size = sum(float(first[k].double().square().sum()) for k in first)
    return (apart / size) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tool_gated")
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--set", action="append", default=[], help="extra config overrides (a.b=c)")
    parser.add_argument("--modes", default=",".join(MODES), help="which modes, in order (the first is the reference)")
    parser.add_argument("--one-mode", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from r1trade.quiet import quiet_third_party

    quiet_third_party()
    if args.one_mode:
        print(json.dumps(one_mode(args.config, args.episodes, args.set, args.one_mode, args.batch, args.weights)))
        return
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}: choose from {list(MODES)}")
    print(cpu_header())
    print(f"{torch.get_num_threads()} torch threads, python {platform.python_version()}, torch {torch.__version__}; "
          f"config {args.config}, {args.episodes} episodes, overrides {args.set or 'none'}")
    with tempfile.TemporaryDirectory(prefix="r1trade-memory-") as folder:
        batch_file = Path(folder) / "episodes.safetensors"
        shape = sample_episodes(args.config, args.episodes, args.set, batch_file)
        print(f"episodes: {shape['rows']} rows padded to {shape['width']} tokens (mean {shape['mean_tokens']:.0f}, "
              f"longest {shape['max_tokens']}), {shape['sampled_tokens']} sampled tokens; "
              f"rollout {shape['rollout_s']:.1f} s")
        print("| mode | after loading | after scoring | step's peak | step | gradient vs the first mode's |")
        print("|---|---:|---:|---:|---:|---:|")
        reference = None
        for number, mode in enumerate(modes):
            weights = Path(folder) / f"weights-{number}.safetensors"
            command = [sys.executable, __file__, "--config", args.config, "--episodes", str(args.episodes),
                       *(part for item in args.set for part in ("--set", item)),
                       "--one-mode", mode, "--batch", str(batch_file), "--weights", str(weights)]
            done = subprocess.run(command, capture_output=True, text=True)
            mode = f"{mode}: {' '.join(MODES[mode])}"
            if done.returncode != 0:  # e.g. killed for memory: say so and go on with the next mode
                print(f"| {mode} | failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]} | | | | |")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            reference = reference or weights
            difference = relative_difference(reference, weights)
            print(f"| {mode} | {result['loaded_gb']:.1f} GB | {result['scored_gb']:.1f} GB | "
                  f"{result['peak_gb']:.1f} GB | {result['step_s']:.1f} s | {difference:.1e} |", flush=True)


if __name__ == "__main__":
    main()
