"""Reinforcement learning: masks, advantage estimators, losses, batches, the trainer, its data parallelism and
its checkpoints."""
