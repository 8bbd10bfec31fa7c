"""The CPU runtime's Gemma-4 router (sglang_r3/serving/patches/cpu/gemma4.py) against transformers 5.19's own
``Gemma4TextRouter`` (``modeling_gemma4``): same probabilities, same top-k experts, for a router whose learned
input scale is not uniform; and SGLang's own CPU path without the hook routes otherwise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.fast


def test_the_router_is_transformers_and_sglangs_own_cpu_path_is_not():
    # In a fresh process with the CPU runtime as a server has it (SGLang's modules import sgl-kernel).
    code = textwrap.dedent("""
        import torch
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        torch.set_num_threads(1)
        from transformers import Gemma4TextConfig
        from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRouter
        from sglang.srt.models.gemma4_causal import Gemma4Router
        from sglang_r3.serving.patches.cpu import gemma4

        cfg = Gemma4TextConfig(hidden_size=64, num_experts=8, top_k_experts=2, rms_norm_eps=1e-6)
        gen = torch.Generator().manual_seed(0)
        theirs = Gemma4TextRouter(cfg)
        ours = Gemma4Router(cfg)
        with torch.no_grad():
            theirs.proj.weight.copy_(torch.randn(8, 64, generator=gen))
            theirs.scale.copy_(torch.rand(64, generator=gen) + 0.5)
            ours.proj.weight.copy_(theirs.proj.weight)
            ours.scale.copy_(theirs.scale)
        x = torch.randn(40, 64, generator=gen) * 3
        with torch.no_grad():
            probs, _, ids = theirs(x)
            own = Gemma4Router.forward(ours, x)  # SGLang's own CPU path (Gemma4RMSNorm.forward_native)
            hooked = gemma4._router_around(Gemma4Router.forward, ours, x)
        torch.testing.assert_close(torch.softmax(hooked, -1), probs, atol=1e-6, rtol=1e-5)
        assert torch.equal(hooked.topk(2).indices.sort(-1).values, ids.sort(-1).values)
        moved = (own.topk(2).indices.sort(-1).values != ids.sort(-1).values).any(-1).sum().item()
        assert moved > 0, moved
        print("ROUTER", moved)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ROUTER" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
