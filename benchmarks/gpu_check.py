"""The trainer on one CUDA GPU: the `cuda` tests, then each model shape through both training engines in bfloat16.

`make gpu-check` runs this. First the tests marked `cuda` (`tests/test_cuda.py`: the tiny model on the GPU in
bfloat16 without the CPU fast paths, a rollout and an update there, the same log-probs as on the CPU). Then, for each
shape of `r1trade.models.random_models` (SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-1.5B with random weights: nothing is
downloaded), a few updates on the planted-edge market of `configs/demo.yaml`, LoRA adapters on bfloat16 weights,
GRPO in groups of 4: by r1trade's own trainer (`train.engine: r1trade`) and by TRL's GRPOTrainer (`train.engine:
trl`, without vLLM), each through `r1trade.train.train_run` as `r1trade train` runs it. Last it prints a markdown
table for docs/benchmarks.md, headed by the GPU and the library versions:

- rollout tokens/s: the tokens the policy sampled over the seconds spent sampling them. r1trade: its whole rollouts
  (environment steps included), from `metrics.jsonl`; TRL: the time inside `generate`, timed here.
- s / update: the median wall time of one update (rollout, scoring, optimisation), from `metrics.jsonl`.
- of which sampling: the seconds of an update spent sampling: r1trade's median rollout, TRL's `generate` time
  over its updates. The rest is scoring and the optimiser's steps, which is where the time goes.
- peak GPU memory: `torch.cuda.max_memory_allocated` during the run, above what was allocated before it.

Then a second table: a decoding step of each shape at 16, 64 and 256 rows (`DECODE_ROWS`), in ms and in tokens/s
(rows over the step), by r1trade's engine (its fixed-shape step replayed as CUDA graphs, and the eager step of its
growing cache) and by transformers' `generate`, eager, on the same random prompts, as
`benchmarks/decode_step.py` measures them (`--decode-compiled` adds `generate` with a static cache and its step
compiled, CUDA graphs included, once per shape and row count: 6-90 s each on a 2-core CPU).

A random model's turns hold no valid tool call, so every episode samples all the tokens it may: r1trade plays its 3
turns of 32 tokens, TRL (which ends a completion at its first turn without a call) samples to its cap of 96 tokens.
Every run does the same work whatever its shape. Sized to finish in a few minutes on one H100. A run that fails is
reported in its row, with its traceback on stderr, and the check goes on; the exit code is 1 if a test or a run
failed. Without torch or a CUDA GPU it stops at once with a one-line error (exit 2).

It runs on the GPU machine's own Python, which has torch built with CUDA, with r1trade from `src` (`make gpu-check`
puts it on PYTHONPATH). Once CUDA is found it installs the wheels in `.whl/` (`make gpu-wheels`: what such a Python
may lack) into `/tmp/site`, without an index, and puts that on the path for itself and the tests.
Run: `python benchmarks/gpu_check.py [--models ...] [--engines ...] [--updates 3] [--no-tests] [--decode-compiled]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
SITE = Path("/tmp/site")
SIZES = ("random:smollm2-135m", "random:qwen2.5-0.5b", "random:qwen2.5-1.5b")
"""The model shapes measured (`r1trade.models.random_models.RANDOM_MODELS`)."""
QUICK_MODEL = "tiny-random-qwen"
"""The built-in 2-layer model, to check the whole script quickly (`--models tiny-random-qwen`)."""
ENGINES = ("r1trade", "trl")
BASE_CONFIG = "demo"
RUN_SETTINGS = (
    "model.dtype=bfloat16", "model.lora.enabled=true",  # float32 adapters on frozen bfloat16 weights
    "train.algorithm=grpo", "train.gamma=1.0", "train.group_size=4",  # what both engines run (demo's gamma: 0)
    "rollout.num_envs=16", "rollout.max_new_tokens=32", "env.episode_decisions=1",
    "train.epochs=1", "train.minibatch_size=8", "train.micro_batch_size=8",
)
"""The settings of every run, on top of `BASE_CONFIG`."""
GIB = 1024**3
DECODE_ROWS = (16, 64, 256)
DECODE_PROMPT = 256
"""Prompt tokens a row in the decoding table: about a first turn's context."""
DECODE_NEW = 64


class CheckError(Exception):
    """What stops the check before it measures anything: one line, exit 2."""


@dataclass(frozen=True)
class Measurement:
    """One run's figures, or why it has none."""

    model: str
    engine: str
    rollout_tokens_per_s: float | None = None
    seconds_per_update: float | None = None
    sampling_seconds_per_update: float | None = None
    peak_memory_gib: float | None = None
    failure: str | None = None


@dataclass(frozen=True)
class DecodeMeasurement:
    """One shape's decoding step at one row count: ms a step by each decoder that ran, or why there is none."""

    model: str
    rows: int
    ms_per_step: dict[str, float]
    failure: str | None = None


@dataclass
class GenerationTally:
    """Tokens sampled by `generate` and the seconds spent in it."""

    tokens: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------- what a run's records say


def native_figures(records: Sequence[dict]) -> tuple[float, float, float]:
    """r1trade's rollout tokens/s over all updates, median seconds per update and median rollout seconds, from its
    `metrics.jsonl`."""
    tokens = sum(r["rollout_tokens_per_s"] * r["rollout_seconds"] for r in records)
    rollout_seconds = sum(r["rollout_seconds"] for r in records)
    whole = [r["rollout_seconds"] + r["score_seconds"] + r["update_seconds"] for r in records]
    return tokens / rollout_seconds, statistics.median(whole), statistics.median(r["rollout_seconds"] for r in records)


def trl_figures(records: Sequence[dict], tally: GenerationTally) -> tuple[float, float, float]:
    """TRL's rollout tokens/s (timed `generate` calls), median seconds per update (its `metrics.jsonl`) and mean
    `generate` seconds per update."""
    return (tally.tokens / tally.seconds, statistics.median(r["update_seconds"] for r in records),
            tally.seconds / len(records))


def read_records(run_dir: Path, updates: int) -> list[dict]:
    """The run's per-update records; a run that logged fewer than `updates` of them failed."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    if len(records) != updates:
        raise RuntimeError(f"{run_dir} logged {len(records)} of {updates} updates")
    return records


# --------------------------------------------------------------------------- the table


def markdown_table(measurements: Sequence[Measurement], *, header: str, settings: str) -> str:
    """The measurements as a markdown table under a line naming the machine and one saying what ran."""
    lines = [f"**{header}**", "", settings, "",
             "| model | engine | rollout tokens/s | s / update | of which sampling | peak GPU memory |",
             "|---|---|---:|---:|---:|---:|"]
    for m in measurements:
        if m.failure is not None:
            lines.append(f"| `{m.model}` | {m.engine} | failed: {m.failure.replace('|', '/')} | | | |")
        else:
            lines.append(f"| `{m.model}` | {m.engine} | {m.rollout_tokens_per_s:,.0f} | {m.seconds_per_update:.2f} "
                         f"| {m.sampling_seconds_per_update:.2f} | {m.peak_memory_gib:.2f} GiB |")
    return "\n".join(lines)


def decode_table(measurements: Sequence[DecodeMeasurement], decoders: Sequence[str]) -> str:
    """The decoding steps as a markdown table: each decoder's ms a step and tokens/s, and r1trade's speed-up over
    eager `generate`."""
    header = " | ".join(f"{name}: ms a step | tokens/s" for name in decoders)
    lines = [f"Decoding step: {DECODE_PROMPT} random prompt tokens a row, {DECODE_NEW} greedy tokens.", "",
             f"| model | rows | {header} | r1trade / generate |", "|---|---:|" + "---:|---:|" * len(decoders) + "---:|"]
    for m in measurements:
        if m.failure is not None:
            lines.append(f"| `{m.model}` | {m.rows} | failed: {m.failure.replace('|', '/')} |" + " |" * (
                2 * len(decoders)))
            continue
        cells = " | ".join(f"{m.ms_per_step[name]:.2f} | {1000 * m.rows / m.ms_per_step[name]:,.0f}" for name in decoders)
        lines.append(f"| `{m.model}` | {m.rows} | {cells} | "
                     f"{m.ms_per_step['generate'] / m.ms_per_step['r1trade']:.2f}x |")
    return "\n".join(lines)


def settings_line(updates: int) -> str:
    """What every run of the table did, in words."""
    return (f"`{BASE_CONFIG}` (planted edge) with `{' '.join(RUN_SETTINGS)}`, {updates} update(s) per run. Random "
            "weights: no turn holds a valid call, so r1trade plays each episode's 3 turns of 32 tokens and TRL "
            "samples each completion to its cap of 96 tokens.")


def machine_header() -> str:
    """The GPU, and the versions of torch, CUDA, transformers, TRL and peft."""
    from importlib.metadata import version

    import torch

    libraries = ", ".join(f"{name} {version(name)}" for name in ("transformers", "trl", "peft"))
    return f"{torch.cuda.get_device_name()}: torch {torch.__version__} (CUDA {torch.version.cuda}), {libraries}"


# --------------------------------------------------------------------------- running


def require_cuda() -> None:
    """Stop with one line unless torch imports and sees a CUDA GPU."""
    try:
        import torch
    except ImportError as exc:
        raise CheckError(f"gpu-check needs torch built with CUDA: {exc}") from None
    if not torch.cuda.is_available():
        raise CheckError(f"gpu-check needs a CUDA GPU: torch {torch.__version__} sees none "
                         "(torch.cuda.is_available() is False)")


def install_wheels(wheels: Path, site: Path) -> None:
    """Install the wheels in `wheels` into `site`, offline and without their dependencies (each is named), and put
    `site` first on the path of this process and of the commands it starts; nothing to do without wheels."""
    found = sorted(str(wheel) for wheel in wheels.glob("*.whl"))
    if not found:
        return
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(site), *found]
    if subprocess.run(command, check=False).returncode != 0:
        raise CheckError(f"pip could not install the wheels of {wheels} into {site} (its message is above)")
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def require_r1trade() -> None:
    """Stop with one line unless r1trade and both training engines import."""
    try:
        import r1trade.integrations.trl.engine  # noqa: F401
        import r1trade.train  # noqa: F401
    except ImportError as exc:
        raise CheckError(f"gpu-check cannot import r1trade: {exc} (run it with src on PYTHONPATH, as `make gpu-check`"
                         " does, and with .whl/ from `make gpu-wheels` beside it)") from None


def run_cuda_tests() -> int:
    """pytest on the tests marked `cuda`; its exit code."""
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "tests/test_cuda.py"]
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def warm_up() -> None:
    """Create the CUDA context and the cuBLAS handle before the first run, whose figures would include them."""
    import torch

    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (x @ x).sum().item()


@contextmanager
def timed_generation() -> Iterator[GenerationTally]:
    """Time every transformers `generate` call (how TRL samples) and count the tokens it sampled: the new columns
    that are not padding."""
    import torch
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate
    tally = GenerationTally()

    def generate(model, *args, **kwargs):
        prompt = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        started = time.perf_counter()
        out = original(model, *args, **kwargs)
        torch.cuda.synchronize()
        tally.seconds += time.perf_counter() - started
        new = getattr(out, "sequences", out)[:, prompt.shape[1] :]
        tally.tokens += int((new != model.generation_config.pad_token_id).sum())
        return out

    GenerationMixin.generate = generate
    try:
        yield tally
    finally:
        GenerationMixin.generate = original


def run_config(model: str, engine: str, updates: int, output_dir: Path):
    """The config of one run: `BASE_CONFIG` with `RUN_SETTINGS`, this model and engine, one checkpoint at the end."""
    from r1trade.config import load_config

    return load_config(BASE_CONFIG, [
        *RUN_SETTINGS, f"model.name_or_path={model}", f"train.engine={engine}", f"train.updates={updates}",
        f"train.checkpoint_every={updates}", f"name={model.replace(':', '-')}-{engine}", f"output_dir={output_dir}",
    ])


def measure(model: str, engine: str, updates: int, output_dir: Path) -> Measurement:
    """Train `updates` updates of `model` with `engine` as `r1trade train` does, and read the figures."""
    import torch
    from rich.console import Console

    from r1trade.train import train_run

    config = run_config(model, engine, updates, output_dir)
    run_dir = output_dir / config.name
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with timed_generation() as tally:  # how TRL samples; r1trade's engine decodes by itself and logs its own rate
        train_run(config, run_dir, force=True, console=Console(quiet=True))  # (a model named twice runs twice)
    peak = (torch.cuda.max_memory_allocated() - before) / GIB
    records = read_records(run_dir, updates)
    rate, per_update, sampling = native_figures(records) if engine == "r1trade" else trl_figures(records, tally)
    return Measurement(model, engine, rate, per_update, sampling, peak)


def measure_all(models: Sequence[str], engines: Sequence[str], updates: int) -> list[Measurement]:
    """Every model with every engine; a failed run is kept as its first line (its traceback goes to stderr)."""
    from r1trade.safe_load import first_line

    measurements = []
    with tempfile.TemporaryDirectory(prefix="r1trade-gpu-check-") as output_dir:
        for model in models:
            for engine in engines:
                started = time.perf_counter()
                try:
                    measurement = measure(model, engine, updates, Path(output_dir))
                except Exception as exc:  # noqa: BLE001 - one failed run must not cost the others
                    traceback.print_exc()
                    measurement = Measurement(model, engine, failure=first_line(exc))
                status = "failed" if measurement.failure else "done"
                print(f"{model} {engine}: {status} in {time.perf_counter() - started:.0f} s", file=sys.stderr,
                      flush=True)
                measurements.append(measurement)
    return measurements


def measure_decoding(model: str, rows: Sequence[int], *, compiled: bool, device: str = "cuda",
                     prompt: int = DECODE_PROMPT, new: int = DECODE_NEW, repeats: int = 2) -> list[DecodeMeasurement]:
    """A decoding step of `model` (loaded as the training runs load it) at each row count, by r1trade's engine and
    by eager `generate` (and compiled, with `compiled`); a row count that fails is kept as its first line."""
    import torch

    from decode_step import engine_decoder, hf_decoder, step_seconds
    from r1trade.models.loading import load_agent_models
    from r1trade.safe_load import first_line

    with tempfile.TemporaryDirectory(prefix="r1trade-gpu-check-") as output_dir:
        config = run_config(model, "r1trade", 1, Path(output_dir))
    try:
        models = load_agent_models(config.model, seed=0)
        policy = models.policy.to(device)
    except Exception as exc:  # noqa: BLE001 - one shape that fails must not cost the others
        traceback.print_exc()
        return [DecodeMeasurement(model, count, {}, failure=first_line(exc)) for count in rows]
    decoders = {"r1trade": engine_decoder(policy, models.tokenizer),
                "r1trade, eager step": engine_decoder(policy, models.tokenizer, fixed_step=False),
                "generate": hf_decoder(policy, compiled=False)}
    if compiled:
        decoders["generate, compiled"] = hf_decoder(policy, compiled=True)
    measurements = []
    for count in rows:
        ids = torch.randint(3, len(models.tokenizer), (count, prompt), generator=torch.Generator().manual_seed(0))
        try:
            seconds = step_seconds(decoders, ids.to(device), new, repeats)
        except Exception as exc:  # noqa: BLE001 - one failed row count must not cost the others
            traceback.print_exc()
            measurements.append(DecodeMeasurement(model, count, {}, failure=first_line(exc)))
            continue
        measurements.append(DecodeMeasurement(model, count, {
            name: 1000 * statistics.mean(values) for name, values in seconds.items()}))
    return measurements


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=(*SIZES, QUICK_MODEL), default=list(SIZES))
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--updates", type=int, default=3, help="updates per run (default 3)")
    parser.add_argument("--no-tests", action="store_true", help="skip the tests marked cuda")
    parser.add_argument("--decode-compiled", action="store_true",
                        help="time generate with a static cache and the step compiled too (slow to compile)")
    args = parser.parse_args(argv)
    if args.updates < 1:
        parser.error("--updates must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model is built in code: never reach for the network
    try:
        require_cuda()
        install_wheels(WHEELS, SITE)
        require_r1trade()
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from r1trade.quiet import quiet_third_party

    quiet_third_party()
    tests = 0 if args.no_tests else run_cuda_tests()
    warm_up()
    measurements = measure_all(args.models, args.engines, args.updates)
    decoding = [m for model in args.models for m in measure_decoding(model, DECODE_ROWS, compiled=args.decode_compiled)]
    print()
    print(markdown_table(measurements, header=machine_header(), settings=settings_line(args.updates)))
    print()
    decoders = ["r1trade", "r1trade, eager step", "generate"]
    decoders += ["generate, compiled"] if args.decode_compiled else []
    print(decode_table(decoding, decoders))
    print(f"\ngpu-check: {'tests passed' if tests == 0 else f'tests failed (pytest exit {tests})'}, "
          f"{sum(m.failure is None for m in measurements)} of {len(measurements)} runs measured, "
          f"{time.perf_counter() - started:.0f} s")
    failed = any(m.failure is not None for m in [*measurements, *decoding])
    return 0 if tests == 0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
