"""Llama 4 attention on the CPU runtime, as SGLang 0.5.23 computes it on CUDA.

``Llama4Attention.forward`` (models/llama4.py) relies on two CUDA behaviours its other branches lack:

* RoPE: it calls ``self.rotary_emb(positions, q_view, k_view)`` and drops the result (``q_out_unused``),
  because the CUDA kernel rotates the views of the qkv buffer in place. On CPU ``RotaryEmbedding`` runs
  ``forward_native``, which returns new tensors: every RoPE layer would attend without positions.
* QK norm: outside CUDA it casts q and k to bfloat16 for the (weightless) RMSNorm and keeps them bfloat16,
  so a float32 model's ``o_proj`` fails (``expected m1 and m2 to have the same dtype``), and the norm would
  not be the model dtype's anyway. On CUDA ``apply_qk_norm`` (models/utils.py: a fused kernel or the RMSNorm,
float32 inside) keeps q and k in the model dtype.

On CPU the around hook runs the same steps in the same order with those two CUDA semantics: RoPE's
returned q/k are used, the norm is ``x * rsqrt(mean(x^2) + eps)`` in float32 (cast back), then the NoPE
layers' temperature tuning (``_get_attn_scale``), attention and ``o_proj``.

Its experts weight the router's score on the input (``apply_router_weight_on_input``, top-1, as
transformers' ``Llama4TextMoe``: ``experts(x * sigmoid(score))``), which the CPU's ``moe_forward_native``
refuses (``NotImplementedError``). For top-1 that is the same call on ``x * weight`` with weight 1 after it,
as SGLang's CUDA ``fused_experts`` does it.
"""

from __future__ import annotations

import torch

_TARGET = "sglang.srt.models.llama4.Llama4Attention.forward"


def _rms(x: torch.Tensor, head_dim: int, eps: float) -> torch.Tensor:
    shape = x.shape
    h = x.reshape(-1, head_dim).float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.to(x.dtype).reshape(shape)


def _forward_around(original, self, positions, hidden_states, forward_batch):
    if hidden_states.is_cuda:
        return original(self, positions, hidden_states, forward_batch)
    qkv, _ = self.qkv_proj(hidden_states)
    q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
    if self.rotary_emb is not None:
        q, k = self.rotary_emb(positions, q, k)
    if self.qk_norm is not None:
        eps = self.qk_norm.variance_epsilon
        q, k = _rms(q, self.head_dim, eps), _rms(k, self.head_dim, eps)
    if self.attn_temperature_tuning and not self.use_rope:
        q = (q * self._get_attn_scale(positions)).to(q.dtype)
    attn_output = self.attn(q.contiguous(), k.contiguous(), v.contiguous(), forward_batch)
    output, _ = self.o_proj(attn_output)
    return output


def _moe_forward_native_around(original, layer, x, topk_output, moe_runner_config):
    if not moe_runner_config.apply_router_weight_on_input:
        return original(layer, x, topk_output, moe_runner_config)
    import dataclasses

    weights = topk_output.topk_weights
    if weights.shape[-1] != 1:  # as fused_experts: only top-1 weighs the input
        raise NotImplementedError("apply_router_weight_on_input with top-k > 1")
    x = x * weights.to(x.dtype)
    topk_output = topk_output._replace(topk_weights=torch.ones_like(weights))
    config = dataclasses.replace(moe_runner_config, apply_router_weight_on_input=False)
    return original(layer, x, topk_output, config)


HOOKS = [(_TARGET, _forward_around),
         ("sglang.srt.layers.moe.fused_moe_native.moe_forward_native", _moe_forward_native_around)]
