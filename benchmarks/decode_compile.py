"""A decoding step on this CPU: transformers' compiled fast path against its eager one and against r1trade's engine.

transformers' recipe for fast decoding (its "LLM optimizations" guide: a static KV cache and the forward compiled
once by `torch.compile`) is run through `model.generate`, on the CPU too, beside the same `generate` eager with the
dynamic cache and beside r1trade's rollout engine (`TransformersBackend`) with the CPU fast paths off and on
(`model.cpu_kernels`). Every variant decodes the same rows greedily: `--rows` prompts of `--prompt` random token ids,
`--new` tokens each (a model with random weights rarely ends a turn by itself, and a row that does is counted).
Each decoding step is clocked (a logits processor in `generate`, the engine's model calls of one new column), so
the prompt's prefill is not counted; compiling happens in a warm-up and is timed apart. Each variant runs
`--repeats` times, the variants alternating; the median step and its quartiles are printed.

Run: `python benchmarks/decode_compile.py --config tool_gated --set model.name_or_path=random:smollm2-135m
--set model.dtype=bfloat16` (SmolLM2-135M's shape, random weights, its rollouts' dtype on a CPU with AMX).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from transformers import CompileConfig, LogitsProcessorList, PreTrainedModel

from r1trade.config import load_config
from r1trade.models.loading import load_agent_models
from r1trade.rollout.backend import Prompt, SamplingConfig
from r1trade.rollout.build import transformers_engine
from r1trade.runtime import cpu_header

Decoder = Callable[[torch.Tensor, int], tuple[int, list[float]]]
"""Decodes `new` tokens greedily after each row of a (rows, prompt) id tensor; returns the tokens generated and the
seconds between consecutive decoding steps (the prefill before the first step is not among them)."""


def intervals(clock: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(clock, clock[1:])]


def hf_decoder(model: PreTrainedModel, *, compiled: bool) -> Decoder:
    """`model.generate`, eager with the dynamic cache, or with a static cache and the forward compiled (transformers
    compiles only on accelerators unless told to on every device). A logits processor clocks each step."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.pad_token_id = False, config.pad_token_id or 0
    if compiled:
        config.cache_implementation = "static"
        config.compile_config = CompileConfig(fullgraph=True, dynamic=False)
        config.compile_config._compile_all_devices = True
    else:
        config.disable_compile = True

    def decode(ids: torch.Tensor, new: int) -> tuple[int, list[float]]:
        clock: list[float] = []

        def clocked(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            clock.append(time.perf_counter())
            return scores

        config.max_new_tokens = config.min_new_tokens = new
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                             logits_processor=LogitsProcessorList([clocked]))
        return int(out[:, ids.shape[1]:].ne(config.pad_token_id).sum()), intervals(clock)

    return decode


def engine_decoder(model: PreTrainedModel, tokenizer) -> Decoder:
    """r1trade's rollout backend: one turn of every row, greedy; its model calls of one new column are clocked."""

    def decode(ids: torch.Tensor, new: int) -> tuple[int, list[float]]:
        sampling = SamplingConfig(max_new_tokens=new, greedy=True, compact_below=0.0)
        backend = transformers_engine(model, tokenizer, sampling).backend
        forward, clock = backend._forward, []

        def clocked(cache, new_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
            if new_ids.shape[1] == 1:
                clock.append(time.perf_counter())
            return forward(cache, new_ids, attention)

        backend._forward = clocked
        prompts = [Prompt(key=row, token_ids=ids[row].tolist(), fresh=True) for row in range(ids.shape[0])]
        with backend.session():
            turns = backend.generate(prompts, None)
        return sum(len(turn.token_ids) for turn in turns), intervals(clock)

    return decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tool_gated")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 48])
    parser.add_argument("--prompt", type=int, default=600, help="prompt tokens a row")
    parser.add_argument("--new", type=int, default=48, help="tokens decoded a row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(cpu_header(), flush=True)

    def models(kernels: str):
        config = load_config(args.config, overrides=[*args.set, f"model.cpu_kernels={kernels}"])
        return load_agent_models(config.model, seed=0)

    plain, fast = models("off"), models("auto")
    dtype = next(plain.policy.parameters()).dtype
    print(f"model: {plain.config.name_or_path}, {dtype}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    decoders = {
        "generate, eager, dynamic cache": hf_decoder(plain.policy, compiled=False),
        "generate, static cache, compiled": hf_decoder(plain.policy, compiled=True),
        "r1trade engine, fast paths off": engine_decoder(plain.policy, plain.tokenizer),
        "r1trade engine, fast paths on": engine_decoder(fast.policy, fast.tokenizer),
    }
    vocab = len(plain.tokenizer)
    for rows in args.rows:
        ids = torch.randint(3, vocab, (rows, args.prompt), generator=torch.Generator().manual_seed(rows))
        steps: dict[str, list[float]] = defaultdict(list)
        tokens: dict[str, int] = {}
        with torch.no_grad():
            for name, decode in decoders.items():  # warm-up: kernels built, the static-cache step compiled
                started = time.perf_counter()
                decode(ids, args.new)
                print(f"  warm-up {name}: {time.perf_counter() - started:.1f} s", flush=True)
            for repeat in range(args.repeats):
                for name in list(decoders) if repeat % 2 == 0 else list(decoders)[::-1]:
                    tokens[name], seconds = decoders[name](ids, args.new)
                    steps[name] += seconds
        eager = statistics.median(steps["generate, eager, dynamic cache"])
        print(f"{rows} rows, {args.prompt} prompt tokens, {args.new} new a row, median of "
              f"{args.repeats} x {args.new - 1} steps:")
        for name in decoders:
            step = statistics.median(steps[name])
            quartiles = statistics.quantiles(steps[name], n=4)
            print(f"  {name:>34}: {1000 * step:6.1f} ms a step (quartiles {1000 * quartiles[0]:.1f}-"
                  f"{1000 * quartiles[2]:.1f}), {eager / step:4.2f}x eager generate ({tokens[name]} tokens)",
                  flush=True)


if __name__ == "__main__":
    main()
