"""``python -m benchmarks.gpu.rehearse [--out DIR] [--reference SITE]``: the GPU run rehearsed on this machine's CPU.

The GPU run (``benchmarks.gpu.run``) gets one try on a lent host with nothing but its image and the kit. A
package the kit lacks, a stand-in that refuses at import, or a bug in the script costs that try. This
rehearses all three here, with named stand-ins for what this machine does not have:

* **the host's CPython 3.12**: this machine's CPython, with a kit of the same pins built for it
  (``kit.build(python=...)``); sgl_kernel keeps ``sm100/``, which it loads on a host without a GPU.
* **the host's image**: a venv holding only the packages of ``contents.HOST_IMAGE`` (the device tool's list
  of that image) that the kit does not bring, linked from ``--reference``, the site-packages of a full SGLang
  0.5.15.post1 install (default: this interpreter's, as ``.ci/release-env`` makes it).
* **the GPU**: (1) ``cuda_path_imports``: the modules a GPU run of the embedded model loads, imported with
  torch answering as one H200 (sm90), which is what sends SGLang down its CUDA imports (sgl_kernel's sm90 ops,
  the DSA indexer's cutlass kernels, ...); (2) ``benchmarks.gpu.run --cpu-rehearsal``: every step of the GPU
  script on the CPU runtime (ours three ways, plain SGLang's own capturer, the near-tie routers, the overhead
  rounds, the GPU check's CPU self-test).

Writes ``OUT/rehearsal.json`` (and the run's ``gpu_cpu-rehearsal.json`` and logs beside it); exit status 1 when
a step failed. ``tests/test_gpu_kit_rehearsal.py`` runs it in ``.ci/release-env``'s venv (on demand). It proves
the kit's package set and the script's logic, nothing about a GPU.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path
from typing import Any, Dict, List

from benchmarks.gpu import contents as C
from benchmarks.gpu import kit, run

ROOT = run.ROOT
DEFAULT_OUT = ROOT / ".gpu-kit" / "rehearsal"
BUDGET_S = 1500.0  # the CPU run's steps on 2 cores; the GPU run's own budget is run.BUDGET_S

# What a GPU run of the embedded model imports beyond the CPU runtime's path: the model and its MTP layer
# (glm4_moe imports deepseek_v2, which on CUDA imports the DSA indexer's cutlass kernels), triton attention,
# the CUDA-graph runners, EAGLE's workers, sampling, and our plugin.
CUDA_PATH_MODULES = (
    "sgl_kernel", "sglang.srt.entrypoints.http_server", "sglang.srt.models.glm4_moe",
    "sglang.srt.models.glm4_moe_nextn", "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.moe.fused_moe_triton", "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.runner_backend", "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner", "sglang.srt.layers.sampler",
    "sglang.srt.managers.scheduler", "sglang_r3.serving.plugin",
)

# torch told it has one H200: enough for SGLang's import-time device checks (is_cuda, capability, properties).
_AS_H200 = r"""
import importlib, json, sys, traceback
import torch

class _H200:
    major, minor, name, multi_processor_count, warp_size = 9, 0, "NVIDIA H200 (rehearsal: torch told so)", 132, 32
    total_memory, L2_cache_size, gcnArchName = 143771 << 20, 60 << 20, ""

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_capability = lambda device=None: (9, 0)
torch.cuda.get_device_properties = lambda device=None: _H200()
torch.cuda.get_device_name = lambda device=None: _H200.name
out = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except BaseException as exc:
        out[name] = f"{type(exc).__name__}: {str(exc).strip()[:300]} | " + traceback.format_exc(limit=-3)[-600:]
print(json.dumps(out))
"""


def host_image(reference: Path, dest: Path) -> Dict[str, Any]:
    """A venv at ``dest`` whose only packages are HOST_IMAGE's that the kit does not bring, linked (files and
    folders, dist-info included) from the ``reference`` site-packages."""
    venv.EnvBuilder(clear=True, with_pip=False, symlinks=True).create(dest)
    links = dest / "host-image"
    links.mkdir()
    brought = {kit.canonical(n) for n in (*C.KIT, *C.STAND_INS)} | {C.OWN}
    wanted = {kit.canonical(n) for n in C.HOST_IMAGE} - brought
    linked: Dict[str, str] = {}
    for dist in md.distributions(path=[str(reference)]):
        name = kit.canonical(dist.metadata["Name"])
        if name not in wanted or name in linked:
            continue
        tops = {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] not in ("..", "bin")}
        for top in tops:
            src, dst = reference / top, links / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
        linked[name] = dist.version
    site = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    (site / "host-image.pth").write_text(str(links) + "\n")
    return {"python": str(dest / "bin" / "python"), "linked": dict(sorted(linked.items())),
            "not_in_reference": sorted(wanted - set(linked))}


def cuda_path_imports(python: str, env: Dict[str, str]) -> Dict[str, Any]:
    """CUDA_PATH_MODULES imported with torch answering as an H200. The host's driver (libcuda.so.1, which
    sgl_kernel's sm90 ops link) is the CPU runtime's one-function stub here."""
    from sglang_r3.dev.cpu.bootstrap import build_libcuda_stub

    stub = str(build_libcuda_stub())
    env = {**env, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [stub, env.get("LD_LIBRARY_PATH")]))}
    proc = subprocess.run([python, "-c", _AS_H200, json.dumps(CUDA_PATH_MODULES)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"exited {proc.returncode}: {proc.stderr[-3000:]}")
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {m: why for m, why in modules.items() if why != "ok"}
    return {"modules": len(modules), "failed": failed, "pass": not failed}


def rehearse(out: Path, reference: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    result: Dict[str, Any] = {"python": sys.version.split()[0], "reference": str(reference), "steps": {}}
    path = out / "rehearsal.json"
    t0 = time.monotonic()

    def step(name, fn, *a):
        t = time.monotonic()
        try:
            rec = {"ok": True, **fn(*a)}
        except Exception as exc:  # written, and the steps that do not need it go on
            rec = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000]}
        rec["seconds"] = round(time.monotonic() - t, 1)
        result["steps"][name] = rec
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"[{time.monotonic() - t0:6.1f} s] {name}: {'ok' if rec['ok'] else 'FAILED ' + rec['error'][:300]}",
              flush=True)
        return rec

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    built = step("kit", lambda: kit.build(out / "kit", python=python,
                                          kernel_drop=tuple(d for d in C.KERNEL_DROP if d != "sgl_kernel/sm100/"),
                                          xz_preset=1, jit_python=None))  # no CUDA kernel runs here
    host = step("host_image", host_image, reference, out / "host")
    if not (built["ok"] and host["ok"]):
        return 1
    target = out / "target"
    unpacked = step("unpack", lambda: run.unpack(out / "kit" / C.ARCHIVE, target))
    if not unpacked["ok"]:
        return 1
    env = run.kit_env(Path(unpacked["site"]))
    step("cuda_path_imports", cuda_path_imports, host["python"], env)

    def the_run() -> Dict[str, Any]:
        proc = subprocess.run([host["python"], "-m", "benchmarks.gpu.run", "--cpu-rehearsal", "--kit",
                               str(out / "kit" / C.ARCHIVE), "--out", str(out), "--target", str(out / "run-target"),
                               "--budget-s", str(BUDGET_S)], cwd=ROOT, env=os.environ.copy(), text=True,
                              capture_output=True, timeout=BUDGET_S + 600)
        (out / "run.log").write_text(proc.stdout + proc.stderr)
        res = json.loads((out / "gpu_cpu-rehearsal.json").read_text())
        probe = res["steps"].get("probe", {})
        return {"rc": proc.returncode, "verdicts": res.get("verdicts"), "host_missing": probe.get("missing"),
                "pass": proc.returncode == 0 and probe.get("missing") == []}

    step("gpu_run_on_cpu", the_run)
    steps = result["steps"]
    result["pass"] = all(s["ok"] and s.get("pass", True) for s in steps.values())
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {path}: {'pass' if result['pass'] else 'FAILED'}")
    return 0 if result["pass"] else 1


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    ap.add_argument("--reference", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
                    help="site-packages of a full SGLang 0.5.15.post1 install (default: this interpreter's)")
    args = ap.parse_args(argv)
    return rehearse(args.out.resolve(), args.reference.resolve())


if __name__ == "__main__":
    sys.exit(main())
