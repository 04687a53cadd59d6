"""Rollouts: the agent loop that plays multi-turn episodes as token ids with a mask bit per token, the generation
backends it is handed, and a viewer that prints a trajectory with its masked tokens marked."""
