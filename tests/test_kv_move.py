"""Issue 3, item 4: tree drafting (topk > 1) moves accepted tokens' KV; the captured rows must move with it.

SGLang 0.5.23's CPU attention path runs EAGLE with topk=1 only, so this drives SGLang's own
``move_accept_tokens_to_target_kvcache`` on CPU tensors with a real KV pool and our capturer.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang  # a child process drives SGLang's KV pool; no server


def test_rows_follow_sglang_accepted_token_kv_move():
    root = Path(__file__).resolve().parents[1]
    script = root / "tests" / "scripts" / "kv_move_check.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert verdict["moves"], "the scenario must move some tokens"
    assert verdict["kv_moved"], verdict
    assert verdict["rows_follow_kv"], verdict
    assert verdict["rows_moved"] == len(verdict["moves"])
