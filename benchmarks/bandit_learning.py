"""Learning curves on the text bandit (r1trade.rl.bandit): P(rewarded action) per update for trainer settings.

Each `--variant` is `name:key=value,key=value` over `train.*` keys (plus `seed`, or any `section.key`), run on the
tiny model through the real Trainer. Example, the long-turn comparison of docs/notebook/results-log.md section 7:

    python benchmarks/bandit_learning.py --turn-tokens 32 --updates 20 \\
        --variant turn:credit=turn --variant token:credit=token

Prints one line per variant: its settings, seconds, and P before training and after every update.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import torch

from r1trade.config import load_config
from r1trade.quiet import quiet_third_party
from r1trade.rl.bandit import learning_curve
from r1trade.runtime import cpu_header

BASE = [
    "model.name_or_path=tiny-random", "model.lora.enabled=false", "rollout.num_envs=16", "train.epochs=2",
    "train.minibatch_size=8", "train.micro_batch_size=8", "train.learning_rate=0.01",
    "train.critic_learning_rate=0.003", "train.kl_coef=0", "train.entropy_coef=0", "train.value_coef=0.1",
    "train.checkpoint_every=1000",
]


def overrides(spec: str) -> tuple[str, list[str]]:
    name, _, settings = spec.partition(":")
    items = [item for item in settings.split(",") if item]
    return name, [item if ("." in item.split("=")[0] or item.startswith("seed=")) else f"train.{item}" for item in items]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, help="name:key=value,...")
    parser.add_argument("--turn-tokens", type=int, default=8, help="rollout.max_new_tokens")
    parser.add_argument("--updates", type=int, default=25)
    parser.add_argument("--noise", type=float, default=0.0, help="std of the reward shared within a group")
    parser.add_argument("--decisions", type=int, default=1, help="decisions per episode")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    quiet_third_party()
    torch.set_num_threads(args.threads)
    print(cpu_header())
    print(f"turn tokens {args.turn_tokens}, updates {args.updates}, noise {args.noise}, decisions {args.decisions}")
    for spec in args.variant:
        name, extra = overrides(spec)
        config = load_config(None, [*BASE, f"rollout.max_new_tokens={args.turn_tokens}",
                                    f"train.updates={args.updates}", *extra])
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as run_dir:
            curve = learning_curve(config, run_dir, noise=args.noise, decisions=args.decisions)
        seconds = time.perf_counter() - started
        print(f"{name} ({' '.join(extra)}) {seconds:.1f}s P: {' '.join(f'{p:.3f}' for p in curve)}", flush=True)


if __name__ == "__main__":
    main()
