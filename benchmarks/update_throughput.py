"""One PPO update with SmolLM2-135M-Instruct on this CPU: trained tokens/s and peak memory, LoRA vs full.

A synthetic rollout batch (random token ids, a quarter of them marked as sampled) goes through the trainer's
scoring pass (old/reference log-probs and values, no gradients) and one epoch of optimisation. Each mode runs in a
fresh process so its peak RSS is its own. Run: `python benchmarks/update_throughput.py [--rows 8 --tokens 512]`;
`--no-onednn` computes the linear layers with torch's default BLAS.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from r1trade.runtime import cpu_header, keep_freed_memory


def one_mode(lora: bool, rows: int, tokens: int, onednn: bool) -> dict:
    from r1trade.agent.model import load_agent_models
    from r1trade.config import load_config
    from r1trade.rl.batch import RolloutBatch, compute_advantages
    from r1trade.rl.trainer import Trainer

    config = load_config(
        "btc_momentum",
        [f"model.lora.enabled={str(lora).lower()}", "train.epochs=1", f"train.minibatch_size={rows}",
         "train.micro_batch_size=2", f"model.onednn={onednn}"],
    )
    models = load_agent_models(config.model, seed=0)
    trainer = Trainer(config, models, lambda n: [], Path("/tmp/r1trade-bench-run"))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(models.tokenizer), (rows, tokens), generator=generator)
    action = (torch.rand(rows, tokens, generator=generator) < 0.25).float()
    action[:, 0] = 0
    rewards = torch.zeros(rows, tokens)
    rewards[:, -1] = torch.randn(rows, generator=generator)
    action[:, -1] = 1
    batch = RolloutBatch(ids, torch.ones(rows, tokens, dtype=torch.long), action, torch.zeros(rows, tokens),
                         rewards, torch.arange(rows), torch.arange(rows))
    started = time.perf_counter()
    batch = compute_advantages(trainer.score(batch), config.train)
    scored = time.perf_counter()
    trainer.optimise(batch)
    done = time.perf_counter()
    params = sum(p.numel() for p in models.policy.parameters())
    trainable = sum(p.numel() for p in models.policy.parameters() if p.requires_grad)
    trained = rows * tokens
    return {
        "mode": "LoRA r=%d" % config.model.lora.r if lora else "full fine-tune",
        "parameters": params,
        "trainable": trainable,
        "score_s": scored - started,
        "optimise_s": done - scored,
        "trained_tokens_per_s": trained / (done - scored),
        "update_tokens_per_s": trained / (done - started),
        "achieved_gflops": 6 * params * trained / (done - scored) / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--no-onednn", action="store_true", help="linear layers by torch's default BLAS")
    parser.add_argument("--mode", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    keep_freed_memory()
    if args.mode:
        print(json.dumps(one_mode(args.mode == "lora", args.rows, args.tokens, not args.no_onednn)))
        return
    print(cpu_header())
    print(f"{torch.get_num_threads()} torch threads, python {platform.python_version()}, torch {torch.__version__}; "
          f"batch {args.rows} x {args.tokens} tokens; "
          f"linear layers by {'torch default BLAS' if args.no_onednn else 'oneDNN'}")
    results = []
    for mode in ("lora", "full"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--rows", str(args.rows),
                              "--tokens", str(args.tokens), *(["--no-onednn"] if args.no_onednn else [])],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in results:
        print(f"{r['mode']:>15}: trainable {r['trainable'] / 1e6:7.2f} M of {r['parameters'] / 1e6:.1f} M | "
              f"score {r['score_s']:5.1f} s, optimise {r['optimise_s']:5.1f} s | "
              f"trained {r['trained_tokens_per_s']:6.0f} tok/s ({r['achieved_gflops']:5.1f} GFLOP/s at 6N/token) | "
              f"peak RSS {r['peak_rss_gb']:.1f} GB")
    lora, full = results
    print(f"LoRA / full trained tokens/s: {lora['trained_tokens_per_s'] / full['trained_tokens_per_s']:.2f}x; "
          f"peak memory {lora['peak_rss_gb'] / full['peak_rss_gb']:.2f}x")


if __name__ == "__main__":
    main()
