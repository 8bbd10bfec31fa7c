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

The CPU runtime serves one KV pool (``--disable-hybrid-swa-memory``), whose one head shape cannot hold sliding
and full-attention layers of different head_dim / kv heads (published Gemma-4 26B-A4B: 256 / 8 and 512 / 2):
start-up refuses that there (patches/startup_checks.py); a GPU serves it with SGLang's hybrid SWA pool.

Served and compared with transformers' router top-k in tests/test_families.py (``gemma4``).
"""

from __future__ import annotations

import torch

from sglang_r3.serving.patches.cpu.gpt_oss import architecture, as_cpu_backend
from sglang_r3.serving.patches.swap import swapped

_ARCHITECTURES = ("Gemma4ForConditionalGeneration",)
_ROUTER_TARGET = "sglang.srt.models.gemma4_causal.Gemma4Router.forward"
_ADJUSTMENTS_TARGET = "sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments"


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


def hooks(on_0_5_15: bool):
    """AROUND hooks (SGLang 0.5.23; Gemma-4 is not served on 0.5.15's CPU runtime)."""
    if on_0_5_15:
        return []
    return [(_ROUTER_TARGET, _router_around), (_ADJUSTMENTS_TARGET, _adjustments_around)]
