"""Ling / Ring 2.0's routed experts with their routed scaling factor, on the CPU runtime.

bailing_moe.py's BailingMoESparseMoeBlock hands ``routed_scaling_factor`` to its FusedMoE and TopK and never
multiplies by it itself: on CUDA the Triton runner's fused_experts applies it (``moe_sum_reduce``), or TopK folds it
into the weights where the experts say so (``should_fuse_routed_scaling_factor_in_topk``). On the CPU runtime the
experts run ``fused_moe_native.moe_forward_native``, which applies no factor, so Ling 2.0 (2.5 as published) was
served unscaled: another model than the release's (6 of 106 (token, layer) pairs differed from transformers' GLM-4.5
over the same tensors, which is the release's modeling code to 2e-7). glm4_moe.py and deepseek_v2.py multiply by it
themselves off CUDA; this AROUND hook on ``_forward_router_experts`` does the same, for CPU tensors, unless TopK
folded it in. Served against transformers in tests/test_families.py (``bailing_moe_v2``).
"""

from __future__ import annotations

_TARGET = "sglang.srt.models.bailing_moe.BailingMoESparseMoeBlock._forward_router_experts"


def _router_experts_scaled(original, self, hidden_states, *rest):
    out = original(self, hidden_states, *rest)  # 0.5.23 passes forward_batch too, 0.5.15 does not
    factor = self.routed_scaling_factor
    folded = getattr(self.experts, "should_fuse_routed_scaling_factor_in_topk", False)  # TopK applied it
    if hidden_states.is_cuda or factor in (None, 1.0) or folded:
        return out
    return out * factor


HOOKS = [(_TARGET, _router_experts_scaled)]
