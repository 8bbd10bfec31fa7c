"""Nemotron-H's MoE block on the CPU runtime, as SGLang 0.5.23 computes it on CUDA.

Two steps of ``NemotronHMoE`` (models/nemotron_h.py) have no CPU version:

* **The router.** ``_forward_core_normal`` takes the router logits as ``torch.mm(hidden_states, gate.weight.t(),
  out_dtype=torch.float32)`` (a bf16 product with float32 output on CUDA); torch has ``aten::mm.dtype`` for CUDA
  only, so on CPU the first MoE layer stops (``NotImplementedError``). On CPU tensors the around hook runs the same
  steps with the logits as the float32 product (transformers' ``NemotronHTopkRouter``: ``F.linear`` of both in
  float32): shared expert, ``TopK`` (the capture site), experts.
* **The experts.** They are non-gated ReLU^2 MLPs (``activation="relu2"``, ``is_gated=False``:
  ``down(relu(up(x))^2)``); the CPU's ``fused_moe_native.moe_forward_native`` (``UnquantizedFusedMoEMethod.forward_cpu``)
  knows gated silu / gelu / situ only and refuses it (``Unsupported activation``). On CUDA the Triton runner
  (``moe_runner/triton_utils/fused_moe.py``) squares the ReLU of the up projection and its sum over the top-k is
  scaled by the runner config's ``routed_scaling_factor`` (``moe_sum_reduce``): Nemotron-H relies on it
  (``TopK`` leaves the weights unscaled unless the runner fuses it, which on CPU it does not). The around hook
  computes exactly that for the non-gated ReLU^2 case; every other case goes on to SGLang's function. An id of
  another rank's expert (``-1``, expert parallelism) adds zero, as the CUDA kernel writes it.

Checked against transformers' ``NemotronHMoE`` / ``NemotronHExperts`` in tests/test_cpu_mamba2.py; served, rows =
transformers' router top-k (tests/test_families.py ``nemotron_h``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MOE_CORE_TARGET = "sglang.srt.models.nemotron_h.NemotronHMoE._forward_core_normal"
_EXPERTS_TARGET = "sglang.srt.layers.moe.fused_moe_native.moe_forward_native"


def _moe_core_around(original, self, hidden_states):
    if hidden_states.is_cuda:
        return original(self, hidden_states)
    router_logits = F.linear(hidden_states.float(), self.gate.weight.float())
    shared_output = self.shared_experts(hidden_states) if self.shared_experts is not None else None
    topk_output = self.topk(hidden_states, router_logits)
    if self.use_latent_moe:
        hidden_states = self._apply_fc1_latent_proj(hidden_states)
    return self.experts(hidden_states, topk_output), shared_output


def relu2_experts(w13, w2, x, topk_ids, topk_weights, routed_scaling_factor=None, w13_bias=None, w2_bias=None):
    """sum_k weight_k * down_e(relu(up_e(x))^2) over each token's top-k experts e, times routed_scaling_factor;
    w13 [experts, intermediate, hidden] (the up projection alone: not gated), w2 [experts, hidden, intermediate].
    Float32 inside, the result in x's dtype."""
    out = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if e < 0:  # another rank's expert: adds zero
            continue
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        h = xf[rows] @ w13[e].float().t()
        if w13_bias is not None:
            h = h + w13_bias[e].float()
        h = torch.square(F.relu(h)) @ w2[e].float().t()
        if w2_bias is not None:
            h = h + w2_bias[e].float()
        out.index_add_(0, rows, h * topk_weights[rows, slots].float()[:, None])
    if routed_scaling_factor is not None:
        out = out * routed_scaling_factor
    return out.to(x.dtype)


def _experts_around(original, layer, x, topk_output, moe_runner_config):
    if x.is_cuda or moe_runner_config.activation != "relu2" or moe_runner_config.is_gated:
        return original(layer, x, topk_output, moe_runner_config)
    if moe_runner_config.apply_router_weight_on_input:
        raise NotImplementedError("sglang-r3 CPU runtime: ReLU^2 experts that weigh their input")
    # The expert weights UnquantizedFusedMoEMethod.create_weights registers on the layer (by name, as it does).
    return relu2_experts(layer.get_parameter("w13_weight"), layer.get_parameter("w2_weight"), x,
                         topk_output.topk_ids, topk_output.topk_weights, moe_runner_config.routed_scaling_factor,
                         getattr(layer, "w13_weight_bias", None), getattr(layer, "w2_weight_bias", None))


HOOKS = [(_MOE_CORE_TARGET, _moe_core_around), (_EXPERTS_TARGET, _experts_around)]
