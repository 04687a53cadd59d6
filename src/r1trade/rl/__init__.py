"""Reinforcement learning: masks, advantage estimators, PPO losses and the trainer."""
