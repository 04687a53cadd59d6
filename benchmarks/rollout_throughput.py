"""Rollout throughput: sampled agent tokens per second with SmolLM2-135M-Instruct on this CPU.

(a) one environment at a time, the whole context re-encoded every turn (no cache reuse);
(b) all environments batched, the KV cache reused across turns (only new observations are prefilled).
Both play the same episodes (same seeds, greedy decoding). Run: `python benchmarks/rollout_throughput.py`.
`--profile` also splits (b)'s time into decoding steps, prefill and the rest; `--dtype bfloat16` casts the model;
`--copy-prefix` makes (b) copy the system prompt's cache into every row instead of sharing one copy.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import defaultdict

import torch

from r1trade.agent.model import load_agent_models
from r1trade.agent.rollout import RolloutEngine, SamplingConfig
from r1trade.config import load_config
from r1trade.env.trading_env import make_envs


def measure(engine: RolloutEngine, config, seeds: list[int], batch: int) -> tuple[int, float]:
    """Sampled tokens and seconds to play `seeds` episodes, `batch` environments at a time."""
    tokens, started = 0, time.perf_counter()
    for start in range(0, len(seeds), batch):
        part = seeds[start : start + batch]
        for trajectory in engine.run(make_envs(config, len(part)), part):
            tokens += trajectory.num_action_tokens
    return tokens, time.perf_counter() - started


def profile_model_calls(engine: RolloutEngine) -> dict[str, float]:
    """Time every model call of `engine` by kind (prefill: several new columns; decode: one) into the returned dict."""
    stats: dict[str, float] = defaultdict(float)
    forward = engine._forward

    def timed(cache, ids, attention):
        started = time.perf_counter()
        logits = forward(cache, ids, attention)
        kind = "prefill" if ids.shape[1] > 1 else "decode"
        stats[f"{kind} seconds"] += time.perf_counter() - started
        stats[f"{kind} calls"] += 1
        stats[f"{kind} slots"] += ids.numel()
        stats[f"{kind} real tokens"] += int(attention.sum())
        return logits

    engine._forward = timed
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="btc_momentum")
    parser.add_argument("--envs", type=int, default=16, help="environments batched in (b)")
    parser.add_argument("--sequential", type=int, default=4, help="of those, episodes played one by one in (a)")
    parser.add_argument("--decisions", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--modes", default="ab", help="which of (a) and (b) to run, e.g. b to re-measure (b) alone")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--profile", action="store_true", help="split (b)'s time into decoding, prefill and the rest")
    parser.add_argument("--copy-prefix", action="store_true", help="(b) copies the system prompt's cache per row")
    args = parser.parse_args()
    config = load_config(args.config, [f"env.episode_decisions={args.decisions}", "model.lora.enabled=false"])
    models = load_agent_models(config.model, seed=0)
    models.policy.to(getattr(torch, args.dtype))
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, greedy=True)
    seeds = list(range(args.envs))
    slow = RolloutEngine(models.policy, models.tokenizer, sampling, reuse_cache=False)
    fast = RolloutEngine(models.policy, models.tokenizer, sampling, reuse_cache=True)
    fast.shared_prefix = fast.shared_prefix and not args.copy_prefix
    measure(fast, config, seeds[:1], 1)  # warm-up
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"python {platform.python_version()}, torch {torch.__version__}", flush=True)
    rates = {}
    if "a" in args.modes:
        tokens, seconds = measure(slow, config, seeds[: args.sequential], 1)
        rates["a"] = tokens / seconds
        print(f"(a) 1 env, no cache reuse : {tokens:6d} tokens in {seconds:7.1f} s = {rates['a']:7.1f} tok/s",
              flush=True)
    if "b" in args.modes:
        stats = profile_model_calls(fast) if args.profile else {}
        tokens, seconds = measure(fast, config, seeds, args.envs)
        rates["b"] = tokens / seconds
        print(f"(b) {args.envs} envs, cache reuse : {tokens:6d} tokens in {seconds:7.1f} s = {rates['b']:7.1f} tok/s")
        for key, value in stats.items():
            print(f"    {key}: {value:,.1f}")
        if stats:
            rest = seconds - stats["decode seconds"] - stats["prefill seconds"]
            print(f"    everything else: {rest:.1f} s")
    if len(rates) == 2:
        print(f"ratio (b)/(a): {rates['b'] / rates['a']:.1f}x")


if __name__ == "__main__":
    main()
