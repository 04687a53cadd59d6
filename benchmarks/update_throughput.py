"""Updates with SmolLM2-135M-Instruct on this CPU.

Default: one PPO update on a synthetic rollout batch (random token ids, a quarter of them marked as sampled) through
the trainer's scoring pass (old/reference log-probs and values, no gradients) and one epoch of optimisation; trained
tokens/s and peak memory, LoRA vs full, each mode in a fresh process so its peak RSS is its own. Run:
`python benchmarks/update_throughput.py [--rows 8 --tokens 512]`; `--cpu-kernels off` runs without r1trade's CPU
fast paths (`model.cpu_kernels`: linear layers by torch's default BLAS, SDPA attention).

`--compare-shared-prefix`: whole updates (rollout, scoring, optimisation) of `btc_momentum` with LoRA, 16
two-decision episodes in groups of 4, five ways: the path before this benchmark's options (full prompt, every row
run in full, old log-probs recomputed), the compact prompt alone, the compact prompt with the shared prefix run
once per micro-batch and the old log-probs the rollout sampled with (no policy pass in scoring without a critic),
that with minibatches of whole groups, each one micro-batch (`grouped`: a group's rows also share their first
observation), and `grouped` with the frozen weights in bfloat16 (`bf16`, what `model.dtype: auto` picks on a CPU
with AMX or AVX-512 BF16; the other modes pin float32). The modes alternate (ABC CBA ...) `--repeats` times each
so that a drifting machine load hits them alike; the last line printed is `speedup: N.Nx`, the first mode's mean
seconds per update over the last mode's.
`--profile-step MODE` runs one rollout of that mode and profiles one optimiser step on its first minibatch.

`--against-previous CONFIG`: whole updates of CONFIG (e.g. `demo_tools --set model.name_or_path=WARMSTART`) by two
trainers from the same start, one handed the rollout engine before the decoding step moved onto the device
(`previous_engine.py`), alternating `--repeats` times; both sample the same episodes, so every phase but the
rollout does the same work. Prints the per-phase seconds and `speedup: N.Nx` (whole update, previous / today).
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

from r1trade.runtime import cpu_header


def one_mode(lora: bool, rows: int, tokens: int, cpu_kernels: str) -> dict:
    from r1trade.config import load_config
    from r1trade.models.loading import load_agent_models
    from r1trade.rl.advantages import compute_advantages
    from r1trade.rl.batch import RolloutBatch
    from r1trade.rl.trainer import Trainer

    config = load_config(
        "btc_momentum",
        [f"model.lora.enabled={str(lora).lower()}", "train.epochs=1", f"train.minibatch_size={rows}",
         "train.micro_batch_size=2", f"model.cpu_kernels={cpu_kernels}", "train.old_logprobs=recompute",
         "train.share_prefix=false"],
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
    turn = torch.where(action.bool(), 0, -1)  # every sampled token in one turn of one decision
    batch = RolloutBatch(ids, torch.ones(rows, tokens, dtype=torch.long), action, torch.zeros(rows, tokens),
                         rewards, torch.arange(rows), torch.arange(rows), turn=turn, decision=turn.clone())
    started = time.perf_counter()
    batch = compute_advantages(trainer.score(batch), config.train)
    scored = time.perf_counter()
    trainer.optimise(batch)
    done = time.perf_counter()
    params = sum(p.numel() for p in models.policy.parameters())
    trainable = sum(p.numel() for p in models.policy.parameters() if p.requires_grad)
    trained = rows * tokens
    return {
        "mode": f"LoRA r={config.model.lora.r}" if lora else "full fine-tune",
        "parameters": params,
        "trainable": trainable,
        "score_s": scored - started,
        "optimise_s": done - scored,
        "trained_tokens_per_s": trained / (done - scored),
        "update_tokens_per_s": trained / (done - started),
        "achieved_gflops": 6 * params * trained / (done - scored) / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


_FLOAT32 = ["model.dtype=float32", "train.micro_batch_size=2"]  # btc_momentum as it was before `dtype: auto`
SHARING_MODES = {  # the first is the path before the compact prompt, the shared prefix and rollout log-probs
    "default": [*_FLOAT32, "env.prompt=full", "train.share_prefix=false", "train.old_logprobs=recompute"],
    "compact": [*_FLOAT32, "env.prompt=compact", "train.share_prefix=false", "train.old_logprobs=recompute"],
    "shared": [*_FLOAT32, "env.prompt=compact", "train.share_prefix=true", "train.old_logprobs=rollout"],
    "grouped": ["model.dtype=float32", "env.prompt=compact", "train.share_prefix=true", "train.old_logprobs=rollout",
                "train.minibatches=groups", "train.micro_batch_size=4"],
}
SHARING_MODES["bf16"] = [*SHARING_MODES["grouped"][1:], "model.dtype=bfloat16"]  # frozen weights in bfloat16 (not exact)
SHARING_SETUP = ["rollout.num_envs=16", "train.group_size=4", "env.episode_decisions=2", "model.lora.enabled=true"]


def sharing_trainer(mode: str, overrides: list[str]):
    """A trainer of `btc_momentum` in `mode`, with `overrides` on top; prints what the mode sets."""
    from r1trade.config import load_config
    from r1trade.env.trading_env import make_envs
    from r1trade.models.loading import load_agent_models
    from r1trade.rl.trainer import Trainer

    settings = [*SHARING_MODES[mode], *overrides]
    print(f"{mode}: {' '.join(settings)}")
    config = load_config("btc_momentum", [*SHARING_SETUP, *settings])
    torch.manual_seed(config.seed)
    models = load_agent_models(config.model, seed=config.seed)
    return Trainer(config, models, lambda n: make_envs(config, n, "train"), Path(f"/tmp/r1trade-bench-{mode}"))


def compare_shared_prefix(
    repeats: int, modes: list[str], extra: list[str], per_mode: dict[str, list[str]] | None = None
) -> None:
    """Whole updates of each mode, alternated; per phase seconds and tokens/s, then the speedup. `extra` overrides
    every mode's config, `per_mode[mode]` only that mode's (each mode's model warm-started on its own prompt)."""
    print(cpu_header())
    print(f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; btc_momentum, LoRA, "
          f"{' '.join(SHARING_SETUP[:3])}; {repeats} updates per mode, alternated")
    trainers = {mode: sharing_trainer(mode, [*extra, *(per_mode or {}).get(mode, [])]) for mode in modes}
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for round_ in range(repeats):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            trainer = trainers[mode]
            metrics = trainer.update()
            trainer.state.step += 1
            whole = metrics["rollout_seconds"] + metrics["score_seconds"] + metrics["update_seconds"]
            runs[mode].append({**metrics, "whole_seconds": whole})
            print(f"{mode:>8} update {len(runs[mode])}: rollout {metrics['rollout_seconds']:6.1f} s, "
                  f"score {metrics['score_seconds']:6.1f} s, optimise {metrics['update_seconds']:6.1f} s, "
                  f"whole {whole:6.1f} s | {metrics['scored_tokens']} tokens, {metrics['turns']:.1f} turns/episode, "
                  f"valid calls {metrics.get('valid_call_rate', 0.0):.0%}",
                  flush=True)
    print()
    print(f"{'mode':>8} | {'rollout s':>9} {'score s':>8} {'optimise s':>10} {'whole s':>8} | "
          f"{'rollout tok/s':>13} {'scored tok/s':>12} {'trained tok/s':>13} | tokens/row")
    means = {}
    for mode, rows in runs.items():
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in
                ("rollout_seconds", "score_seconds", "update_seconds", "whole_seconds", "scored_tokens",
                 "trained_tokens", "rollout_tokens_per_s")}
        segments = trainers[mode].config.rollout.num_envs
        means[mode] = mean
        print(f"{mode:>8} | {mean['rollout_seconds']:9.1f} {mean['score_seconds']:8.1f} "
              f"{mean['update_seconds']:10.1f} {mean['whole_seconds']:8.1f} | {mean['rollout_tokens_per_s']:13.1f} "
              f"{mean['scored_tokens'] / mean['score_seconds']:12.0f} "
              f"{mean['trained_tokens'] / mean['update_seconds']:13.0f} | {mean['scored_tokens'] / segments:.0f}")
    first, last = modes[0], modes[-1]
    spread = [r["whole_seconds"] for r in runs[first]], [r["whole_seconds"] for r in runs[last]]
    print(f"{first} whole-update seconds {', '.join(f'{x:.1f}' for x in spread[0])}; "
          f"{last}: {', '.join(f'{x:.1f}' for x in spread[1])}")
    print(f"speedup: {means[first]['whole_seconds'] / means[last]['whole_seconds']:.1f}x")


def profile_step(mode: str, extra: list[str]) -> None:
    """One rollout of `mode`, then one optimiser step on its first minibatch under torch's profiler: the step's
    seconds, the token positions it computed and the operators that took the time."""
    from torch.profiler import ProfilerActivity, profile

    from r1trade.models.prefix import common_prefix_length
    from r1trade.rl.advantages import compute_advantages
    from r1trade.rl.batch import collate

    print(cpu_header())
    trainer = sharing_trainer(mode, extra)
    config, models = trainer.config, trainer.models
    batch = collate(trainer.rollout(), pad_id=trainer.engine.pad_id)
    batch = compute_advantages(trainer.score(batch), config.train)
    rows = torch.arange(config.train.minibatch_size)  # the rollout's first group(s), side by side
    minibatch = batch.select(rows)
    positions = 0
    for start in range(0, len(rows), config.train.micro_batch_size):
        micro = minibatch.select(torch.arange(start, min(start + config.train.micro_batch_size, len(rows))))
        micro = trainer._through_last_action(micro)  # what the loss pass runs
        width = micro.input_ids.shape[1]
        shared = common_prefix_length(micro.input_ids, micro.attention_mask)
        positions += shared + micro.rows * (width - shared) if config.train.share_prefix else micro.rows * width
    trainer.step(minibatch)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        trainer.step(minibatch)
        seconds = time.perf_counter() - started
    print(f"{mode}: one optimiser step of {len(rows)} rows, {positions} token positions computed: {seconds:.2f} s")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    from r1trade.cpu.onednn import onednn_linear

    hidden, inner = models.policy.config.hidden_size, models.policy.config.intermediate_size
    for k, m in ((hidden, inner), (inner, hidden), (hidden, hidden)):  # the model's linear shapes, alone
        x, weight = torch.randn(positions, k), torch.randn(m, k)
        for _ in range(3):
            onednn_linear(x, weight)
        started = time.perf_counter()
        for _ in range(20):
            onednn_linear(x, weight)
        seconds = (time.perf_counter() - started) / 20
        print(f"oneDNN ({positions} x {k}) . ({k} x {m}): {seconds * 1e3:.2f} ms, "
              f"{2 * positions * k * m / seconds / 1e9:.0f} GFLOP/s")


def against_previous(config_name: str, overrides: list[str], repeats: int) -> None:
    """Whole updates of one config, the previous rollout engine against today's, alternated (AB BA ...)."""
    from previous_engine import PREVIOUS, previous_engine

    from r1trade.config import load_config
    from r1trade.env.trading_env import make_envs
    from r1trade.models.loading import load_agent_models
    from r1trade.rl.trainer import Trainer

    config = load_config(config_name, overrides)
    trainers = {}
    for name in ("previous", "today"):
        torch.manual_seed(config.seed)
        models = load_agent_models(config.model, seed=config.seed)
        trainers[name] = Trainer(config, models, lambda n: make_envs(config, n, "train"),
                                 Path(f"/tmp/r1trade-bench-{name}"))
    old = trainers["previous"]
    old.engine = previous_engine(old.models.policy, old.models.tokenizer, old.sampling)
    print(cpu_header())
    print(f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; {config_name} {' '.join(overrides)}; "
          f"previous = {PREVIOUS}; {repeats} updates each, alternated")
    seconds: dict[str, list[dict]] = {name: [] for name in trainers}
    for round_ in range(repeats):
        for name in ("previous", "today") if round_ % 2 == 0 else ("today", "previous"):
            trainer = trainers[name]
            metrics = trainer.update()
            trainer.state.step += 1
            phases = {k: metrics[f"{k}_seconds"] for k in ("rollout", "score", "update")}
            phases["whole"] = sum(phases.values())
            seconds[name].append(phases)
            print(f"{name:>8} update {round_ + 1}: " + ", ".join(f"{k} {v:5.2f} s" for k, v in phases.items())
                  + f" | return {metrics['episode_return']:+.3f}", flush=True)
    means = {name: {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} for name, rows in seconds.items()}
    for name, mean in means.items():
        print(f"{name:>8} mean: " + ", ".join(f"{k} {v:5.2f} s" for k, v in mean.items()))
    print(f"rollout speedup: {means['previous']['rollout'] / means['today']['rollout']:.2f}x")
    print(f"speedup: {means['previous']['whole'] / means['today']['whole']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--cpu-kernels", choices=["auto", "off"], default="auto",
                        help="model.cpu_kernels: off for torch's default BLAS and SDPA attention")
    parser.add_argument("--mode", choices=["lora", "full"], help=argparse.SUPPRESS)
    parser.add_argument("--compare-shared-prefix", action="store_true",
                        help="whole btc_momentum updates: default path vs compact prompt vs compact + shared prefix")
    parser.add_argument("--repeats", type=int, default=2, help="updates per mode with --compare-shared-prefix")
    parser.add_argument("--modes", default=",".join(SHARING_MODES),
                        help="with --compare-shared-prefix: which modes, in order")
    parser.add_argument("--profile-step", choices=list(SHARING_MODES),
                        help="profile one optimiser step of this mode's first minibatch after one rollout")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides (a.b=c)")
    parser.add_argument("--mode-set", action="append", default=[], metavar="MODE:a.b=c",
                        help="with --compare-shared-prefix: an override for one mode only (e.g. its model)")
    parser.add_argument("--against-previous", metavar="CONFIG",
                        help="whole updates of CONFIG with the previous rollout engine and today's, alternated")
    args = parser.parse_args()
    if args.against_previous:
        from r1trade.quiet import quiet_third_party

        quiet_third_party()
        against_previous(args.against_previous, args.set, args.repeats)
        return
    if args.profile_step:
        from r1trade.quiet import quiet_third_party

        quiet_third_party()
        profile_step(args.profile_step, args.set)
        return
    if args.compare_shared_prefix:
        from r1trade.quiet import quiet_third_party

        quiet_third_party()
        per_mode: dict[str, list[str]] = {}
        for item in args.mode_set:
            mode, _, override = item.partition(":")
            if mode not in SHARING_MODES or "=" not in override:
                parser.error(f"--mode-set {item!r}: expected MODE:a.b=c with MODE one of {', '.join(SHARING_MODES)}")
            per_mode.setdefault(mode, []).append(override)
        compare_shared_prefix(args.repeats, args.modes.split(","), args.set, per_mode)
        return
    if args.mode:
        print(json.dumps(one_mode(args.mode == "lora", args.rows, args.tokens, args.cpu_kernels)))
        return
    print(cpu_header())
    print(f"{torch.get_num_threads()} torch threads, python {platform.python_version()}, torch {torch.__version__}; "
          f"batch {args.rows} x {args.tokens} tokens; "
          f"CPU fast paths {args.cpu_kernels}")
    results = []
    for mode in ("lora", "full"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--rows", str(args.rows),
                              "--tokens", str(args.tokens), "--cpu-kernels", args.cpu_kernels],
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
