"""SGLang 0.5.15's EAGLE v2 path on the CPU runtime (installed only on CPU, only under 0.5.15).

0.5.23 sends each speculative kernel to an ``sgl_kernel.*_cpu`` op on CPU (``spec_ops`` gives their torch
versions); 0.5.15 has no CPU branch anywhere: its kernels are Triton (no driver on a CPU host) or sgl-kernel
CUDA ops, and two of its wrappers silently do nothing off-GPU (``verify_tree_greedy_func`` returns its
inputs, ``assign_extend_cache_locs_func`` returns None). Here each entry point 0.5.15's EagleDraftWorker /
EAGLEWorkerV2 (and MultiLayerEagleWorkerV2) reaches goes to the same ``spec_ops`` implementation,
with the arguments 0.5.23's CPU route hands it, so both releases run EAGLE on CPU alike:

* Python wrappers: HookRegistry AROUND hooks (``hooks()``); SGLang's registry also rebinds the copies other
  modules took with ``from ... import``.
* Triton kernels launched as ``kernel[grid](...)``: a hook (a function) has no ``[grid]``, so the module
  attribute the launch site reads is replaced by a ``_Launch`` stand-in (``install_stand_ins()``), each
  through ``_stand_in``, which first checks the target against the manifest (kind ``replaces``: the kernel's
  own parameters). Each stand-in's grid is one program per request / per index, which its tensors' shapes
  already say, so the grid is ignored.
* Verify is greedy (0.5.23: ``_verify_uses_greedy(is_cpu=True)``): the sampling kernels are CUDA-only.
* The drafted tree is built as 0.5.15's ``build_tree_kernel_efficient`` builds it, with the CPU tree kernel and
  a QLEN_ONLY mask ([bs, n, n], 0.5.23's ``default_tree_mask_mode()`` on CPU), the one ``cpu_runtime/ops/attention.py``'s
  verify reads; 0.5.15's workers ask FULL_MASK, whose rows carry every prefix column.
* Idle verify inputs (DP-attention ranks without requests) and multi-layer MTP's chain parents on the CPU,
  not ``device="cuda"``.
"""

from __future__ import annotations

from typing import Callable, List, Tuple

from sglang_r3.cpu_runtime.ops.spec_ops import IMPLEMENTATIONS as _CPU
from sglang_r3.seam.swap import swapped

_SPEC = "sglang.srt.speculative"
_CACHE_LOCS = f"{_SPEC}.triton_ops.cache_locs"
_EAGLE_UTILS = f"{_SPEC}.eagle_utils"


# -- Python wrappers (HookRegistry AROUND) ------------------------------------------------------------


def _assign_req_to_token_pool(original, req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                              batch_size):
    # Every speculative decode step's KV slots into req_to_token (eagle_prepare_for_decode).
    _CPU["assign_req_to_token_pool_cpu"](req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                         req_to_token.shape[1])


def _assign_extend_cache_locs(original, req_pool_indices, req_to_token, start_offset, end_offset, batch_size,
                              draft_token_num, device):
    # The verify's out_cache_loc; 0.5.15 returns None off CUDA/NPU. int64, as 0.5.23's CPU branch.
    import torch

    out_cache_loc = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
    _CPU["assign_extend_cache_locs_cpu"](req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                         req_to_token.shape[1])
    return out_cache_loc


def _verify_tree_greedy(original, predicts, accept_index, accept_token_num, candidates, retrieve_index,
                        retrieve_next_token, retrieve_next_sibling, target_predict, topk=-1):
    # 0.5.15 has no CPU branch and returns its inputs untouched (every draft rejected, predict all 0).
    _CPU["verify_tree_greedy_cpu"](predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                   retrieve_next_token, retrieve_next_sibling, target_predict)
    return predicts, accept_index, accept_token_num


def _build_tree(original, bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, seq_lens_sum, topk,
                spec_steps, num_verify_tokens, tree_mask_mode=None, tree_mask_buf=None, position_buf=None):
    # 0.5.15's wrapper calls sgl-kernel's CUDA build_tree_kernel_efficient on every platform but NPU / XPU (on
    # CPU the name is not even imported). This is its body as it runs for a QLEN_ONLY mask, the mode 0.5.23's
    # default_tree_mask_mode() gives on CPU whatever the worker asks (0.5.15's ask FULL_MASK), with 0.5.23's
    # build_tree_kernel_efficient_cpu, which takes the kernel's arguments.
    import torch
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    draft_tokens = torch.cat((bonus_tokens.unsqueeze(1), draft_tokens), dim=1).flatten()
    bs, device, n = seq_lens.numel(), seq_lens.device, num_verify_tokens
    if tree_mask_buf is not None:
        tree_mask = tree_mask_buf
        tree_mask.fill_(True)
    else:
        tree_mask = torch.full((n * bs * n,), True, dtype=torch.bool, device=device)
    retrieve_index, retrieve_next_token, retrieve_next_sibling = torch.full((3, bs, n), -1, device=device,
                                                                            dtype=torch.long)
    positions = position_buf if position_buf is not None else torch.empty((bs * n,), device=device,
                                                                           dtype=torch.long)
    _CPU["build_tree_kernel_efficient_cpu"](parent_list, top_scores_index, seq_lens, tree_mask, positions,
                                            retrieve_index, retrieve_next_token, retrieve_next_sibling, topk,
                                            spec_steps, n, int(TreeMaskMode.QLEN_ONLY))
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, draft_tokens


def _greedy_verify(original, verify_input, batch, *args, **kwargs):
    # eagle_sample's one test of is_all_greedy picks the argmax verify, which 0.5.23 takes on CPU whatever the
    # requests' sampling (its rejection-sampling kernels are CUDA / Triton); the flag is restored after.
    info = batch.sampling_info
    if info is None or info.is_all_greedy:
        return original(verify_input, batch, *args, **kwargs)
    with swapped(info, "is_all_greedy", True):
        return original(verify_input, batch, *args, **kwargs)


def _idle_verify_input(original, cls, topk, spec_steps, num_verify_tokens):
    # 0.5.15 builds it on device="cuda"; 0.5.23's body, on the CPU.
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    def no_rows(n):
        return torch.full((0, n), -1, dtype=torch.long)

    return cls(
        draft_token=torch.empty((0,), dtype=torch.long),
        custom_mask=torch.full((0,), True, dtype=torch.bool),
        positions=torch.empty((0,), dtype=torch.int64),
        retrieve_index=no_rows(num_verify_tokens),
        retrieve_next_token=no_rows(num_verify_tokens),
        retrieve_next_sibling=no_rows(num_verify_tokens),
        retrieve_cum_len=None,
        topk=topk,
        draft_token_num=num_verify_tokens,
        spec_steps=spec_steps,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=0,
        seq_lens_cpu=torch.empty((0,), dtype=torch.int64),
    )


def _rotate_input_ids(original, input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index=None):
    # Multi-layer MTP's draft-extend chain (MultiLayerEagleWorkerV2).
    _CPU["rotate_input_ids_cpu"](input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index)
    return input_ids


def _multi_layer_draft_on_cpu(original, self, *args, **kwargs):
    # Multi-layer MTP's draft_forward builds its chain's parent rows with device="cuda" (0.5.23: the device of
    # the tree it extends); for this call its module's ``torch.full`` puts "cuda" tensors on the CPU.
    from sglang.srt.speculative import multi_layer_eagle_worker_v2 as module

    with swapped(module, "torch", _CudaFullOnCpu(module.torch)):
        return original(self, *args, **kwargs)


class _CudaFullOnCpu:
    def __init__(self, torch_module):
        self._torch = torch_module

    def full(self, *args, device=None, **kwargs):
        return self._torch.full(*args, device="cpu" if str(device) == "cuda" else device, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def hooks() -> List[Tuple[str, Callable]]:
    """(target, AROUND hook) for 0.5.15's Python entry points."""
    return [
        (f"{_CACHE_LOCS}.assign_req_to_token_pool_func", _assign_req_to_token_pool),
        (f"{_CACHE_LOCS}.assign_extend_cache_locs_func", _assign_extend_cache_locs),
        (f"{_EAGLE_UTILS}.verify_tree_greedy_func", _verify_tree_greedy),
        (f"{_EAGLE_UTILS}.build_tree_kernel_efficient", _build_tree),
        (f"{_EAGLE_UTILS}.eagle_sample", _greedy_verify),
        (f"{_SPEC}.eagle_info.EagleVerifyInput.create_idle_input", _idle_verify_input),
        (f"{_SPEC}.triton_ops.multi_layer_eagle.rotate_input_ids_triton", _rotate_input_ids),
        (f"{_SPEC}.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker.draft_forward", _multi_layer_draft_on_cpu),
    ]


# -- Triton kernels launched as kernel[grid](...) (module attributes replaced) -----------------------


class _Launch:
    """A stand-in for a Triton kernel at its launch site: ``stand_in[grid](*args)`` calls ``fn(*args)``.
    ``__wrapped__`` is the kernel it replaced (the manifest checks the kernel's parameters through it)."""

    def __init__(self, kernel, fn: Callable):
        self.__wrapped__ = kernel
        self._fn = fn

    def __getitem__(self, grid):
        return self._fn

    def __repr__(self):
        return f"<sglang-r3 CPU stand-in for Triton kernel {getattr(self.__wrapped__, '__name__', '?')}>"


def _draft_cache_locs(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps):
    _CPU["assign_draft_cache_locs_contiguous_cpu"](req_pool_indices, req_to_token, seq_lens, out_cache_loc,
                                                   pool_len, topk, num_steps)


def _fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    _CPU["fill_bonus_tokens_cpu"](accept_tokens, accept_lens, bonus_tokens, accept_stride)


def _extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len,
                       bs_upper):
    _CPU["assign_extend_cache_locs_cpu"](req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                         pool_len)


def _fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc, size_upper):
    _CPU["fill_accept_out_cache_loc_cpu"](accept_index, out_cache_loc, accept_out_cache_loc)


def _copy_all_layer_kv_cache(data_ptrs, strides, tgt_loc, src_loc, num_locs, num_locs_upper, BYTES_PER_TILE=None,
                             **launch_options):
    # The KV pool's warm-up at start-up (a pool built for speculation) and every move_kv_cache (tree drafting's
    # accepted path); as 0.5.23's copy_all_layer_kv_cache_func on CPU, the first num_locs locations.
    _CPU["copy_all_layer_kv_cache_cpu"](data_ptrs, strides, tgt_loc[:num_locs], src_loc[:num_locs])


# target (the attribute the launch site reads when it runs) -> what launches in its place
STAND_INS = {
    # base_spec_worker.prepare_for_draft imports it from its module at each call
    f"{_CACHE_LOCS}.assign_draft_cache_locs_contiguous": _draft_cache_locs,
    f"{_SPEC}.eagle_worker_v2.fill_bonus_tokens": _fill_bonus_tokens,
    f"{_SPEC}.multi_layer_eagle_worker_v2.fill_bonus_tokens": _fill_bonus_tokens,
    # move_accept_tokens_to_target_kvcache (tree drafting) launches spec_utils' copies
    f"{_SPEC}.spec_utils.assign_extend_cache_locs": _extend_cache_locs,
    f"{_SPEC}.spec_utils.fill_accept_out_cache_loc": _fill_accept_out_cache_loc,
    "sglang.srt.mem_cache.memory_pool.copy_all_layer_kv_cache_tiled": _copy_all_layer_kv_cache,
}


def _stand_in(target: str, fn: Callable) -> None:
    """Replace the Triton kernel at ``target`` (a module attribute) by a stand-in launching ``fn`` once its
    manifest entry checks out (still a Triton kernel, with the parameters we launch it with), or stop start-up
    naming it."""
    from sglang_r3.seam.hooks import HookTargetError
    from sglang_r3.seam.manifest import by_target, check
    from sglang_r3.seam.resolve import resolve

    entry = by_target().get(target)
    if entry is None or entry.kind != "replaces":
        raise HookTargetError([(target, "not listed in the manifest as replaced (kind 'replaces')")])
    bad = check((entry,))
    if bad:
        raise HookTargetError(bad)
    module_name, _, name = target.rpartition(".")
    module = resolve(module_name)
    current = getattr(module, name, None)
    if isinstance(current, _Launch) and current._fn is fn:
        return  # installed already
    setattr(module, name, _Launch(current, fn))


def install_stand_ins() -> None:
    for target, fn in STAND_INS.items():
        _stand_in(target, fn)
