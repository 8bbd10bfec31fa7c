"""``python -m benchmarks.gpu_check`` on a machine without CUDA, as the bare GPU host would import it.

The GPU host has torch, numpy and msgpack, plus the small wheels brought along (pybase64,
megatron-core), and no SGLang: every other server-side package is made unimportable here.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.blocked_imports import SERVER_ONLY, ok, run

pytestmark = pytest.mark.fast

# What the bare GPU host lacks: SGLang and the server side, except pybase64 (brought as a wheel).
ABSENT = tuple(m for m in SERVER_ONLY if m != "pybase64") + ("matplotlib",)

RUN = """
import runpy
sys.argv = ["gpu_check"] + {argv!r}
try:
    runpy.run_module("benchmarks.gpu_check", run_name="__main__")
except SystemExit as e:
    print("EXIT", e.code)
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & BLOCKED)))
"""


def test_without_cuda_it_says_so_exits_0_and_claims_nothing():
    assert not torch.cuda.is_available()  # this test is about a machine without CUDA
    out = ok(run(RUN.format(argv=[]), ABSENT))
    lines = out.splitlines()
    assert lines[0] == "gpu_check needs CUDA (torch.cuda.is_available() is False here); nothing was checked"
    assert "EXIT 0" in lines and not [l for l in lines if l.startswith(("PASS", "FAIL", "SKIP"))]
    assert json.loads(lines[-1]) == []


def test_its_cpu_selftest_runs_every_check_without_sglang():
    """The checks' own logic (capturers, deferred copy, ReplayFiller with measure=True into real
    megatron-core routers) on CPU tensors; CUDA-only steps report SKIP. No GPU claim is made."""
    out = ok(run(RUN.format(argv=["--cpu-selftest"]), ABSENT))
    lines = out.splitlines()
    status = {l.split()[1].rstrip(":"): l.split()[0] for l in lines if l.startswith(("PASS", "FAIL", "SKIP"))}
    assert status == {
        "routing_capturer_cuda_graph": "SKIP", "draft_capturer_cuda_graph": "SKIP", "dp_window_cuda_graph": "PASS",
        "deferred_copy_side_stream": "PASS", "pinned_host_rows": "SKIP", "replay_filler_megatron_cuda": "PASS",
    }, out
    assert "EXIT 0" in lines and "3 passed, 3 skipped, 0 failed" in lines
    assert json.loads(lines[-1]) == []  # sglang_r3.serving.capture and the trainer imported, SGLang never


def test_the_capture_modules_import_without_sglang():
    out = ok(run("""
import sglang_r3.serving.capture.capturer, sglang_r3.serving.capture.draft, sglang_r3.trainer.megatron, sglang_r3.trainer.health
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)))
""", ABSENT))
    assert json.loads(out.splitlines()[-1]) == []
