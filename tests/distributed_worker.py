"""Run by tests/test_rl_distributed.py under torchrun: one data-parallel update, then print a hash of the weights."""

import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_rl_trainer import make_config, make_trainer  # noqa: E402

trainer = make_trainer(make_config(updates=1, **{"minibatch_size": 2}), Path(sys.argv[1]))
trainer.config.rollout.num_envs = 2 + trainer.accelerator.process_index  # ranks hold different row counts
trainer.train()
weights = torch.cat([p.detach().reshape(-1) for p in trainer.models.policy.parameters()]).numpy().tobytes()
print(f"rank {trainer.accelerator.process_index}/{trainer.accelerator.num_processes} {hashlib.sha256(weights).hexdigest()}")
