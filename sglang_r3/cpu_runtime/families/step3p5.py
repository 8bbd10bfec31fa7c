"""Step-3.5's routed experts on the CPU runtime, clamped as SGLang 0.5.23 clamps them on CUDA.

Step-3.5's MoE hands each layer's ``swiglu_limits`` entry to ``FusedMoE`` as ``gemm1_clamp_limit`` (step3p5.py).
On CUDA the Triton runner applies it to SiLU experts without an alpha (``moe_runner/triton_utils/fused_moe.py``
``_swiglu_silu_clamp_mul``: ``silu(gate)`` capped at the limit, ``up`` clamped to ``[-limit, limit]``); the CPU's
``fused_moe_native.moe_forward_native`` clamps only with ``gemm1_alpha`` (gpt-oss) and runs a plain ``SiluAndMul``
otherwise, so a clamped layer computed another model there. The around hook runs that one case as the CUDA runner
does, with ``moe_forward_native``'s own steps (each expert's tokens, float32 bias adds, the weighted sum in the top-k
weights' dtype); every other case goes on to SGLang's function. An id of another rank's expert (``-1``, expert
parallelism) adds zero, as the CUDA kernel writes it.

Served, rows = transformers' ``Step3p7`` router top-k with a clamp in every MoE layer (tests/test_families.py
``step3p5_flipped``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_EXPERTS_TARGET = "sglang.srt.layers.moe.fused_moe_native.moe_forward_native"


def clamped_silu_experts(w13, w2, x, topk_ids, topk_weights, limit, w13_bias=None, w2_bias=None):
    """sum_k weight_k * down_e(min(silu(gate_e(x)), limit) * clamp(up_e(x), -limit, limit)) over each token's top-k
    experts e; w13 [experts, 2 * intermediate, hidden] (gate then up), w2 [experts, hidden, intermediate]."""
    out = torch.zeros((x.shape[0], w2.shape[1]), dtype=topk_weights.dtype, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        if e < 0:  # another rank's expert: adds zero
            continue
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        gate_up = F.linear(x[rows], w13[e])
        if w13_bias is not None:
            gate_up = (gate_up.float() + w13_bias[e]).to(x.dtype)
        gate, up = gate_up.chunk(2, dim=-1)
        h = F.silu(gate).clamp(max=limit) * up.clamp(min=-limit, max=limit)
        h = F.linear(h, w2[e])
        if w2_bias is not None:
            h = (h.float() + w2_bias[e]).to(x.dtype)
        out.index_add_(0, rows, h.to(out.dtype) * topk_weights[rows, slots][:, None])
    return out.to(x.dtype)


def _experts_around(original, layer, x, topk_output, moe_runner_config):
    c = moe_runner_config
    limit = c.gemm1_clamp_limit
    if (x.is_cuda or c.activation != "silu" or not c.is_gated or limit is None or c.gemm1_alpha is not None
            or c.apply_router_weight_on_input):
        return original(layer, x, topk_output, moe_runner_config)
    # The expert weights UnquantizedFusedMoEMethod.create_weights registers on the layer (by name, as it does).
    return clamped_silu_experts(layer.get_parameter("w13_weight"), layer.get_parameter("w2_weight"), x,
                                topk_output.topk_ids, topk_output.topk_weights, float(limit),
                                getattr(layer, "w13_weight_bias", None), getattr(layer, "w2_weight_bias", None))


HOOKS = [(_EXPERTS_TARGET, _experts_around)]
