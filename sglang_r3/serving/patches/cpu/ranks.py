"""Two CPU-runtime gaps that stop SGLang 0.5.23 from running more than one rank on a CPU host.

* ``init_model_parallel_group`` asks for pynccl unless the platform is NPU/XPU, and
  ``PyNcclCommunicator`` refuses a CPU device ("Expected a cuda device"); on CPU the groups run on
  torch.distributed's gloo, which is what SGLang's own CPU collectives use.
* ``ForwardBatch._pad_inputs_to_size`` (the DP-attention MLP-sync padding) asks the attention
  backend for ``get_cpu_graph_seq_len_fill_value``, which only the Intel AMX backend defines; the
  padded requests' sequence length is 1 there, and 1 here (a padded row attends to one slot).
"""

from __future__ import annotations

_TNA = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
FILL_TARGET = f"{_TNA}.get_cpu_graph_seq_len_fill_value"


def groups_without_pynccl(original, *args, **kwargs):
    kwargs["use_pynccl"] = False  # CPU only: this hook is registered when CUDA is unavailable
    return original(*args, **kwargs)


def _seq_len_fill_value(self) -> int:
    return 1  # as IntelAMXBackend.get_cpu_graph_seq_len_fill_value


def add_seq_len_fill_value() -> None:
    """Give torch_native the method the MLP-sync padding calls; stop if SGLang grew its own."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_r3.serving.patches.hooks import HookTargetError
    from sglang_r3.serving.patches.manifest import problem

    why = problem(FILL_TARGET, None, kind="adds")
    if why is not None:
        raise HookTargetError([(FILL_TARGET, why)])
    own = TorchNativeAttnBackend.__dict__.get("get_cpu_graph_seq_len_fill_value")
    if own is _seq_len_fill_value:
        return
    if own is not None or hasattr(TorchNativeAttnBackend, "get_cpu_graph_seq_len_fill_value"):
        raise HookTargetError([(FILL_TARGET, "SGLang now defines it: sglang-r3's CPU stand-in would replace it")])
    TorchNativeAttnBackend.get_cpu_graph_seq_len_fill_value = _seq_len_fill_value


HOOKS = [
    ("sglang.srt.distributed.parallel_state.init_model_parallel_group", groups_without_pynccl),
]
