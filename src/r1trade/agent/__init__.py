"""The agent: language models (policy, critic, reference, tokenizer) and the multi-turn rollout engine."""
