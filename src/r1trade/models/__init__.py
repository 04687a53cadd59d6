"""The agent's models: loading (transformers, GGUF, LoRA, critic), random test models, tokenizers, chat rendering
from token ids, and scoring (log-probs, values and entropies of given tokens)."""
