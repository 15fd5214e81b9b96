"""Multi-process training with torch.distributed: launched by `torchrun`, DistributedDataParallel on top.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them everything runs as a single process.
Backends: gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on some rank (e.g. a non-finite loss)."""
        if not self.enabled:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=_reduce_device())
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def mean(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=_reduce_device())
        dist.all_reduce(tensor)
        return float(tensor.item()) / self.world_size


def _reduce_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def init_distributed(device: torch.device) -> Distributed:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank)


def shutdown(info: Distributed) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def rank_slice(global_batch_size: int, info: Distributed) -> slice:
    """The rows of the global batch this rank trains on: disjoint across ranks, together the whole batch."""
    if global_batch_size % info.world_size:
        raise ValueError(f"run.batch_size={global_batch_size} is not divisible by the {info.world_size} processes")
    per_rank = global_batch_size // info.world_size
    return slice(info.rank * per_rank, (info.rank + 1) * per_rank)
