"""A decoding step: r1trade's rollout engine against transformers' `generate`, eager and compiled.

transformers' recipe for fast decoding (its "LLM optimizations" guide: a static KV cache and the decoding forward
compiled once by `torch.compile`) runs through `model.generate`, on the CPU too, beside the same `generate` eager
with the dynamic cache and beside r1trade's engine (`TransformersBackend`), on the CPU with its fast paths off and
on (`model.cpu_kernels`). Every variant decodes the same rows greedily: `--rows` prompts of `--prompt` random token
ids, `--new` tokens each (a model with random weights rarely ends a turn by itself; its tokens are counted).
A step's time is the wall time from the first decoding step to the turn's end, the results read back, over the
decoding steps (a logits processor clocks `generate`'s steps, a wrapper the engine's one-column model calls), so
the prompt's prefill is not counted; compiling happens in a warm-up and is timed apart. Each variant runs
`--repeats` times, the variants alternating. `make gpu-check` measures the same way on a GPU (`gpu_check.py`).

Both models take the dtype `model.dtype` resolves to with the fast paths on (bfloat16 frozen weights for LoRA on a
CPU with AMX or AVX-512 BF16). Run: `python benchmarks/decode_step.py` (SmolLM2-135M-Instruct as
`configs/tool_gated.yaml` loads it), or `--set model.name_or_path=random:smollm2-135m` (its shape, random weights).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from transformers import CompileConfig, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from r1trade.rollout.backend import Prompt, SamplingConfig
from r1trade.rollout.build import transformers_engine


@dataclass(frozen=True)
class Decoded:
    """One call's decoding: the tokens generated, and the decoding steps and the seconds they took."""

    tokens: int
    steps: int
    seconds: float


Decoder = Callable[[torch.Tensor, int], Decoded]
"""Decodes `new` tokens greedily after each row of a (rows, prompt) id tensor."""


def _synced_now(device: torch.device) -> float:
    """The time once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def hf_decoder(model: PreTrainedModel, *, compiled: bool) -> Decoder:
    """`model.generate`, eager with the dynamic cache, or with a static cache and the forward compiled (transformers
    compiles only on accelerators unless told to on every device). A logits processor clocks each step: its first
    call follows the prefill, and `new - 1` decoding steps follow it."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.pad_token_id = False, config.pad_token_id or 0
    if compiled:
        config.cache_implementation = "static"
        config.compile_config = CompileConfig(fullgraph=True, dynamic=False)
        config.compile_config._compile_all_devices = True
    else:
        config.disable_compile = True

    def decode(ids: torch.Tensor, new: int) -> Decoded:
        clock: list[float] = []

        def clocked(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            clock.append(time.perf_counter())
            return scores

        config.max_new_tokens = config.min_new_tokens = new
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                             logits_processor=LogitsProcessorList([clocked]))
        end = _synced_now(ids.device)
        return Decoded(int(out[:, ids.shape[1]:].ne(config.pad_token_id).sum()), len(clock) - 1, end - clock[0])

    return decode


def engine_decoder(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *,
                   fixed_step: bool | None = None) -> Decoder:
    """r1trade's rollout backend: one turn of every row, greedy (`fixed_step` as `TransformersBackend` takes it:
    by default the fixed-shape step, captured as CUDA graphs, on CUDA). Its draws are clocked as `generate`'s
    logits processor clocks it: the first follows the prefill, and each later one a decoding step."""

    def decode(ids: torch.Tensor, new: int) -> Decoded:
        sampling = SamplingConfig(max_new_tokens=new, greedy=True, compact_below=0.0)
        backend = transformers_engine(model, tokenizer, sampling, fixed_step=fixed_step).backend
        sample, clock = backend._sample, []

        def clocked(logits: torch.Tensor, generator: torch.Generator | None):
            clock.append(time.perf_counter())
            return sample(logits, generator)

        backend._sample = clocked
        prompts = [Prompt(key=row, token_ids=ids[row].tolist(), fresh=True) for row in range(ids.shape[0])]
        with backend.session():
            turns = backend.generate(prompts, None)  # reads its tokens back: the device is done
        end = time.perf_counter()
        return Decoded(sum(len(turn.token_ids) for turn in turns), len(clock) - 1, end - clock[0])

    return decode


def step_seconds(decoders: Mapping[str, Decoder], ids: torch.Tensor, new: int, repeats: int) -> dict[str, list[float]]:
    """Seconds a decoding step of each decoder, once per repeat, after one warm-up call each (kernels built, the
    static-cache step compiled: its seconds are printed); the decoders alternate (AB BA ...) so a drifting
    machine load hits them alike."""
    seconds: dict[str, list[float]] = {name: [] for name in decoders}
    with torch.no_grad():
        for name, decode in decoders.items():
            started = time.perf_counter()
            decode(ids, new)
            print(f"  warm-up {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        for repeat in range(repeats):
            for name in list(decoders) if repeat % 2 == 0 else list(decoders)[::-1]:
                decoded = decoders[name](ids, new)
                seconds[name].append(decoded.seconds / decoded.steps)
    return seconds


def main() -> None:
    from r1trade.config import load_config
    from r1trade.models.loading import load_agent_models, model_dtype
    from r1trade.runtime import cpu_header

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tool_gated")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 48])
    parser.add_argument("--prompt", type=int, default=500, help="prompt tokens a row")
    parser.add_argument("--new", type=int, default=32, help="tokens decoded a row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(cpu_header(), flush=True)

    # both in the dtype the fast paths resolve (with them off, `model.dtype: auto` would fall back to float32)
    dtype = str(model_dtype(load_config(args.config, args.set).model)).removeprefix("torch.")

    def models(kernels: str):
        overrides = [*args.set, f"model.cpu_kernels={kernels}", f"model.dtype={dtype}"]
        return load_agent_models(load_config(args.config, overrides).model, seed=0)

    plain, fast = models("off"), models("auto")
    print(f"model: {plain.config.name_or_path}, {dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    decoders = {
        "generate, eager, dynamic cache": hf_decoder(plain.policy, compiled=False),
        "generate, static cache, compiled": hf_decoder(plain.policy, compiled=True),
        "r1trade engine, fast paths off": engine_decoder(plain.policy, plain.tokenizer),
        "r1trade engine, fixed-shape step": engine_decoder(plain.policy, plain.tokenizer, fixed_step=True),
        "r1trade engine, fast paths on": engine_decoder(fast.policy, fast.tokenizer),
    }
    for rows in args.rows:
        ids = torch.randint(3, len(plain.tokenizer), (rows, args.prompt), generator=torch.Generator().manual_seed(0))
        seconds = step_seconds(decoders, ids, args.new, args.repeats)
        eager = statistics.mean(seconds["generate, eager, dynamic cache"])
        print(f"{rows} rows, {args.prompt} prompt tokens, {args.new} new a row, {args.repeats} repeats:")
        for name, values in seconds.items():
            step = statistics.mean(values)
            print(f"  {name:>34}: {1000 * step:6.1f} ms a step ({1000 * min(values):.1f}-{1000 * max(values):.1f}), "
                  f"{eager / step:4.2f}x eager generate", flush=True)


if __name__ == "__main__":
    main()
