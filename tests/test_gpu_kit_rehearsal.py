"""The GPU run rehearsed on this machine's CPU (``python -m benchmarks.gpu.rehearse``), in SGLang 0.5.15.post1's
environment (``.venv-sglang-0.5.15.post1``, ``.ci/release-env``; run on demand before a GPU run, about 4 minutes:
``.venv-sglang-0.5.15.post1/bin/python -m pytest tests/test_gpu_kit_rehearsal.py -m release``).

Stand-ins, named in ``benchmarks/gpu/rehearse.py``: this CPython for the host's 3.12 (a kit of the same pins
built for it), a venv of the host image's packages (``contents.HOST_IMAGE``) linked from this environment's
full SGLang install, torch told it has an H200 for the CUDA-path imports, the CPU runtime for the GPU forward.
What it proves: the kit and the host's image hold every package the GPU script's steps import, the stand-ins
survive SGLang's CUDA-path imports, and every step of the script runs to a verdict. Nothing about a GPU.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import contents as C
from benchmarks.gpu.run import prompts

pytestmark = [pytest.mark.server, pytest.mark.release]

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_run_rehearsed_on_the_cpu_with_the_kit_and_the_hosts_image_only(tmp_path):
    installed = md.version("sglang")
    if installed != C.SGLANG:
        pytest.skip(f"the host image is linked from SGLang {C.SGLANG}'s own install (.ci/release-env's venv); "
                    f"this environment has {installed}")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.rehearse", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=2700)
    res = json.loads((tmp_path / "rehearsal.json").read_text())
    steps = res["steps"]
    failed = {n: s.get("error") or s.get("failed") or s.get("verdicts") for n, s in steps.items()
              if not (s["ok"] and s.get("pass", True))}
    assert failed == {}, (failed, proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    # every package the kit leaves to the host is in the host's image
    assert steps["host_image"]["linked"] and steps["gpu_run_on_cpu"]["host_missing"] == []
    run = json.loads((tmp_path / "gpu_cpu-rehearsal.json").read_text())
    assert run["cpu_rehearsal"] is True and "nothing here is a GPU result" in run["summary"]
    verdicts = run["verdicts"]
    # every step of the GPU script ran and passed; the comparisons compared something
    assert set(verdicts) >= {"unpack", "probe", "a_nograph_nospec", "plain_upstream_vs_a", "b_graph_nospec",
                             "c_graph_mtp", "overhead", "c_mtp_section", "near_tie_gaps", "b_vs_a", "c_vs_a",
                             "gpu_check"}, verdicts
    assert all(v is True for v in verdicts.values()), verdicts
    s = run["steps"]
    assert s["probe"]["imported"] == "sglang.srt.entrypoints.http_server"
    n = len(prompts())
    assert s["plain_upstream_vs_a"]["routed_experts_equal"] == f"{n}/{n}"
    assert s["b_vs_a"]["pairs_compared"] > 0 and s["c_mtp_section"]["accepted"] > 0
    assert s["gpu_check"]["rc"] == 0
