"""Data parallelism under `accelerate launch`: every process plays its own episodes, gradients are averaged.

`Distributed` is all the trainer knows of the other processes: this process's index and device, reductions over
all processes, and the backward pass and optimiser step. The gradients are averaged by r1trade itself, or by
DeepSpeed ZeRO stage 1 or 2 (`--use_deepspeed`), which also shards the optimiser state. On one CPU it is a plain
single process and every reduction returns its input.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, parse_flag_from_env

from r1trade.config import TrainConfig
from r1trade.errors import UsageError

REDUCTIONS = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "mean": dist.ReduceOp.SUM}


class Distributed:
    """This process among the training processes; `deepspeed` is the DeepSpeed engine once `prepare` made one."""

    def __init__(self) -> None:
        self.accelerator = _accelerator()
        self.deepspeed: Any = None

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def process_index(self) -> int:
        return self.accelerator.process_index

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def prepare(
        self, policy: torch.nn.Module, critic: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
    ) -> None:
        """Hand the trainable modules and their optimiser to DeepSpeed when launched with `--use_deepspeed`.

        r1trade keeps its own loop and sets the micro-batch size, the clipping and the accumulation (the micro-batches
        of a full minibatch; shorter minibatches are padded with zero gradients) from `train.*`. The rollout and the
        scoring pass call the policy directly, which needs every process to hold whole weights: ZeRO stages 1 and 2
        (optimiser state, and gradients, sharded), not 3; stage 0 is the data parallelism r1trade does without it.
        """
        if self.accelerator.distributed_type != DistributedType.DEEPSPEED:
            return
        ds_config = self.accelerator.state.deepspeed_plugin.deepspeed_config
        stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
        if stage not in (1, 2):
            raise UsageError(f"DeepSpeed ZeRO stage {stage} is not supported: use stage 1 or 2 (--zero_stage)")
        ds_config.update(
            train_micro_batch_size_per_gpu=cfg.micro_batch_size,
            gradient_accumulation_steps=math.ceil(cfg.minibatch_size / cfg.micro_batch_size),
            gradient_clipping=cfg.max_grad_norm,
        )
        ds_config.pop("train_batch_size", None)
        modules = torch.nn.ModuleDict({"policy": policy})
        if critic is not None:
            modules["critic"] = critic
        self.deepspeed, _ = self.accelerator.prepare(modules, optimizer)

    def reduce(self, tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        """Elementwise max, min or mean of `tensor` over all processes (itself in a single process).

        torch.distributed directly: accelerate's gather assumes GPU collectives under DeepSpeed, gloo has none."""
        if self.num_processes == 1:
            return tensor
        tensor = tensor.to(self.device).clone()
        dist.all_reduce(tensor, op=REDUCTIONS[reduction])
        return tensor / self.num_processes if reduction == "mean" else tensor

    def mean_metrics(self, metrics: dict) -> dict:
        """`metrics` with every number averaged over all processes (what the main process logs)."""
        if self.num_processes == 1:
            return metrics
        return {
            key: float(self.reduce(torch.tensor([float(value)]), "mean"))
            if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            for key, value in metrics.items()
        }

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        if self.deepspeed is None:  # DeepSpeed clears its gradients after every step itself
            optimizer.zero_grad(set_to_none=True)

    def padding_micro_batches(self, micro_batches: int) -> int:
        """Micro-batches of zero weight that make up a short minibatch. Under DeepSpeed every process runs the same
        number (the optimiser steps after a fixed number, and ZeRO-2 reduces gradients during each backward)."""
        return self.deepspeed.gradient_accumulation_steps() - micro_batches if self.deepspeed else 0

    def backward(self, loss: torch.Tensor) -> None:
        if self.deepspeed is not None:
            self.deepspeed.backward(loss, scale_wrt_gas=False)  # the micro-batch weights already sum to one
            self.deepspeed.step()  # the optimiser steps at the accumulation boundary only
        else:
            loss.backward()

    def apply_gradients(self, optimizer: torch.optim.Optimizer, loss: float, max_grad_norm: float) -> tuple[float, bool]:
        """Average the gradients across processes, clip them and step the optimiser unless the loss or the
        gradient is non-finite on any process; returns the gradient norm before clipping and whether it stepped."""
        if self.deepspeed is not None:
            # DeepSpeed has averaged, clipped (`gradient_clipping`) and stepped, or skipped a non-finite gradient.
            grad_norm = float(self.deepspeed.get_global_grad_norm())
            return grad_norm, math.isfinite(grad_norm)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._average_gradients(params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        finite = torch.tensor([float(math.isfinite(loss) and math.isfinite(grad_norm))])
        if float(self.reduce(finite, "min")) < 1:  # skip on every process alike
            optimizer.zero_grad(set_to_none=True)
            return grad_norm, False
        optimizer.step()
        return grad_norm, True

    def _average_gradients(self, params: list[torch.Tensor]) -> None:
        """Mean of every gradient across processes (a no-op in a single process)."""
        if self.num_processes == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat = self.reduce(flat, "mean")
        for p, piece in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(piece.view_as(p))


def _accelerator() -> Accelerator:
    """This process's Accelerator. Launched for DeepSpeed on a machine without GPUs, accelerate picks no collective
    backend and would report a single process; DeepSpeed on CPU communicates over gloo, so ask for it."""
    if parse_flag_from_env("ACCELERATE_USE_DEEPSPEED") and "LOCAL_RANK" in os.environ and not torch.cuda.is_available():
        PartialState(backend="gloo")
    return Accelerator()
