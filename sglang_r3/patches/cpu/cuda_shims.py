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
