"""Make stray ``torch.cuda.synchronize()`` / ``torch.cuda.empty_cache()`` calls and host pinning harmless.

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


def unpinned(module_name: str):
    """An AROUND hook for a function of ``module_name`` that builds host tensors with ``pin_memory=True``
    (0.5.15: DP-attention's token counts, upstream's routed-experts host cache): pinning needs a CUDA driver,
    and without a GPU the exact meaning is a plain host tensor. For the call only, the module's ``torch`` is
    one whose ``tensor`` / ``zeros`` / ``empty`` drop ``pin_memory``; it is swapped back after."""
    def around(original, *args, **kwargs):
        import importlib

        module = importlib.import_module(module_name)
        real = module.torch
        module.torch = _Unpinned(real)
        try:
            return original(*args, **kwargs)
        finally:
            module.torch = real

    return around


class _Unpinned:
    def __init__(self, torch_module):
        self._torch = torch_module

    def tensor(self, *args, pin_memory=False, **kwargs):
        return self._torch.tensor(*args, **kwargs)

    def zeros(self, *args, pin_memory=False, **kwargs):
        return self._torch.zeros(*args, **kwargs)

    def empty(self, *args, pin_memory=False, **kwargs):
        return self._torch.empty(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def hooks():
    """0.5.15's host tensors pinned without asking whether pinning is available (CPU runtime only)."""
    from sglang_r3.seam.release import pins_host_tensors_unasked

    if not pins_host_tensors_unasked():
        return []
    return [
        ("sglang.srt.model_executor.forward_batch_info.ForwardBatch.prepare_mlp_sync_batch",
         unpinned("sglang.srt.model_executor.forward_batch_info")),
        ("sglang.srt.state_capturer.base.BaseHostCache.__init__", unpinned("sglang.srt.state_capturer.base")),
    ]

