"""Run by tests/test_rl_distributed.py under torchrun: data-parallel training of the tiny model to `UPDATES`
updates (resuming from the run directory's newest checkpoint if it has one), then print a hash of the weights per
rank and save rank 0's weights to `RUN_DIR/final-weights.pt`.

Usage: distributed_worker.py RUN_DIR UPDATES"""

import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_rl_trainer import make_config, make_trainer

run_dir, updates = Path(sys.argv[1]), int(sys.argv[2])
trainer = make_trainer(make_config(updates=updates, minibatch_size=2, checkpoint_every=1), run_dir)
trainer.config.rollout.num_envs = 2 + trainer.distributed.process_index  # ranks hold different row counts
trainer.resume()
trainer.train()
parameters = [*trainer.models.policy.parameters(), *trainer.models.critic.parameters()]
weights = torch.cat([p.detach().reshape(-1) for p in parameters])
rank, world = trainer.distributed.process_index, trainer.distributed.num_processes
print(f"rank {rank}/{world} {hashlib.sha256(weights.numpy().tobytes()).hexdigest()}")
if rank == 0:
    torch.save(weights, run_dir / "final-weights.pt")
