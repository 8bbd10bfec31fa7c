"""Make stray ``torch.cuda.synchronize()`` / ``torch.cuda.empty_cache()`` calls harmless.

Some SGLang code (speculative workers, scheduler memory housekeeping) calls
these unconditionally. On a CPU-only host ``synchronize`` tries to initialise
CUDA and raises; with nothing queued on a device there is nothing to wait for
or free, so a no-op is the exact CPU meaning. Only swapped in when CUDA is
unavailable, so a GPU process is never affected.
"""

from __future__ import annotations

import functools

import torch

_MARK = "_sglang_r3_cpu_shim"


def _noop_when_no_cuda(fn):
    if getattr(fn, _MARK, False):
        return fn  # already shimmed (idempotent)

    @functools.wraps(fn)
    def shim(*args, **kwargs):
        if torch.cuda.is_available():
            return fn(*args, **kwargs)
        return None

    setattr(shim, _MARK, True)
    return shim


def install_cuda_shims() -> None:
    if torch.cuda.is_available():
        return
    for name in ("synchronize", "empty_cache"):
        setattr(torch.cuda, name, _noop_when_no_cuda(getattr(torch.cuda, name)))


def _alloc_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    # Page-locking is a promise to a GPU's DMA engine; with no GPU the buffer is plain host memory.
    return allocator.allocate(dims, dtype=dtype, device=device)


def install_host_alloc_shim() -> None:
    """SGLang's host pools (upstream's routed-experts host buffer among them) pin their memory with
    ``cudaHostRegister``, which fails without CUDA; on the CPU runtime they get the same allocator
    without the registration."""
    if torch.cuda.is_available():
        return
    from sglang.srt.mem_cache.pool_host.common import ALLOC_MEMORY_FUNCS

    ALLOC_MEMORY_FUNCS["cpu"] = _alloc_unpinned
