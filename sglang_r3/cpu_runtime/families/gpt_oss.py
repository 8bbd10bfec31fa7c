"""gpt-oss on the CPU runtime: attention sinks in ``torch_native``.

SGLang's ``models/gpt_oss.py`` passes each layer's learned ``sinks`` (one logit per head, kept in bfloat16)
to its attention backend; the sliding-window layers' mask ``torch_native`` already has. ``torch_native``
takes no ``sinks``, so start-up asserts a backend that does (``handle_model_specific_adjustments``: triton,
fa3, ... -- all CUDA or AMX). Here:

* ``forward_extend`` / ``forward_decode`` take ``sinks`` and, for that call, the backend's
  ``scaled_dot_product_attention`` is :func:`sdpa_with_sinks`: the sink is one more logit in each head's
  softmax whose probability is dropped, as transformers' ``modeling_gpt_oss.eager_attention_forward``
  computes it. The per-request gather, causal and sliding-window masks stay SGLang's own.
* the start-up assertion counts ``torch_native`` as a backend with sinks, for gpt-oss on the CPU runtime only;
* its override (``model_overrides/gpt_oss.py``) picks the ``triton_kernel`` MoE runner whenever the
  triton_kernels package imports: on the CPU runtime those kernels cannot run (Triton has no CPU target here),
  so it is told they are unavailable and ``auto`` stays, which on CPU is ``moe_forward_native`` -- SGLang's
  clamped SwiGLU with expert biases, routed through the ``TopK`` capture site as every other family.

Checked against transformers' ``eager_attention_forward`` in tests/test_cpu_gpt_oss.py; served and compared
with transformers' router top-k in tests/test_families.py (``gpt_oss``).
"""

from __future__ import annotations

import contextvars
from typing import Optional

import torch

from sglang_r3.seam.swap import swapped

_TNA = "sglang.srt.layers.attention.torch_native_backend"
_GPT_OSS = "GptOssForCausalLM"
_SINKS: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar("sglang_r3_sinks", default=None)


def sdpa_with_sinks(query, key, value, sinks, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention``'s arguments as torch_native passes them ([1, heads, len, dim]; a boolean
    ``attn_mask``, True = attend), plus ``sinks`` [heads]: softmax over [scores | sink], the sink column dropped."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(group, dim=-3), value.repeat_interleave(group, dim=-3)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if is_causal:  # top-left aligned, as scaled_dot_product_attention's is_causal
        attn_mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return torch.matmul(probs.to(value.dtype), value)


def _sdpa_around(original, query, key, value, *args, **kwargs):
    sinks = _SINKS.get()
    if sinks is None:
        return original(query, key, value, *args, **kwargs)
    return sdpa_with_sinks(query, key, value, sinks, *args, **kwargs)


def _with_sinks(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
    if sinks is None:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    token = _SINKS.set(sinks)
    try:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    finally:
        _SINKS.reset(token)


def as_cpu_backend(backends_of):
    """SGLang's ``attention_backends_of`` answering torch_native as ``intel_amx``, the CPU backend the per-architecture
    assertions list (used, for one call, where torch_native is proven to run the model's attention: here and
    cpu_runtime/families/gemma4.py)."""
    def attention_backends_of(view):
        return tuple("intel_amx" if b == "torch_native" else b for b in backends_of(view))

    return attention_backends_of


def _adjustments_around(original, server_args):
    """``handle_model_specific_adjustments`` (0.5.23; 0.5.15: the ServerArgs method): for gpt-oss, its backend
    assertion sees torch_native as the CPU backend with sinks (``intel_amx``) for the call; nothing else in it
    reads the backends for this model."""
    import importlib

    from sglang_r3.seam.release import model_adjustments

    # 0.5.15: ServerArgs._resolved_attention_backends imports it from overrides at each call
    owner = importlib.import_module(model_adjustments().backends_module)
    if architecture(server_args) != _GPT_OSS:
        return original(server_args)
    with swapped(owner, "attention_backends_of", as_cpu_backend(owner.attention_backends_of)):
        return original(server_args)


def _no_triton_kernels(original):
    return torch.cuda.is_available() and original()


def architecture(server_args) -> Optional[str]:
    from sglang_r3.seam.release import model_config_of

    try:
        return model_config_of(server_args).hf_config.architectures[0]
    except Exception:  # no readable config: SGLang's own call reports it
        return None


def hooks():
    from sglang_r3.seam.release import model_adjustments

    adjustments = model_adjustments()
    return [
        (f"{_TNA}.scaled_dot_product_attention", _sdpa_around),
        (f"{_TNA}.TorchNativeAttnBackend.forward_extend", _with_sinks),
        (f"{_TNA}.TorchNativeAttnBackend.forward_decode", _with_sinks),
        (adjustments.target, _adjustments_around),
        (f"{adjustments.triton_kernels_module}.is_triton_kernels_available", _no_triton_kernels),
    ]
