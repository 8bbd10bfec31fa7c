"""This scheduler's rows of a router's top-k when the router routes more than this scheduler's batch: under DP
attention the window of the gathered batch SGLang published for the forward (host ints: no device sync; a
CUDA graph records its own), with DeepEP and attention-TP > 1 the shares all-gathered as upstream does. A
router whose token count is not the gathered length gets ``None``, and the forward's rows are invalidated.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from sglang_r3.seam import release

LocalRows = Callable[[torch.Tensor], Optional[torch.Tensor]]


def local_rows_fn(max_tokens: int, topk: int, device) -> Optional[LocalRows]:
    """The function that cuts this rank's rows out of a router's top-k, or None when the router's
    batch is this scheduler's own (no DP attention, no scattering all-to-all)."""
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.layers.moe import get_moe_a2a_backend
    from sglang.srt.runtime_context import get_parallel

    if release.scatters_tokens(get_moe_a2a_backend()):
        attn_tp = get_parallel().attn_tp_size
        return None if attn_tp == 1 else _gathered_across_attn_tp(max_tokens, topk, attn_tp, device)
    if is_dp_attention_enabled():
        return _dp_window
    return None


# This rank's window of the gathered batch, computed once per forward: SGLang publishes a fresh per-rank
# count list for every forward (ForwardBatch.prepare_mlp_sync_batch, a CUDA graph's capture batch), so the
# list's identity (with the gathered length) tells a new forward; every router of it then slices with the same
# two host ints. The list is held, so its id cannot be reused by another list while cached. Host ints only: no
# device sync, nothing a CUDA graph writes into.
_published = None  # the count list the window below was computed from
_gathered = -1
_start = _stop = 0


def _dp_window(topk_ids: torch.Tensor) -> Optional[torch.Tensor]:
    global _published, _gathered, _start, _stop
    try:
        counts = _published_counts()
    except AttributeError:  # 0.5.15, before any forward published its counts
        return None
    if counts is None:
        return None
    gathered = _gathered_len()
    if counts is not _published or gathered != _gathered:
        slot = _slot_of(counts)
        _start = sum(counts[:slot])
        _stop = _start + counts[slot]
        _published, _gathered = counts, gathered
    if topk_ids.shape[0] != gathered:
        return None  # not the gathered batch this forward published: refuse rather than guess
    return topk_ids[_start:_stop]


def _published_counts():
    global _published_counts, _gathered_len
    _published_counts, _gathered_len = release.dp_gather_readers()  # bound once, at the first router call
    return _published_counts()


def _gathered_len() -> int:
    _published_counts()  # binds both readers
    return _gathered_len()


def _slot_of(counts) -> int:
    global _slot_of
    _slot_of = release.dp_slot_getter()  # where the installed release says this rank sits, bound once
    return _slot_of(counts)


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
