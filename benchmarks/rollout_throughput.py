"""Rollout throughput: sampled agent tokens per second with SmolLM2-135M-Instruct on this CPU.

(a) one environment at a time, the whole context re-encoded every turn (no cache reuse);
(b) all environments batched, the KV cache reused across turns (only new observations are prefilled).
Both play the same episodes (same seeds, greedy decoding). Run: `python benchmarks/rollout_throughput.py`.
`--profile` also splits each mode's time into decoding steps, prefill (attention apart) and the rest;
`--dtype bfloat16` casts the model; `--copy-prefix` makes (b) copy the system prompt's cache into every row instead
of sharing one copy; `--cpu-kernels off` runs without r1trade's CPU fast paths (`model.cpu_kernels`: linear layers
by torch's default BLAS, SDPA attention, the system prompt's cache copied into every row).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import defaultdict

import torch
from transformers import AttentionInterface

from r1trade.rollout.backend import SamplingConfig
from r1trade.models.loading import load_agent_models
from r1trade.rollout.loop import RolloutEngine
from r1trade.rollout.build import transformers_engine
from r1trade.config import load_config
from r1trade.env.trading_env import make_envs
from r1trade.runtime import cpu_header


def measure(engine: RolloutEngine, config, seeds: list[int], batch: int) -> tuple[int, float]:
    """Sampled tokens and seconds to play `seeds` episodes, `batch` environments at a time."""
    tokens, started = 0, time.perf_counter()
    for start in range(0, len(seeds), batch):
        part = seeds[start : start + batch]
        for trajectory in engine.run(make_envs(config, len(part)), part):
            tokens += trajectory.num_action_tokens
    return tokens, time.perf_counter() - started


def profile_model_calls(engine: RolloutEngine) -> dict[str, float]:
    """Time every model call of `engine` by kind (prefill: several new columns; decode: one) into the returned dict,
    and the attention inside them where it is the CPU fast paths' rollout attention (re-registered with a timer)."""
    stats: dict[str, float] = defaultdict(float)
    backend = engine.backend
    forward = backend._forward

    def timed(cache, ids, attention):
        started = time.perf_counter()
        logits = forward(cache, ids, attention)
        kind = "prefill" if ids.shape[1] > 1 else "decode"
        stats[f"{kind} seconds"] += time.perf_counter() - started
        stats[f"{kind} calls"] += 1
        stats[f"{kind} slots"] += ids.numel()
        stats[f"{kind} real tokens"] += int(attention.sum())
        return logits

    backend._forward = timed
    if backend.cpu is None or not backend.cpu.shares_prefix(backend.model):  # transformers' own: not timed apart
        return stats
    from r1trade.cpu.attention import KERNEL_ATTENTION, grouped_query_attention

    implementation = backend.model.config._attn_implementation
    kernel = implementation == KERNEL_ATTENTION

    def timed_attention(module, query, *args, **kwargs):
        started = time.perf_counter()
        out = grouped_query_attention(module, query, *args, kernel=kernel, **kwargs)
        stats[f"{'prefill' if query.shape[2] > 1 else 'decode'} attention seconds"] += time.perf_counter() - started
        return out

    AttentionInterface.register(implementation, timed_attention)
    return stats


def report(label: str, tokens: int, seconds: float, stats: dict[str, float]) -> None:
    print(f"{label}: {tokens:6d} tokens in {seconds:7.1f} s = {tokens / seconds:7.1f} tok/s", flush=True)
    for key, value in stats.items():
        print(f"    {key}: {value:,.1f}")
    if stats:
        print(f"    everything else: {seconds - stats['decode seconds'] - stats['prefill seconds']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="btc_momentum")
    parser.add_argument("--envs", type=int, default=16, help="environments batched in (b)")
    parser.add_argument("--sequential", type=int, default=4, help="of those, episodes played one by one in (a)")
    parser.add_argument("--decisions", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--modes", default="ab", help="which of (a) and (b) to run, e.g. b to re-measure (b) alone")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--profile", action="store_true", help="split the time: decoding, prefill, attention, rest")
    parser.add_argument("--copy-prefix", action="store_true", help="(b) copies the system prompt's cache per row")
    parser.add_argument("--cpu-kernels", choices=["auto", "off"], default="auto",
                        help="model.cpu_kernels: off for torch's default BLAS and SDPA attention")
    args = parser.parse_args()
    overrides = [f"env.episode_decisions={args.decisions}", "model.lora.enabled=false"]
    config = load_config(args.config, [*overrides, f"model.cpu_kernels={args.cpu_kernels}"])
    models = load_agent_models(config.model, seed=0)
    models.policy.to(getattr(torch, args.dtype))
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, greedy=True)
    seeds = list(range(args.envs))
    slow = transformers_engine(models.policy, models.tokenizer, sampling, reuse_cache=False)
    fast = transformers_engine(models.policy, models.tokenizer, sampling, reuse_cache=True)
    fast.backend.shared_prefix = fast.backend.shared_prefix and not args.copy_prefix
    measure(fast, config, seeds[:1], 1)  # warm-up
    print(cpu_header())
    print(f"{torch.get_num_threads()} torch threads, python {platform.python_version()}, torch {torch.__version__}",
          flush=True)
    rates = {}
    if "a" in args.modes:
        stats = profile_model_calls(slow) if args.profile else {}
        tokens, seconds = measure(slow, config, seeds[: args.sequential], 1)
        rates["a"] = tokens / seconds
        report("(a) 1 env, no cache reuse ", tokens, seconds, stats)
    if "b" in args.modes:
        stats = profile_model_calls(fast) if args.profile else {}
        tokens, seconds = measure(fast, config, seeds, args.envs)
        rates["b"] = tokens / seconds
        report(f"(b) {args.envs} envs, cache reuse ", tokens, seconds, stats)
    if len(rates) == 2:
        print(f"ratio (b)/(a): {rates['b'] / rates['a']:.1f}x")


if __name__ == "__main__":
    main()
