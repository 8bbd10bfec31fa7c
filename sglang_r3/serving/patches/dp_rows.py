"""This scheduler's rows of a router's top-k when the router routes more than this scheduler's batch: under DP
attention the window of the gathered batch SGLang published for the forward (host ints: no device sync; a
CUDA graph records its own), with DeepEP and attention-TP > 1 the shares all-gathered as upstream does. A
router whose token count is not the gathered length gets ``None``, and the forward's rows are invalidated.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

LocalRows = Callable[[torch.Tensor], Optional[torch.Tensor]]


def local_rows_fn(max_tokens: int, topk: int, device) -> Optional[LocalRows]:
    """The function that cuts this rank's rows out of a router's top-k, or None when the router's
    batch is this scheduler's own (no DP attention, no scattering all-to-all)."""
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.layers.moe import get_moe_a2a_backend
    from sglang.srt.runtime_context import get_parallel

    backend = get_moe_a2a_backend()
    if backend.is_deepep() or backend.is_deepep_v2():
        attn_tp = get_parallel().attn_tp_size
        return None if attn_tp == 1 else _gathered_across_attn_tp(max_tokens, topk, attn_tp, device)
    if is_dp_attention_enabled():
        return _dp_window
    return None


def _dp_window(topk_ids: torch.Tensor) -> Optional[torch.Tensor]:
    from sglang.srt.layers.dp_attention import dp_slot_in, get_dp_global_num_tokens, get_global_dp_buffer_len

    counts = get_dp_global_num_tokens()
    if counts is None:
        return None
    return dp_window(topk_ids, counts, dp_slot_in(counts), get_global_dp_buffer_len())


def dp_window(topk_ids: torch.Tensor, counts: Sequence[int], slot: int, gathered: int) -> Optional[torch.Tensor]:
    """Rank ``slot``'s rows of a router's top-k over the gathered batch (``counts`` per rank, as padded
    for the gather); None when the router did not route the ``gathered`` tokens. Host ints only: a
    view, no sync (benchmarks/gpu_check.py records it in a CUDA graph)."""
    if topk_ids.shape[0] != gathered:
        return None  # not the gathered batch this forward published: refuse rather than guess
    start = sum(counts[:slot])
    return topk_ids[start : start + counts[slot]]


def _gathered_across_attn_tp(max_tokens: int, topk: int, attn_tp: int, device) -> LocalRows:
    from sglang.srt.layers.dp_attention import attn_tp_all_gather_into_tensor

    # Allocated once: a CUDA graph keeps gathering into the storage it was captured with. Routed ids
    # only (fused shared-expert columns follow them and are never filed).
    buf = torch.empty((max_tokens * attn_tp, topk), dtype=torch.int32, device=device)

    def gather(topk_ids: torch.Tensor) -> Optional[torch.Tensor]:
        n = topk_ids.shape[0] * attn_tp
        if n > buf.shape[0]:
            return None
        out = buf[:n]
        attn_tp_all_gather_into_tensor(out, topk_ids[:, :topk].to(torch.int32).contiguous())
        return out

    return gather
