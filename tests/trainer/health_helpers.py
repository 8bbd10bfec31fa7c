"""Helpers of the live R3 health tests (test_health.py, test_slime_health.py, test_slime_install.py): seeded
samples, records cut from packed router rows, planted flips, a plain count of flips with sets, and a counter of
host reads inside routers.
"""

from __future__ import annotations

import collections
import os
import sys
from contextlib import contextmanager

import numpy as np
import torch

from sglang_r3.core.record import RoutingRecord, token_digest

LENGTHS = [7, 9, 5]  # three samples packed into one microbatch of 21 tokens
SEED = 31


def random_samples(lengths=LENGTHS, seed=SEED, vocab=128):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def chosen_experts(routing_map: torch.Tensor, k: int) -> np.ndarray:
    return torch.sort(torch.nonzero(routing_map)[:, 1].reshape(-1, k), dim=1).values.numpy()


def records_from_rows(layout, tokens, rows_by_layer):
    """Per-sample records cut from packed rows [S, topk] per layer (sample i at its offset, T_i - 1 rows)."""
    out, off = [], 0
    for t in tokens:
        n = len(t) - 1
        experts = np.stack([rows_by_layer[lid][off : off + n] for lid in layout.moe_layer_ids], axis=1)
        out.append(RoutingRecord(layout=layout.fingerprint, start=0, layers=layout.moe_layer_ids,
                                 experts=experts.astype(layout.expert_dtype), tokens_digest=token_digest(t)))
        off += len(t)
    return out


def perturb_rows(rows: np.ndarray, which, num_experts: int) -> np.ndarray:
    """Rows with one expert of each listed row swapped for one outside its set (a different set)."""
    rows = rows.copy()
    for r in which:
        outside = [e for e in range(num_experts) if e not in set(rows[r].tolist())]
        rows[r, 0] = outside[0]
    return rows


def count_flips(records, tokens, own_by_layer, layout):
    """Flips per layer and tokens with a flip, counted with sets over the record rows (pad rows skipped)."""
    flips, tokens_flipped, off = collections.Counter(), 0, 0
    for rec, t in zip(records, tokens):
        for row in range(len(t) - 1):
            any_flip = False
            for col, lid in enumerate(layout.moe_layer_ids):
                if set(rec.experts[row, col].tolist()) != set(own_by_layer[lid][off + row].tolist()):
                    flips[lid] += 1
                    any_flip = True
            tokens_flipped += any_flip
        off += len(t)
    return flips, tokens_flipped


# Tensor methods that read device memory on the host (a device->host copy, or a sync, on a GPU).
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
# aten ops whose result or output size depends on tensor values (a device sync on a GPU).
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item", "is_nonzero")


@contextmanager
def host_reads_inside_routers(routers):
    """Counts host reads made while a router's __call__ runs (its hooks included): patched Tensor
    methods, and value-dependent aten ops seen by a TorchDispatchMode. Each event is tagged with
    whether sglang_r3 code is on the stack."""
    from torch.utils._python_dispatch import TorchDispatchMode

    events = []
    depth = [0]

    def ours() -> bool:
        f = sys._getframe(2)
        while f is not None:
            if f"{os.sep}sglang_r3{os.sep}" in f.f_code.co_filename:
                return True
            f = f.f_back
        return False

    def patched(name, original):
        def method(self, *a, **k):
            if depth[0]:
                events.append((name, ours()))
            return original(self, *a, **k)

        return method

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if depth[0] and func.overloadpacket.__name__ in SYNC_OPS:
                events.append((func.overloadpacket.__name__, ours()))
            return func(*args, **(kwargs or {}))

    originals = {n: getattr(torch.Tensor, n) for n in HOST_READS}
    enter = lambda m, a: depth.__setitem__(0, depth[0] + 1)  # noqa: E731
    leave = lambda m, a, o: depth.__setitem__(0, depth[0] - 1)  # noqa: E731
    handles = [h for r in routers for h in (r.register_forward_pre_hook(enter, prepend=True), r.register_forward_hook(leave))]
    for n, fn in originals.items():
        setattr(torch.Tensor, n, patched(n, fn))
    try:
        with Ops():
            yield events
    finally:
        for n, fn in originals.items():
            setattr(torch.Tensor, n, fn)
        for h in handles:
            h.remove()
