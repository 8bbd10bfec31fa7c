"""Torch stand-ins for sgl-kernel's ``*_cpu`` speculative/KV ops.

SGLang's CPU code paths call ``torch.ops.sgl_kernel.<name>_cpu`` (through the
python wrappers in ``sgl_kernel/speculative.py`` and ``sgl_kernel/kvcacheio.py``),
but those ops are only compiled into the CPU build of sgl-kernel; the CUDA
wheel installed here registers none of them. We register each missing op in
the ``sgl_kernel`` namespace with ``torch.library`` so the unmodified wrappers
work. Semantics follow sgl-kernel's ``csrc/cpu/spec.cpp`` / ``kvcache.cpp`` (and
the Triton twins in ``sglang/kernels/ops/speculative``). Batches are small on
this path, so per-request python loops are fine; anything vectorisable is.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Dict, Optional, Tuple

import torch

_NS = "sgl_kernel"
_lib: Optional[torch.library.Library] = None  # kept alive: dropping it unregisters the ops


def _assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    starts, ends, rows = start_offset.tolist(), end_offset.tolist(), req_pool_indices.tolist()
    off = 0
    for row, s, e in zip(rows, starts, ends):
        n = e - s
        if n > 0:
            req_to_token[row, s:e] = out_cache_loc[off : off + n].to(req_to_token.dtype)
        off += n


def _assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    starts, ends, rows = start_offset.tolist(), end_offset.tolist(), req_pool_indices.tolist()
    off = 0
    for row, s, e in zip(rows, starts, ends):
        n = e - s
        if n > 0:
            out_cache_loc[off : off + n] = req_to_token[row, s:e].to(out_cache_loc.dtype)
        off += n


def _assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps):
    n = topk * num_steps
    bs = req_pool_indices.numel()
    if bs == 0:
        return
    cols = seq_lens.to(torch.int64).view(-1, 1) + torch.arange(n, device=seq_lens.device).view(1, -1)
    rows = req_pool_indices.to(torch.int64).view(-1, 1)
    out_cache_loc.view(bs, n).copy_(req_to_token[rows, cols].to(out_cache_loc.dtype))


def _build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    # Row b*topk+tk: request b's prefix, then candidate tk's draft slots (laid
    # out by assign_draft_cache_locs_contiguous at seq_len + tk*num_steps).
    num_seqs = req_pool_indices.numel()
    out = torch.zeros((num_seqs * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b, (row, sl) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        src = req_to_token[row]
        for tk in range(topk):
            dst = out[b * topk + tk]
            dst[:sl] = src[:sl]
            start = sl + tk * num_steps
            dst[sl : sl + num_steps] = src[start : start + num_steps]
    return out


def _fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    bs = accept_lens.numel()
    idx = torch.arange(bs, device=accept_lens.device, dtype=torch.int64) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def _fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat > -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def _verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict
):
    bs, num_draft = candidates.shape
    num_spec_step = accept_index.shape[1]
    cand = candidates.tolist()
    ri = retrive_index.tolist()
    rnt = retrive_next_token.tolist()
    rns = retrive_next_sibling.tolist()
    tp = target_predict.reshape(-1).tolist()
    for bx in range(bs):
        last = ri[bx][0]
        accept_index[bx, 0] = last
        n_correct = 0
        cur = 0
        for _ in range(1, num_spec_step):
            cur = rnt[bx][cur]
            while cur != -1:
                draft_idx = ri[bx][cur]
                target_tok = tp[last]
                if cand[bx][cur] == target_tok:
                    predicts[last] = target_tok
                    n_correct += 1
                    accept_index[bx, n_correct] = draft_idx
                    last = draft_idx
                    break
                cur = rns[bx][cur]
            if cur == -1:
                break
        accept_token_num[bx] = n_correct
        predicts[last] = tp[last]


def _build_tree_kernel_efficient_cpu(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    if tree_mask_mode == 2:
        raise NotImplementedError("QLEN_ONLY_BITPACKING tree masks are not supported on CPU")
    bs = parent_list.shape[0]
    parents = parent_list.tolist()
    sel = selected_index.tolist()
    seq_lens = verified_seq_len.tolist()
    n = draft_token_num
    ri = retrive_index.view(bs, n)
    rnt = retrive_next_token.view(bs, n).tolist()
    rns = retrive_next_sibling.view(bs, n).tolist()
    mask_off = 0  # FULL_MASK rows carry each request's seq_len prefix columns
    for bid in range(bs):
        off = bid * n
        seq_len = seq_lens[bid]
        s = sel[bid]
        par = parents[bid]
        positions[off] = seq_len
        ri[bid] = torch.arange(off, off + n, dtype=ri.dtype)
        for i in range(n - 1, 0, -1):
            parent_tb_idx = s[i - 1] // topk
            parent_position = 0
            if parent_tb_idx > 0:
                parent_token_idx = par[parent_tb_idx]
                parent_position = n  # not found: skip this node
                for p, tok in enumerate(s):
                    if tok == parent_token_idx:
                        parent_position = p + 1
                        break
            if parent_position == n:
                continue
            if rnt[bid][parent_position] == -1:
                rnt[bid][parent_position] = i
            else:
                rns[bid][i] = rnt[bid][parent_position]
                rnt[bid][parent_position] = i
        if tree_mask_mode == 1:  # QLEN_ONLY: [bs, n, n]
            rows = tree_mask.view(bs, n, n)[bid]
        else:  # FULL_MASK: per request [n, seq_len + n]
            rows = tree_mask[mask_off : mask_off + n * (seq_len + n)].view(n, seq_len + n)[:, seq_len:]
            mask_off += n * (seq_len + n)
        rows.fill_(False)
        rows[:, 0] = True
        for tid in range(1, n):
            position = 0
            cur = tid - 1
            while True:
                position += 1
                rows[tid, cur + 1] = True
                ptb = s[cur] // topk
                if ptb == 0:
                    break
                tok_idx = par[ptb]
                cur = s.index(tok_idx) if tok_idx in s else len(s) - 1
            positions[off + tid] = position + seq_len
    retrive_next_token.view(bs, n).copy_(torch.tensor(rnt, dtype=retrive_next_token.dtype))
    retrive_next_sibling.view(bs, n).copy_(torch.tensor(rns, dtype=retrive_next_sibling.dtype))


def _reconstruct_indices_from_tree_mask_cpu(
    tree_mask, verified_seq_len, positions, retrive_index, retrive_next_token, retrive_next_sibling, batch_size, draft_token_num
):
    n = draft_token_num
    m = tree_mask.view(batch_size, n, n).tolist()
    seq_lens = verified_seq_len.tolist()
    ri = retrive_index.view(batch_size, n)
    rnt = retrive_next_token.view(batch_size, n)
    rns = retrive_next_sibling.view(batch_size, n)
    for bid in range(batch_size):
        mk = m[bid]
        for tid in range(n):
            depth, parent = 0, -1
            for i in range(tid - 1, -1, -1):
                if mk[tid][i]:
                    depth += 1
                    if parent == -1:
                        parent = i
            ri[bid, tid] = bid * n + tid
            positions[bid * n + tid] = depth + seq_lens[bid]
            nxt = next((i for i in range(tid + 1, n) if mk[i][tid]), -1)
            rnt[bid, tid] = nxt
            sib = -1
            if parent != -1:
                for i in range(tid + 1, n):
                    if mk[i][parent] and not any(mk[i][parent + 1 : i]):
                        sib = i
                        break
            rns[bid, tid] = sib


def _rotate_input_ids_cpu(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index):
    starts, lens = extend_start_loc.tolist(), extend_seq_lens.tolist()
    new = topk_index.reshape(-1).tolist()
    sel = select_index.reshape(-1).tolist() if select_index is not None else None
    for pid, (start, n) in enumerate(zip(starts, lens)):
        if n > 1:
            input_ids[start : start + n - 1] = input_ids[start + 1 : start + n].clone()
        if n > 0:
            input_ids[sel[pid] if sel is not None else start + n - 1] = new[pid]


def _copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    # The op receives raw base addresses of every K/V buffer (what the Triton
    # kernel gets), not tensors; view each buffer's touched rows as a uint8
    # tensor. Advanced-index assignment gathers all sources before scattering,
    # so overlapping src/tgt sets are safe, as in the kernel.
    if tgt_loc.numel() == 0 or data_ptrs.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    n_rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for base, stride in zip(data_ptrs.view(torch.int64).tolist(), strides.tolist()):
        base &= (1 << 64) - 1
        raw = (ctypes.c_uint8 * (n_rows * stride)).from_address(base)
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(n_rows, stride)
        rows[tgt] = rows[src]


# name -> (schema, implementation). Schemas mirror the CPU build of
# sgl-kernel as called by the installed python wrappers.
_OPS: Dict[str, tuple] = {
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor out_cache_loc, int pool_len) -> ()",
        _assign_req_to_token_pool_cpu,
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len) -> ()",
        _assign_extend_cache_locs_cpu,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, "
        "int pool_len, int topk, int num_steps) -> ()",
        _assign_draft_cache_locs_contiguous_cpu,
    ),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, int num_steps, "
        "int pool_len) -> Tensor",
        _build_draft_decode_metadata_cpu,
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()",
        _fill_bonus_tokens_cpu,
    ),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc) -> ()",
        _fill_accept_out_cache_loc_cpu,
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor target_predict) -> ()",
        _verify_tree_greedy_cpu,
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, Tensor(a!) tree_mask, "
        "Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, "
        "int tree_mask_mode) -> ()",
        _build_tree_kernel_efficient_cpu,
    ),
    "reconstruct_indices_from_tree_mask_cpu": (
        "(Tensor tree_mask, Tensor verified_seq_len, Tensor(a!) positions, Tensor(b!) retrive_index, "
        "Tensor(c!) retrive_next_token, Tensor(d!) retrive_next_sibling, int batch_size, "
        "int draft_token_num) -> ()",
        _reconstruct_indices_from_tree_mask_cpu,
    ),
    "rotate_input_ids_cpu": (
        "(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, Tensor topk_index, "
        "Tensor? select_index) -> ()",
        _rotate_input_ids_cpu,
    ),
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        _copy_all_layer_kv_cache_cpu,
    ),
}

IMPLEMENTATIONS: Dict[str, Callable] = {name: fn for name, (_, fn) in _OPS.items()}


def _op_exists(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{_NS}::{name}", "")
        return True
    except RuntimeError:
        return False


def register_missing_ops(ops: Dict[str, Tuple[str, Callable]]) -> list:
    """Register every op of ``ops`` (name -> (schema, implementation)) the loaded sgl-kernel lacks; returns
    the names added. Idempotent. Shared by every module of cpu/ that gives sgl-kernel torch versions."""
    global _lib
    import sgl_kernel  # noqa: F401  -- load the real library first so we never shadow a native op

    added = []
    for name, (schema, fn) in ops.items():
        if _op_exists(name):
            continue
        if _lib is None:
            _lib = torch.library.Library(_NS, "FRAGMENT")
        _lib.define(name + schema)
        # CompositeExplicitAutograd: one kernel for every backend key (these
        # ops only ever see CPU tensors here, some of them none at all).
        _lib.impl(name, fn, "CompositeExplicitAutograd")
        added.append(name)
    return added


def register_spec_ops() -> list:
    """Register every speculative op the loaded sgl-kernel lacks; returns the names added. Idempotent."""
    return register_missing_ops(_OPS)
