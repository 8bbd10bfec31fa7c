"""AFMoE's routed experts on the CPU runtime.

``AfmoeMoE.forward`` (SGLang 0.5.23 ``models/afmoe.py``) keeps its experts as modules packed into two tensors
(``w1`` [experts, 2 * intermediate, hidden] gate and up, ``w2`` [experts, hidden, intermediate]) and calls the
Triton runner's ``fused_moe`` on them directly, not through a ``FusedMoE`` layer: its custom op
(``sglang::inplace_fused_experts``) is registered for CUDA only, so the first MoE layer stops on a CPU host.

An AROUND hook on the name ``fused_moe`` in ``afmoe.py`` computes, for CPU tensors, what the Triton kernel does
with that call's runner config: the experts through SGLang's own torch implementation
(``layers/moe/fused_moe_native.py`` ``fused_moe_forward_native``: gathered weights, SiLU-gated), weighted by the
router's top-k weights, times ``routed_scaling_factor`` (``moe_sum_reduce``), written into the input where
``inplace`` (the kernel's in-place variant). Anything else the kernel takes (biases, quantized weights, another
activation, weights on the input) is refused on the CPU runtime. Served against transformers' AfmoeForCausalLM in
tests/test_families.py (``afmoe``).
"""

from __future__ import annotations

from types import SimpleNamespace

_FUSED_MOE_TARGET = "sglang.srt.models.afmoe.fused_moe"


def _fused_moe_around(original, hidden_states, w1, w2, topk_output, moe_runner_config=None, *args, **kwargs):
    if moe_runner_config is not None:
        args = (moe_runner_config, *args)
    if hidden_states.is_cuda:
        return original(hidden_states, w1, w2, topk_output, *args, **kwargs)
    from sglang.srt.layers.moe.fused_moe_native import fused_moe_forward_native
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.token_dispatcher import StandardDispatchOutput

    cfg = moe_runner_config if moe_runner_config is not None else MoeRunnerConfig()
    extra = [k for k, v in kwargs.items() if v not in (None, False)] + (["positional extras"] if args[1:] else [])
    if extra or cfg.activation != "silu" or not cfg.is_gated or cfg.apply_router_weight_on_input \
            or cfg.gemm1_alpha is not None or cfg.gemm1_clamp_limit is not None or cfg.swiglu_limit is not None:
        raise NotImplementedError(f"sglang-r3 CPU runtime: AFMoE's fused_moe with {extra or cfg} (served: plain "
                                  "SiLU-gated unquantized experts)")
    layer = SimpleNamespace(w13_weight=w1, w2_weight=w2, moe_runner_config=cfg)
    out = fused_moe_forward_native(layer, StandardDispatchOutput(hidden_states, None, topk_output)).hidden_states
    if cfg.routed_scaling_factor not in (None, 1.0):
        out = out * cfg.routed_scaling_factor
    if cfg.inplace:  # the kernel's in-place variant returns its input, overwritten
        return hidden_states.copy_(out)
    return out


HOOKS = [(_FUSED_MOE_TARGET, _fused_moe_around)]
