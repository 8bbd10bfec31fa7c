"""Make the CUDA wheels of SGLang 0.5.23 start on a CPU-only host.

sgl-kernel links ``libcuda.so.1`` for one symbol; a one-function stand-in, compiled here, loaded into
this process and put on ``LD_LIBRARY_PATH`` for SGLang's children, satisfies it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import List, Sequence

from sglang_r3.core import settings
from sglang_r3.core.paths import cache_root

# Flags SGLang needs to run its model on the CPU (settings.CAPTURE_NEEDS: the CPU runtime's), and one
# for comfort: an idle scheduler busy-polls its sockets, stealing the cores the model runs on. Each is
# added only when the user did not pass that flag.
CPU_SERVER_FLAGS: List[List[str]] = [n.argv for n in settings.CAPTURE_NEEDS if n.when != settings.ALWAYS] + [
    ["--sleep-on-idle"],
]

_STUB_SOURCE = "libcuda_stub.c"

# torch's switch that runs torch.compile'd functions eagerly (read when a process imports torch).
EAGER_ENV = "TORCHDYNAMO_DISABLE"


class CpuBootstrapError(RuntimeError):
    """The CPU runtime cannot be prepared (e.g. no C compiler)."""


def has_gpu() -> bool:
    """True when a CUDA device is usable. Checked without initialising CUDA in this process."""
    if settings.current().force_cpu:
        return False
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return True
    return shutil.which("nvidia-smi") is not None and _nvidia_smi_sees_a_gpu()


def _nvidia_smi_sees_a_gpu() -> bool:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def _find_compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise CpuBootstrapError(
        "sglang-r3 needs a C compiler to run SGLang on a CPU-only machine: it builds a one-function "
        "libcuda.so.1 stand-in so the CUDA build of sgl-kernel can load. No 'cc', 'gcc' or 'clang' was "
        "found on PATH (set CC to point at one, e.g. `apt-get install gcc`)."
    )


def build_libcuda_stub() -> Path:
    """Compile the stub once into the cache (keyed by source hash) and return its folder."""
    source = resources.files("sglang_r3.dev.cpu").joinpath(_STUB_SOURCE).read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    out_dir = cache_root() / "libcuda-stub" / digest
    lib = out_dir / "libcuda.so.1"
    if lib.exists():
        return out_dir
    compiler = _find_compiler()
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / _STUB_SOURCE
    src.write_bytes(source)
    tmp = out_dir / f"libcuda.so.1.{os.getpid()}.tmp"
    cmd = [compiler, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CpuBootstrapError(
            f"building the libcuda.so.1 stand-in failed ({' '.join(cmd)}):\n{proc.stderr.strip()}"
        )
    os.replace(tmp, lib)  # atomic: concurrent launches never load a half-written file
    return out_dir


def activate_cpu_runtime() -> Path:
    """Prepare this process and its children to run SGLang on the CPU. Idempotent."""
    stub_dir = build_libcuda_stub()
    ld_path = os.environ.get("LD_LIBRARY_PATH", "")
    if str(stub_dir) not in ld_path.split(os.pathsep):
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(stub_dir), ld_path) if p)
    # LD_LIBRARY_PATH is read by the loader at exec time only; for this
    # process load the stub now so sgl_kernel's import resolves against it.
    ctypes.CDLL(str(stub_dir / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    # SGLang torch.compiles a few functions for its GPU kernels' sake (moe/topk.py's grouped and biased top-k, parts
    # of its sampler and rotary embedding). On a CPU TorchInductor compiles each with the C++ compiler in every
    # scheduler process at its first forward: 30 s of a one-rank server's start-up on 2 cores, 85 s of a 2-rank DP
    # server's. The CPU runtime runs them eagerly: the same Python, the same math. TORCHDYNAMO_DISABLE=0 compiles.
    os.environ.setdefault(EAGER_ENV, "1")
    settings.publish({settings.CPU: "1"})
    return stub_dir


THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def _numa_nodes() -> int:
    nodes = [n for n in os.listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit()] \
        if os.path.isdir("/sys/devices/system/node") else []
    return max(1, len(nodes))


def threads_bind(ranks: int, cores: Sequence[int]) -> str:
    """SGLang's ``SGLANG_CPU_OMP_THREADS_BIND`` for ``ranks`` ranks over ``cores``: contiguous shares
    when there are enough cores, else ranks share cores round-robin ("0|1|0|1")."""
    cores = sorted(cores)
    if ranks <= len(cores):
        share = len(cores) // ranks
        groups = [cores[i * share : (i + 1) * share] for i in range(ranks)]
    else:
        groups = [[cores[i % len(cores)]] for i in range(ranks)]
    def spell(g):
        return f"{g[0]}-{g[-1]}" if g[-1] - g[0] == len(g) - 1 and len(g) > 1 else ",".join(map(str, g))

    return "|".join(spell(g) for g in groups)


def bind_rank_threads(ranks: int) -> None:
    """SGLang's CPU runtime asserts one NUMA node per rank unless it is told which cores each rank
    gets; with more ranks than nodes (two DP-attention ranks on one socket), say it here, in the
    launching process, so every scheduler it spawns inherits it. A value the user set is kept."""
    if ranks > _numa_nodes() and not os.environ.get(THREADS_BIND_ENV):
        os.environ[THREADS_BIND_ENV] = threads_bind(ranks, sorted(os.sched_getaffinity(0)))


def add_cpu_flags(argv: Sequence[str]) -> List[str]:
    """Append SGLang's CPU flags that the user did not set explicitly."""
    out = list(argv)
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    for flag in CPU_SERVER_FLAGS:
        if flag[0] not in given:
            out += flag
    return out
