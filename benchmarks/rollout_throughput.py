"""Rollout throughput: sampled agent tokens per second with SmolLM2-135M-Instruct on this CPU.

(a) one environment at a time, the whole context re-encoded every turn (no cache reuse);
(b) all environments batched, the KV cache reused across turns (only new observations are prefilled).
Both play the same episodes (same seeds, greedy decoding). Run: `python benchmarks/rollout_throughput.py`.
`--profile` also splits each mode's time into decoding steps, prefill (attention apart) and the rest;
`--dtype bfloat16` casts the model; `--copy-prefix` makes (b) copy the system prompt's cache into every row instead
of sharing one copy; `--cpu-kernels off` runs without r1trade's CPU fast paths (`model.cpu_kernels`: linear layers
by torch's default BLAS, SDPA attention, the system prompt's cache copied into every row).
`--against-previous`: (b) with the decode step before it moved onto the device (`previous_engine.py`) and with
today's, alternating `--repeats` times; checks that both sample the same tokens and prints `speedup: N.Nx`.
`--set KEY=VALUE` overrides the config (e.g. `--config demo_tools --set model.name_or_path=DIR`).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import defaultdict

import torch
from transformers import AttentionInterface

from r1trade.config import load_config
from r1trade.env.trading_env import make_envs
from r1trade.models.loading import load_agent_models
from r1trade.rollout.backend import SamplingConfig
from r1trade.rollout.build import transformers_engine
from r1trade.rollout.loop import RolloutEngine, Trajectory
from r1trade.runtime import cpu_header


def play(engine: RolloutEngine, config, seeds: list[int], batch: int) -> tuple[list[Trajectory], float]:
    """The episodes of `seeds`, played `batch` environments at a time, and the seconds they took."""
    trajectories, started = [], time.perf_counter()
    for start in range(0, len(seeds), batch):
        part = seeds[start : start + batch]
        trajectories += engine.run(make_envs(config, len(part)), part, generator=torch.Generator().manual_seed(0))
    return trajectories, time.perf_counter() - started


def measure(engine: RolloutEngine, config, seeds: list[int], batch: int) -> tuple[int, float]:
    """Sampled tokens and seconds to play `seeds` episodes, `batch` environments at a time."""
    trajectories, seconds = play(engine, config, seeds, batch)
    return sum(t.num_action_tokens for t in trajectories), seconds


def against_previous(models, config, sampling: SamplingConfig, seeds: list[int], repeats: int) -> None:
    """Today's engine against the previous one on the same episodes, alternating (AB BA ...) so that a drifting
    machine load hits both alike; the sampled tokens must be the same."""
    from previous_engine import PREVIOUS, previous_engine

    engines = {"previous": previous_engine(models.policy, models.tokenizer, sampling),
               "today": transformers_engine(models.policy, models.tokenizer, sampling)}
    seconds: dict[str, list[float]] = defaultdict(list)
    played = {}
    for engine in engines.values():  # warm-up (kernels built, weights packed)
        play(engine, config, seeds[:1], 1)
    for repeat in range(repeats):
        for name in (list(engines) if repeat % 2 == 0 else list(engines)[::-1]):
            trajectories, took = play(engines[name], config, seeds, len(seeds))
            seconds[name].append(took)
            played[name] = [[s.token_ids for s in t.segments] for t in trajectories]
    tokens = sum(t.num_action_tokens for t in trajectories)
    same = played["previous"] == played["today"]
    for name in engines:
        mean = sum(seconds[name]) / repeats
        label = f"{name} ({PREVIOUS})" if name == "previous" else name
        print(f"{label:>18}: {tokens} tokens, {mean:6.2f} s a rollout = {tokens / mean:7.1f} tok/s "
              f"(runs: {', '.join(f'{s:.2f}' for s in seconds[name])})", flush=True)
    print(f"same tokens: {'yes' if same else 'NO'}")
    print(f"speedup: {sum(seconds['previous']) / sum(seconds['today']):.2f}x")


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
    parser.add_argument("--against-previous", action="store_true", help="(b) with the previous engine and today's")
    parser.add_argument("--repeats", type=int, default=4, help="with --against-previous: rollouts per engine")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="KEY=VALUE config override")
    args = parser.parse_args()
    overrides = [f"env.episode_decisions={args.decisions}", "model.lora.enabled=false", *args.overrides]
    config = load_config(args.config, [*overrides, f"model.cpu_kernels={args.cpu_kernels}"])
    models = load_agent_models(config.model, seed=0)
    models.policy.to(getattr(torch, args.dtype))
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, greedy=args.temperature == 0,
                              temperature=args.temperature or 1.0)
    seeds = list(range(args.envs))
    if args.against_previous:
        print(cpu_header())
        print(f"{args.config} {' '.join(args.overrides)}: {args.envs} envs, {args.decisions} decisions, "
              f"{args.max_new_tokens} new tokens, temperature {args.temperature}, {torch.get_num_threads()} threads")
        against_previous(models, config, sampling, seeds, args.repeats)
        return
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
