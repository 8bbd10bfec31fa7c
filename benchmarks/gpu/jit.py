"""SGLang's JIT kernels for the GPU run, built here for sm90 and carried in the kit.

On CUDA, SGLang 0.5.15.post1 builds some kernels with nvcc on first use (``sglang/jit_kernel/utils.py``,
``load_jit``). Its cache is content-addressed: ``$TVM_FFI_CACHE_DIR/<module>__arch_9.0__tvmffi_<v>/<module>.so``
is loaded as it is when present, and built (and written there) when not, or when it fails to load. So modules
built here with SGLang's own loaders under ``override_jit_cuda_arch(9, 0)`` take the host's nvcc and C++
compiler off the GPU run's path, and a wrong or unloadable one costs only the build it would have cost anyway.

``MODULES``: the loaders a GPU run of the embedded model reaches (bfloat16, tp 1, triton attention), read from
SGLang 0.5.15.post1's code, not observed: the GPU run reports which modules its servers built themselves
(``accounting``), which is where this list is checked. Built with the Python of an SGLang 0.5.15.post1 install
(``.ci/release-env``'s venv) and nvcc; the kit is built without them when either is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.gpu import contents as C

ARCH = (9, 0)  # H100 / H200
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = ROOT / ".venv-sglang-0.5.15.post1" / "bin" / "python"
CACHE_DIR = "jit-cache"  # in the kit, beside site/; the run points TVM_FFI_CACHE_DIR at it

# name -> (module in sglang.jit_kernel, its loader, the loader's arguments (a string: a torch dtype), where the
# GPU path calls it in SGLang 0.5.15.post1 and why with these arguments)
MODULES: Dict[str, tuple] = {
    "activation": ("activation", "_jit_activation_module", ("bfloat16",),
                   "SiluAndMul.forward_cuda (srt/layers/activation.py:106, the dense layer 0) and the triton "
                   "fused MoE (moe_runner/triton_utils/fused_moe.py:632)"),
    "rotary_embedding": ("rope", "_jit_rotary_embedding_module", (),
                         "srt/layers/rotary_embedding/base.py:425: head size 16 is not one the fused rope takes"),
    "kvcache": ("kvcache", "_jit_kvcache_module", (64,),
                "memory_pool.py:146 set_kv_buffer: 2 KV heads x head dim 16 x 2 bytes (bfloat16) a row"),
    "clamp_position": ("clamp_position", "_jit_clamp_position_module", ("int64",),
                       "forward_batch_info.py:813: decode without speculative positions (int64 seq_lens)"),
}

# Run by the SGLang 0.5.15.post1 install's Python: SGLang's own loaders, so the module names and compile flags
# are exactly the ones its serving path computes (each loads its module from TVM_FFI_CACHE_DIR, else builds it
# there). The PDL flag is cached on first call: inside the override. Prints each loader's seconds as JSON.
CALL_LOADERS = r"""
import importlib, json, sys, time
import torch
from sglang.jit_kernel.utils import override_jit_cuda_arch
arch, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
with override_jit_cuda_arch(*arch):
    for name, (mod, loader, args) in modules.items():
        t = time.monotonic()
        build = getattr(importlib.import_module("sglang.jit_kernel." + mod), loader)
        build(*[getattr(torch, a) if isinstance(a, str) else a for a in args])
        out[name] = round(time.monotonic() - t, 2)
print(json.dumps(out))
"""


def cuda_home() -> Optional[Path]:
    """Where nvcc's toolkit is (its lib64 holds the libcudart the modules link), or None."""
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and (Path(cand) / "bin" / "nvcc").exists():
            return Path(cand).resolve()
    return None


def unavailable(python: Path) -> Optional[str]:
    """Why modules cannot be built here, or None."""
    if not python.exists():
        return f"no SGLang {C.SGLANG} install at {python} (.ci/release-env makes it)"
    if cuda_home() is None:
        return "no CUDA toolkit (nvcc) under $CUDA_HOME or /usr/local/cuda"
    proc = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                          capture_output=True, text=True)
    if proc.stdout.strip() != C.SGLANG:
        return f"{python} has SGLang {proc.stdout.strip() or '?'} ({proc.stderr.strip()[-200:]}), not {C.SGLANG}"
    return None


def prebuild(cache: Path, python: Path = DEFAULT_PYTHON, names: Sequence[str] = tuple(MODULES)) -> Dict:
    """Build ``names`` into ``cache`` with SGLang's loaders for ``ARCH``; keep only each module's ``.so`` (what
    ``load_jit`` looks for), so a folder the host adds build files to is one it built itself."""
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TVM_FFI_CACHE_DIR": str(cache), "CUDA_HOME": str(cuda_home())}
    spec = {n: MODULES[n][:3] for n in names}
    proc = subprocess.run([str(python), "-c", CALL_LOADERS, json.dumps(ARCH), json.dumps(spec)], env=env, cwd=cache,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"JIT prebuild failed ({proc.returncode}): {proc.stderr[-3000:]}")
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])
    for folder in cache.iterdir():
        for f in folder.iterdir():
            if f.name != folder.name.split("__arch_")[0] + ".so":
                shutil.rmtree(f) if f.is_dir() else f.unlink()
    return {"arch": "%d.%d" % ARCH, "modules": sorted(p.name for p in cache.iterdir()), "build_s": seconds}


def folders(cache: Path) -> List[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []


def accounting(cache: Path, carried: Sequence[str], logs: Sequence[Path] = ()) -> Dict:
    """After the servers: which modules the host built itself (a folder with SGLang's build files in it: one
    the kit did not carry, or one whose carried ``.so`` failed to load and was rebuilt), and which the kit
    carried that no server rebuilt."""
    built = [n for n in folders(cache) if (cache / n / "build.ninja").exists()]
    reloaded = sum(p.read_text(errors="replace").count("failed to load; rebuilding")
                   for p in logs if p.is_file())
    return {"carried": list(carried), "built_on_host": built,
            "carried_not_rebuilt": [n for n in carried if n not in built],
            "not_carried_built": [n for n in built if n not in carried],
            "carried_failed_to_load": reloaded}
