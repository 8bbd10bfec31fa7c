"""A training step's R3 health summed over ranks: the data-parallel group with context parallel (where slime
reduces its own step metrics) and, under sequence parallel, the tensor-parallel group."""

from __future__ import annotations

from typing import Any, Optional

import torch

from sglang_r3.trainer.routers import RouterBinding
from sglang_r3.trainer.health import HealthCounts


def step_health(model: Any, args: Any = None) -> Optional[HealthCounts]:
    """This step's counts on every rank, summed over the data-parallel group with context parallel (where
    slime reduces its own step metrics) and, under sequence parallel, over tensor-parallel ranks (each routes
    its own slice of rows). None where the last fill did not measure (no collective then: all ranks agree)."""
    binding = RouterBinding.of(model)
    if binding is None or not binding.measuring:
        return None
    return sum_over_ranks(binding.read_health(True), bool(getattr(args, "sequence_parallel", False)))


def sum_over_ranks(counts: HealthCounts, sequence_parallel: bool) -> HealthCounts:
    """``counts`` summed over the ranks that hold other rows of the same layers (as is, without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return counts
    from megatron.core import parallel_state as mpu

    groups = [mpu.get_data_parallel_group(with_context_parallel=True)]
    if sequence_parallel and mpu.get_tensor_model_parallel_world_size() > 1:
        groups.append(mpu.get_tensor_model_parallel_group())
    groups = [g for g in groups if dist.get_world_size(g) > 1]
    if not groups:
        return counts
    n, m = len(counts.layers), len(counts.mtp_layers)
    flat = [*counts.compared, *counts.flipped, counts.rows, counts.tokens_flipped, *counts.mtp_rows]
    for g in groups:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(g) == "nccl" else "cpu"
        t = torch.tensor(flat, dtype=torch.int64, device=device)
        dist.all_reduce(t, group=g)
        flat = t.cpu().tolist()
    return HealthCounts(
        counts.layers, tuple(flat[:n]), tuple(flat[n : 2 * n]), flat[2 * n], flat[2 * n + 1],
        counts.mtp_layers, tuple(flat[2 * n + 2 : 2 * n + 2 + m]),
    )
