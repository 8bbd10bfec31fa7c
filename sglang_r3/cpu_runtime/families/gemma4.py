"""Gemma-4 on the CPU runtime: its router's input scale, and torch_native as its attention backend.

* ``Gemma4Router.forward`` (models/gemma4_causal.py): the router normalises its input, multiplies it by a learned
  per-dimension ``scale`` and by ``hidden_size ** -0.5``, then projects. SGLang folds both factors into its norm's
  ``weight`` (``fuse_scale``) and builds that norm ``with_scale=False``; CUDA's ``rmsnorm(x, weight)`` applies the
  weight anyway, but ``Gemma4RMSNorm.forward_native`` (what a CPU without AMX runs) skips a norm's weight when
  ``with_scale`` is off. The router then sees an unscaled input: other logits, so other experts where ``scale``
  is not uniform (half the (token, layer) pairs of the test checkpoint, from the first token on) and other
  routing weights everywhere. On CPU tensors this hook normalises with the fused weight, as CUDA does.
* The start-up assertion (``handle_model_specific_adjustments``: trtllm_mha, triton, fa4, ... -- CUDA or AMX)
  counts torch_native as the CPU backend it lists (``intel_amx``): torch_native runs Gemma-4's attention as SGLang
  hands it over (scaling 1, the sliding window as a mask), which the served forward checks.
* An image's tokens attend to each other both ways in the sliding-window layers, causally in the full-attention
  layers: transformers 5.19's ``create_masks_for_vision_model`` (modeling_gemma4.py; sliding layers
  AND(window, OR(causal, same image)), full layers causal). ``Gemma4ForConditionalGeneration.prepare_attn_masks``
  (models/gemma4_mm.py) builds such a mask for the Triton backend only and logs a fall back to causal attention
  for any other, torch_native included: the image's rows then differ from the checkpoint's model. Here, on the CPU
  runtime, it records each request's image spans (SGLang's own rule: an image wholly inside this extend, as
  its Triton path takes them), and torch_native's sliding-window mask opens each span's upper triangle.

The CPU runtime serves one KV pool (``--disable-hybrid-swa-memory``), whose one head shape cannot hold sliding
and full-attention layers of different head_dim / kv heads (published Gemma-4 26B-A4B: 256 / 8 and 512 / 2):
start-up refuses that there (refusals/startup.py); a GPU serves it with SGLang's hybrid SWA pool.

Served and compared with transformers' router top-k in tests/test_families.py (``gemma4``).
"""

from __future__ import annotations

import torch

# Set on an image item whose span a prefill chunk boundary cut (served causally; adapter/gemma4_vision.py refuses its
# request's rows).
SPLIT = "_sglang_r3_image_split"

from sglang_r3.cpu_runtime.families.gpt_oss import architecture, as_cpu_backend
from sglang_r3.seam.swap import swapped

_ARCHITECTURES = ("Gemma4ForConditionalGeneration",)
_ROUTER_TARGET = "sglang.srt.models.gemma4_causal.Gemma4Router.forward"
_ADJUSTMENTS_TARGET = "sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments"
_MASKS_TARGET = "sglang.srt.models.gemma4_mm.Gemma4ForConditionalGeneration.prepare_attn_masks"
_EXTEND_TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend"
# The backend attribute holding the last image prefill's spans, beside the req_pool_indices tensor of its batch (the
# one forward_extend hands torch_native): a later forward brings another tensor, so stale spans are never read.
_SPANS = "_sglang_r3_image_spans"


def _router_around(original, self, x):
    if x.is_cuda:
        return original(self, x)
    if not self._scale_fused:
        self.fuse_scale()
    norm = self.norm
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps)
    logits, _ = self.proj((h * norm.weight.float()).type_as(x))
    return logits


def _adjustments_around(original, server_args):
    from sglang.srt.arg_groups import model_hook

    if architecture(server_args) not in _ARCHITECTURES:
        return original(server_args)
    with swapped(model_hook, "attention_backends_of", as_cpu_backend(model_hook.attention_backends_of)):
        return original(server_args)


def image_spans(forward_batch) -> list:
    """Per request of an extend batch, the (first, last) positions of each image wholly inside this extend:
    the spans ``prepare_attn_masks`` opens for Triton (video and audio stay causal there and in transformers). An
    image the extend cuts is marked (SPLIT): served causally, its request's rows are refused."""

    spans = []
    for i, (prefix, length) in enumerate(zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu)):
        mm = forward_batch.mm_inputs[i] if forward_batch.mm_inputs else None
        inside = []
        for item in (mm.mm_items if mm is not None else ()):
            for b, e in item.offsets if item.is_image() else ():
                if b >= prefix and e < prefix + length:
                    inside.append((int(b), int(e)))
                elif e >= prefix and b < prefix + length:
                    setattr(item, SPLIT, True)
        spans.append(inside)
    return spans


def _masks_around(original, self, forward_batch, input_ids, mask_dtype):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    backend = getattr(backend, "prefill_backend", backend)
    if input_ids.is_cuda or not isinstance(backend, TorchNativeAttnBackend):
        return original(self, forward_batch, input_ids, mask_dtype)
    text_config = getattr(self.config, "text_config", None)  # (transformers Gemma4Config)
    if getattr(text_config, "use_bidirectional_attention", None) != "vision":
        return None  # transformers masks such a model's images causally too
    setattr(backend, _SPANS, (forward_batch.req_pool_indices, image_spans(forward_batch)))


def sliding_mask_with_images(spans, **mask_args):
    """torch_native's sliding-window mask for one request (query and key positions from 0), each image span's
    upper triangle opened: AND(window, OR(causal, same image)) as transformers' sliding layers mask."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    mask = TorchNativeAttnBackend._make_sliding_window_mask(**mask_args)
    for first, last in spans:
        n = last + 1 - first
        mask[first:last + 1, first:last + 1] |= torch.ones(n, n, dtype=torch.bool, device=mask.device).triu(1)
    return mask


def _extend_around(original, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                   extend_prefix_lens, extend_seq_lens, encoder_lens=None, **kwargs):
    args = (self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens,
            extend_seq_lens, encoder_lens)
    batch, spans = getattr(self, _SPANS, (None, None))
    window = kwargs.get("sliding_window_size")
    if batch is not req_pool_indices or window is None or window < 0 or not any(spans):
        return original(*args, **kwargs)  # full-attention layers stay causal, as transformers'
    per_request = iter(spans)  # the loop builds one sliding mask per request, in batch order
    self._make_sliding_window_mask = lambda **mask_args: sliding_mask_with_images(next(per_request), **mask_args)
    try:
        return original(*args, **kwargs)
    finally:
        del self._make_sliding_window_mask  # the class's staticmethod again


def hooks(model_ports: bool):
    """AROUND hooks (SGLang 0.5.23, ``release.cpu_model_ports_apply``; Gemma-4 is not served on 0.5.15's CPU
    runtime)."""
    if not model_ports:
        return []
    return [(_ROUTER_TARGET, _router_around), (_ADJUSTMENTS_TARGET, _adjustments_around),
            (_MASKS_TARGET, _masks_around), (_EXTEND_TARGET, _extend_around)]
