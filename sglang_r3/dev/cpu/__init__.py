"""CPU-only bootstrap: lets the CUDA build of SGLang/sgl-kernel run on a host without a GPU."""

from sglang_r3.dev.cpu.bootstrap import (
    CPU_SERVER_FLAGS,
    CpuBootstrapError,
    activate_cpu_runtime,
    add_cpu_flags,
    bind_rank_threads,
    has_gpu,
)

__all__ = [
    "CPU_SERVER_FLAGS",
    "CpuBootstrapError",
    "activate_cpu_runtime",
    "add_cpu_flags",
    "bind_rank_threads",
    "has_gpu",
]
