"""Run code in a fresh Python process where some top-level modules cannot be imported, as on a host without them.

``run(code, blocked)`` runs ``code`` (dedented) under ``python -c`` from the repository root with a finder ahead of
every other one that makes each module of ``blocked`` raise ``ImportError`` as if absent, whatever the environment
has installed; ``ok(proc)`` asserts it exited 0 and returns its stdout. ``SERVER_ONLY``: SGLang and what only the
server side needs (the trainer side must run without them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# SGLang and what only the server side needs; sgl_kernel is SGLang's native half.
SERVER_ONLY = ("sglang", "sgl_kernel", "pybase64", "fastapi", "pydantic", "tokenizers", "safetensors",
               "aiohttp", "msgspec", "prometheus_client", "ray", "orjson", "transformers")

# A finder ahead of every other one: the blocked top-level modules raise ImportError as if absent,
# whatever the environment has installed.
BLOCKER = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed (blocked by the test)")
sys.meta_path.insert(0, _Absent())
"""


def run(code: str, blocked) -> subprocess.CompletedProcess:
    script = BLOCKER.format(blocked=tuple(blocked)) + "import json\n" + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout
