"""The CPU runtime's clamped SiLU experts (sglang_r3/cpu_runtime/families/step3p5.py, Step-3.5's ``swiglu_limits`` as
SGLang's CUDA Triton runner applies them) against transformers' own ``Step3p7Experts`` with the same weights: equal
with a clamp that bites, and the unclamped experts (what ``moe_forward_native`` computes) are not. A served tiny
checkpoint cannot tell them apart (its routed experts move the logits by less than the comparison's tolerance), so
this is where the port is held to transformers."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.fast

transformers = pytest.importorskip("transformers")


def _experts(limit):
    from transformers.models.step3p7 import modeling_step3p7 as m

    config = transformers.Step3p7TextConfig(hidden_size=16, moe_intermediate_size=8, moe_num_experts=4,
                                            num_attention_heads=2, num_hidden_layers=1)
    experts = m.Step3p7Experts(config, swiglu_limit=limit)
    torch.manual_seed(0)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.5)
        experts.down_proj.normal_(0, 0.5)
    return experts


def test_the_clamped_experts_are_transformers_step3p7_experts():
    pytest.importorskip("transformers.models.step3p7")
    from sglang_r3.cpu_runtime.families.step3p5 import clamped_silu_experts

    torch.set_num_threads(1)
    limit = 0.3
    experts = _experts(limit)
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[e % 4, (e + 1) % 4] for e in range(12)])
    weights = torch.rand(12, 2, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = experts(x, ids, weights)
        got = clamped_silu_experts(experts.gate_up_proj, experts.down_proj, x, ids, weights, limit)
        unclamped = _experts(None)(x, ids, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (unclamped - want).abs().max() > 1e-2  # the clamp bites: the unclamped experts compute another output
    # another rank's expert (-1, expert parallelism) adds zero
    with torch.no_grad():
        partial = clamped_silu_experts(experts.gate_up_proj, experts.down_proj, x, torch.where(ids == 3, -1, ids),
                                       weights, limit)
        kept = experts(x, torch.where(ids == 3, 4, ids), weights)  # transformers skips id num_experts
    torch.testing.assert_close(partial, kept, rtol=1e-5, atol=1e-6)
