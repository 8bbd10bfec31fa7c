"""LFM2-MoE's short convolutions on the CPU runtime.

``Lfm2MoeShortConv.forward`` (SGLang 0.5.23 ``models/lfm2_moe.py``) runs its depthwise causal convolution through
the module globals ``causal_conv1d_fn`` (prefill) and ``causal_conv1d_update`` (decode), imported from
``layers/attention/mamba/causal_conv1d.py``: on a host without CUDA both go to Triton kernels, which have no CPU
target (the first prefill stops: "0 active drivers"). The fused LFM2 kernels it prefers are CUDA-only and decline
CPU tensors themselves (``can_use_fused_lfm_short_conv``).

An AROUND hook binds the two names to the torch convolutions Mamba-2 uses on the CPU runtime (cpu_runtime/ops/mamba2.py, over
cpu_runtime/ops/gdn.py's, checked against transformers' in tests/test_cpu_gdn.py and tests/test_cpu_mamba2.py) for the call, on
CPU tensors only, and runs SGLang's own forward: its projections, gating and conv-state slots. LFM2-MoE's
convolution has no activation (``activation=None``), which those functions take. Served against transformers'
Lfm2MoeForCausalLM in tests/test_families.py (``lfm2_moe``).
"""

from __future__ import annotations

from sglang_r3.cpu_runtime.ops.mamba2 import bound_globals, causal_conv1d_fn, causal_conv1d_update

_MODULE = "sglang.srt.models.lfm2_moe"
_FORWARD_TARGET = f"{_MODULE}.Lfm2MoeShortConv.forward"
_STAND_INS = {"causal_conv1d_fn": causal_conv1d_fn, "causal_conv1d_update": causal_conv1d_update}


def _forward_around(original, self, hidden_states, forward_batch):
    if hidden_states.is_cuda:
        return original(self, hidden_states, forward_batch)
    with bound_globals(_MODULE, _STAND_INS):
        return original(self, hidden_states, forward_batch)


HOOKS = [(_FORWARD_TARGET, _forward_around)]
