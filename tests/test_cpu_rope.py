"""The CPU runtime's half-split rotation for DeepSeek-style attention (sglang_r3/cpu_runtime/ops/rope.py)
against SGLang's own: ``RotaryEmbedding.forward_native`` (rotary_embedding/base.py, the torch reference of the
rotation its GPU kernels run, which honours ``is_neox_style``), applied to the same YaRN cos/sin cache. And what
the hook is there for: SGLang's ``DeepseekScalingRotaryEmbedding.forward_native`` gives neox style a leading axis.
When SGLang fixes that, the second assertion fails and the hook can go.

Served end to end (rows against transformers' router top-k) by ``glm4_moe_lite_flipped`` and
``deepseek_v3_flipped`` in tests/test_families.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.sglang  # SGLang's rotary classes, built in a child process on the CPU runtime

_CHILD = r"""
import inspect, json
from tests.scripts import sweep
sweep.init_runtime()  # the CPU runtime, our patches installed
import torch
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
from sglang.srt.layers.rotary_embedding.rope_variant import DeepseekScalingRotaryEmbedding
from sglang_r3.cpu_runtime.ops import rope as ours
from sglang_r3.seam.hooks import registered

torch.manual_seed(0)
out = {"hooked": [t for t, _ in ours.HOOKS if t in registered()]}
for neox in (True, False):
    rope = DeepseekScalingRotaryEmbedding(16, 16, 128, 10000, neox, 4.0, torch.float32, beta_fast=32, beta_slow=1,
                                          mscale=1.0, mscale_all_dim=1.0, device="cpu")
    positions = torch.tensor([0, 5, 77, 300, 511])  # past original_max_position, where YaRN's ramp matters
    q, k = torch.randn(5, 4, 16), torch.randn(5, 1, 16)  # MLA's q_pe and k_pe: heads x qk_rope_head_dim, one k head
    want_q, want_k = RotaryEmbedding.forward_native(rope, positions, q.clone(), k.clone())
    sglangs = inspect.unwrap(DeepseekScalingRotaryEmbedding.forward_native)  # SGLang's own, without our hook
    for how, run in (("dispatched", rope), ("native", rope.forward_native), ("cpu", rope.forward_cpu),
                     ("sglang", lambda *a: sglangs(rope, *a))):
        got_q, got_k = run(positions, q.clone(), k.clone())
        diff = (max(float((got_q - want_q).abs().max()), float((got_k - want_k).abs().max()))
                if got_q.shape == want_q.shape else None)
        out[f"{neox}-{how}"] = dict(shape=list(got_q.shape), k_shape=list(got_k.shape), diff=diff,
                                    moved=float((got_q - q).abs().max()) if diff is not None else None)
print("RESULT " + json.dumps(out))
"""


def test_half_split_rotation_is_sglangs_reference_and_sglangs_cpu_path_is_not():
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert len(result.pop("hooked")) == 3
    for neox in ("True", "False"):
        for how in ("dispatched", "native", "cpu"):
            r = result[f"{neox}-{how}"]
            assert r["shape"] == [5, 4, 16] and r["k_shape"] == [5, 1, 16], (neox, how, r)
            assert r["diff"] <= 1e-6, (neox, how, r)  # float32, one cache: the same sums up to rounding
            assert r["moved"] > 0.1, (neox, how, r)  # it rotated
    assert result["True-sglang"]["shape"] == [1, 5, 4, 16]  # SGLang's own, neox: the leading axis the hook fixes
    assert result["False-sglang"]["diff"] <= 1e-6  # interleaved: SGLang's own is right, and kept
