"""A DP rank's window of the gathered batch equals the one SGLang's own slicer gives, in every layout.

The oracle is SGLang 0.5.23's ``dp_attention.get_dp_local_slice_cpu`` (what upstream's
``RoutedExpertsCapturer._get_local_slice`` uses) on the per-rank counts the forward publishes through
SGLang's own ``set_dp_buffer_len``: SUM_LEN (uneven ranks, padded to attention-TP), MAX_LEN (every rank
padded to the longest) and a CUDA-graph capture (every rank at the graph's size; a CPU host cannot
replay one, so this is the layout the graph is recorded with). tests/test_dp_attention.py serves the
eager layouts end to end on real DP ranks. DeepEP's attention-TP gather runs through SGLang's own collective
and group on two gloo ranks (below); DeepEP itself needs GPUs.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sglang_dp():
    saved = dict(os.environ)
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():
        activate_cpu_runtime()
    from sglang.srt.layers import dp_attention
    from sglang.srt.runtime_context import get_parallel

    from sglang_r3.serving.patches.dp_rows import _dp_window

    yield SimpleNamespace(dp=dp_attention, parallel=get_parallel(), window=_dp_window)
    os.environ.clear()
    os.environ.update(saved)


def _topk(n: int) -> torch.Tensor:
    return torch.arange(n * 4, dtype=torch.int32).reshape(n, 4)  # every row distinct


@pytest.mark.parametrize(
    "counts, max_len, graph_bs",
    [
        ([4, 8], False, None),  # SUM_LEN: rank r at sum(counts[:r])
        ([8, 8], True, None),  # MAX_LEN: every rank padded to the longest
        ([6, 6], True, 6),  # a decode CUDA graph of 6 tokens per rank
        ([0, 5], False, None),  # rank 0 idle in this forward: an empty window
    ],
    ids=["sum-len", "max-len", "cuda-graph", "idle-rank"],
)
@pytest.mark.parametrize("rank", [0, 1])
def test_window_equals_sglangs_own_local_slice(sglang_dp, counts, max_len, graph_bs, rank):
    with sglang_dp.parallel.override(attn_dp_size=2, attn_dp_rank=rank):
        sglang_dp.dp.set_dp_buffer_len(sum(counts), counts[rank], max_len, counts)
        start, n = sglang_dp.dp.get_dp_local_slice_cpu(
            SimpleNamespace(global_num_tokens_cpu=counts), graph_bs is not None, graph_bs
        )
        topk = _topk(sum(counts))
        got = sglang_dp.window(topk)
        assert got is not None
        torch.testing.assert_close(got, topk[start : start + n], rtol=0, atol=0)


def test_a_router_that_did_not_route_the_gathered_batch_files_nothing(sglang_dp):
    with sglang_dp.parallel.override(attn_dp_size=2, attn_dp_rank=1):
        sglang_dp.dp.set_dp_buffer_len(12, 8, False, [4, 8])
        assert sglang_dp.window(_topk(8)) is None  # this rank's own 8 tokens, not the 12 gathered


def test_a_skipped_gather_is_this_ranks_own_batch(sglang_dp):
    # A one-entry list is SGLang's all-gather-skipped batch: it carries this process's entry alone.
    with sglang_dp.parallel.override(attn_dp_size=2, attn_dp_rank=1):
        sglang_dp.dp.set_dp_buffer_len(5, 5, False, [5])
        topk = _topk(5)
        torch.testing.assert_close(sglang_dp.window(topk), topk, rtol=0, atol=0)


def _gather_worker(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from sglang_r3.dev.cpu import activate_cpu_runtime

    activate_cpu_runtime()
    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import init_model_parallel_group
    from sglang.srt.runtime_context import get_parallel

    from sglang_r3.serving.patches.dp_rows import _gathered_across_attn_tp

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # SGLang's own attention-TP GroupCoordinator, on gloo as the CPU runtime builds it (no pynccl).
        group = init_model_parallel_group([[0, 1]], rank, "gloo", use_pynccl=False, use_custom_allreduce=False,
                                          group_name="attn_tp")
        with get_parallel().override(attn_tp_group=group, attn_tp_size=2, attn_tp_rank=rank):
            gather = _gathered_across_attn_tp(16, 4, 2, "cpu")
            # This rank's share of the local batch: 5 tokens, 4 routed ids + 2 fused shared-expert columns.
            share = torch.arange(5 * 6, dtype=torch.int32).reshape(5, 6) + 1000 * rank
            queue.put((rank, gather(share).tolist()))
    finally:
        dist.destroy_process_group()


def test_deepep_shares_are_gathered_across_attention_tp_ranks_with_sglangs_own_collective():
    """DeepEP cannot run on a CPU: the gather is run through SGLang's own ``attn_tp_all_gather_into_tensor`` on
    its own attention-TP GroupCoordinator (2 gloo ranks). Every rank gets the shares in rank order (as the
    scatter split them, and as upstream's capturer gathers them), routed columns only."""
    import torch.multiprocessing as mp

    from sglang_r3.serving.fleet.gateway import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_gather_worker, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=120)
    want = [[v + 1000 * r for v in range(6 * t, 6 * t + 4)] for r in (0, 1) for t in range(5)]
    assert got[0] == want and got[1] == want
