"""The CPU-runtime gaps that stop SGLang from running more than one rank on a CPU host.

* ``init_model_parallel_group`` asks for pynccl unless the platform is NPU/XPU, and
  ``PyNcclCommunicator`` refuses a CPU device ("Expected a cuda device"); on CPU the groups run on
  torch.distributed's gloo, which is what SGLang's own CPU collectives use.
* ``ForwardBatch._pad_inputs_to_size`` (the DP-attention MLP-sync padding) asks the attention
  backend for ``get_cpu_graph_seq_len_fill_value`` (0.5.23; only the Intel AMX backend defines it) or
  ``get_cuda_graph_seq_len_fill_value`` (0.5.15; torch_native inherits a raising one); the padded
  requests' sequence length is 1 there, and 1 here (a padded row attends to one slot).
* 0.5.15's DP gather copies each rank's rows with a Triton kernel only (``memcpy_on_cpu``), and its groups'
  gather, reduce-scatter and all-to-all go through ops registered for CUDA only (``COLLECTIVES_0_5_15``).
* 0.5.15's MLP-sync padding of an EAGLE draft extend (``ForwardBatch._pad_inputs_to_size``: a rank with fewer
  requests than the longest gets dummy ones) pads ``extend_seq_lens`` with 0 and leaves ``extend_prefix_lens``
  unpadded, so torch_native's per-request loop (one prefix length per sequence) stops the scheduler; 0.5.23
  gives each dummy the draft extend's fixed width and prefix 0, and so does ``pad_draft_extend_as_0_5_23``.
(0.5.15's ``prepare_mlp_sync_batch`` also pins a host tensor: ``cuda_shims.unpinned``.)
"""

from __future__ import annotations

import torch

_TNA = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"


def groups_without_pynccl(original, *args, **kwargs):
    kwargs["use_pynccl"] = False  # CPU only: this hook is registered when CUDA is unavailable
    return original(*args, **kwargs)


def _seq_len_fill_value(self) -> int:
    return 1  # as IntelAMXBackend.get_cpu_graph_seq_len_fill_value


def add_seq_len_fill_value() -> None:
    """Give torch_native the method the MLP-sync padding calls; stop if SGLang grew its own."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_r3.seam.hooks import HookTargetError
    from sglang_r3.seam.manifest import check, by_target
    from sglang_r3.seam.release import seq_len_fill_method

    # 0.5.23's padding asks a CPU backend for the cpu_ method (only Intel AMX defines it); 0.5.15's asks every
    # backend for the cuda_ one, which torch_native inherits from a base class that raises.
    name = seq_len_fill_method()
    target = f"{_TNA}.{name}"
    entry = by_target().get(target)
    own = TorchNativeAttnBackend.__dict__.get(name)
    if own is _seq_len_fill_value:
        return
    bad = [(target, "not listed in the manifest")] if entry is None else check((entry,))
    if bad:
        raise HookTargetError(bad)
    setattr(TorchNativeAttnBackend, name, _seq_len_fill_value)


def memcpy_on_cpu(original, dst, src, dim, offset, sz, offset_src):
    """0.5.15's DP gather / scatter copies a rank's rows with a Triton kernel only (0.5.23 has a CPU branch,
    ``dp_attention.memcpy_cpu``, whose row copy this is): ``sz`` rows from ``src[offset:]`` to ``dst[0:]``
    (``offset_src``) or from ``src[0:]`` to ``dst[offset:]``, ``offset`` and ``sz`` in rows, as tensors."""
    assert dim == 0 and src.shape[1:] == dst.shape[1:]
    offset, sz = int(offset), int(sz)
    src_start, dst_start = (offset, 0) if offset_src else (0, offset)
    n = min(min(dst_start + sz, dst.shape[0]) - dst_start, min(src_start + sz, src.shape[0]) - src_start)
    if n > 0:
        dst[dst_start: dst_start + n].copy_(src[src_start: src_start + n])


# GroupCoordinator collectives 0.5.15 sends through ``sglang::reg_*`` ops registered for CUDA only, and the
# group's own torch.distributed call each has, which 0.5.23's CPU branch calls instead.
_GROUP = "sglang.srt.distributed.parallel_state.GroupCoordinator"
COLLECTIVES_0_5_15 = {"all_gather_into_tensor": "_all_gather_into_tensor",
                      "reduce_scatter_tensor": "_reduce_scatter_tensor",
                      "all_to_all_single": "_all_to_all_single"}


def _on_the_group(private: str):
    def around(original, self, output, input, *args, **kwargs):
        return getattr(self, private)(output, input)

    return around


def pad_draft_extend_as_0_5_23(original, self, model_runner, num_tokens, bs):
    """0.5.15's padding, then the dummy requests of a draft extend as 0.5.23 pads them: extend length the
    spec's fixed per-request width, prefix 0 (tensors and host lists alike)."""
    real = None if self.extend_seq_lens is None else self.extend_seq_lens.shape[0]
    original(self, model_runner, num_tokens, bs)
    spec = self.spec_info
    if real is None or real >= bs or spec is None or not self.forward_mode.is_draft_extend_v2():
        return
    width = spec.num_tokens_per_req if spec.num_tokens_per_req > 0 else 0
    self.extend_seq_lens[real:] = width  # the padded tensor 0.5.15 just built (zeros there)
    pre = self.extend_prefix_lens
    if pre is not None and pre.shape[0] < bs:
        self.extend_prefix_lens = torch.cat([pre, pre.new_zeros(bs - pre.shape[0])])
    # Rebound, never extended in place (as 0.5.23: other holders keep the unpadded lists).
    for name, value in (("extend_seq_lens_cpu", width), ("extend_prefix_lens_cpu", 0),
                        ("extend_logprob_start_lens_cpu", 0)):
        have = getattr(self, name)
        if have is not None and len(have) < bs:
            setattr(self, name, list(have) + [value] * (bs - len(have)))


def hooks():
    from sglang_r3.seam.release import dp_gather_has_cpu_path, pads_draft_extend_dummies

    out = [("sglang.srt.distributed.parallel_state.init_model_parallel_group", groups_without_pynccl)]
    if not dp_gather_has_cpu_path():
        out.append(("sglang.srt.layers.dp_attention.memcpy_triton", memcpy_on_cpu))
        out += [(f"{_GROUP}.{name}", _on_the_group(private)) for name, private in COLLECTIVES_0_5_15.items()]
    if not pads_draft_extend_dummies():
        out.append(("sglang.srt.model_executor.forward_batch_info.ForwardBatch._pad_inputs_to_size",
                    pad_draft_extend_as_0_5_23))
    return out
