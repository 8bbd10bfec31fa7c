"""The MoE families Miles' scripts train that sglang-r3 refuses at start-up because SGLang serves them on GPU kernels
only (DeepSeek-V4, Inkling): their refusal (sglang_r3/core/families/) says where plain SGLang 0.5.23 stops on the
CPU runtime, and this module checks it with SGLang itself as the oracle. Each tiny checkpoint is saved by
transformers 5.19's own class and launched with ``python -m sglang.launch_server`` (not ours, so no refusal of ours
runs first) on the CPU runtime's flags; each launch must stop, naming the SGLang call its refusal names. Should a
release serve one of them on the CPU, its test fails: the family then wants a rule proven by a served forward.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

pytest.importorskip("sglang")

from sglang_r3.core.families import family_of  # noqa: E402
from sglang_r3.dev.cpu import CPU_SERVER_FLAGS, has_gpu  # noqa: E402
from sglang_r3.dev.cpu.bootstrap import EAGER_ENV, build_libcuda_stub  # noqa: E402
from sglang_r3.serving.fleet.gateway import free_port, stop_process_group  # noqa: E402
from tests.support import children  # noqa: E402
from tests.support.gpu_only_families import LAUNCHES  # noqa: E402

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(has_gpu(), reason="where plain SGLang stops on the CPU runtime: a host without a GPU")]

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 400  # two SGLang imports (launcher and scheduler) and a load, beside the suite's servers


def _plain_sglang_env() -> Dict[str, str]:
    """SGLang on the CPU runtime without sglang-r3: the libcuda stand-in on the loader path, SGLang's CPU engine,
    torch.compile'd functions run eagerly (as our launcher runs them); sglang-r3 not opted in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_R3_")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(build_libcuda_stub()), env.get("LD_LIBRARY_PATH")) if p)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.setdefault(EAGER_ENV, "1")
    return env


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Every launch started at once (each is mostly a SGLang import), then waited on: name -> (return code, log)."""
    env = _plain_sglang_env()
    started = {}
    for name, launch in LAUNCHES.items():
        folder = launch.build(tmp_path_factory.mktemp(name))
        log = open(folder / "launch.log", "w+")
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(folder), "--port", str(free_port()),
               *(arg for flag in CPU_SERVER_FLAGS for arg in flag), "--dtype", "float32", "--max-total-tokens",
               "4096", "--mem-fraction-static", "0.99"]
        # A session of its own, reaped with the run (tests/support/children.py).
        started[name] = (children.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env), log)
    results = {}
    try:
        for name, (proc, log) in started.items():
            try:
                code = proc.wait(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None  # still running: it did not stop
            log.seek(0)
            results[name] = (code, log.read())
    finally:
        for proc, log in started.values():
            stop_process_group(proc)  # a launch that did not stop (the run reaps what a stopped one left)
            log.close()
    return results


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_plain_sglang_stops_on_the_cpu_runtime_where_the_refusal_says(name, stopped):
    launch = LAUNCHES[name]
    code, log = stopped[name]
    assert code not in (None, 0), f"plain SGLang did not stop ({code}):\n{log[-4000:]}"
    for words in launch.stops:
        assert words in log, f"{words!r} not in SGLang's log:\n{log[-4000:]}"
    refusal = family_of(launch.architecture).refusal
    assert launch.stops[0] in refusal, refusal
