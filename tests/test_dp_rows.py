"""A DP rank's window of the gathered batch equals the one SGLang's own slicer gives, in every layout.

The oracle is SGLang's ``dp_attention.get_dp_local_slice_cpu`` (what upstream's capturer slices with; both served
releases have it: 0.5.23 finds the slot with ``dp_slot_in``, 0.5.15 with ``get_attention_dp_rank``), given the
per-rank counts a forward carries; our window (``adapter/dp_rows._dp_window``, the function the server runs) reads
what SGLang's own ``set_dp_buffer_len`` published for the same forward. The layouts are those
``ForwardBatch.prepare_mlp_sync_batch`` publishes: SUM_LEN (every rank at its own count, rounded up to the
attention-TP width), MAX_LEN (every rank padded to the longest), a decode CUDA graph (recorded with every rank at
the graph's batch, ``[bs] * ranks``; replayed with the forward's own MAX_LEN counts: a CPU host cannot replay a
graph, so the recorded window is checked against the slice SGLang takes at replay), with 2 to 8 ranks, unequal
counts and idle ranks at the front, in the middle and at the back. ``test_every_wrong_formula_fails_somewhere``
shows the case table tells apart the formulas a window could plausibly be written with (from the tail, equal
ranks, an even split, reversed ranks, ...): with two ranks of equal counts several of them agree.

tests/test_dp_attention.py serves the eager layouts end to end on real DP ranks, tests/test_dp_counters.py
counts rows there. DeepEP's attention-TP gather runs through SGLang's own collective and group on two gloo ranks
(below); DeepEP itself needs GPUs.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace
from typing import Callable, Dict, List, NamedTuple, Optional

import pytest
import torch

pytestmark = pytest.mark.sglang

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sglang_dp():
    saved = dict(os.environ)
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():
        activate_cpu_runtime()
    from sglang.srt.layers import dp_attention
    from sglang.srt.runtime_context import get_parallel

    from sglang_r3.serving.adapter.dp_rows import _dp_window

    yield SimpleNamespace(dp=dp_attention, parallel=get_parallel(), window=_dp_window)
    os.environ.clear()
    os.environ.update(saved)


@contextlib.contextmanager
def as_rank(env, rank: int, ranks: int):
    """This process as attention-DP rank ``rank`` of ``ranks``, where the installed SGLang keeps it: the runtime
    context (0.5.23, and what 0.5.15's ``get_parallel()`` answers) and, where the module still has them, the
    module globals ``initialize_dp_attention`` sets (0.5.15's ``get_attention_dp_rank``, which its slicer reads)."""
    globals_ = {"_ATTN_DP_RANK": rank, "_ATTN_DP_SIZE": ranks, "_ENABLE_DP_ATTENTION_FLAG": True}
    saved = {k: getattr(env.dp, k) for k in globals_ if hasattr(env.dp, k)}
    for k in saved:
        setattr(env.dp, k, globals_[k])
    try:
        with env.parallel.override(attn_dp_size=ranks, attn_dp_rank=rank):
            yield
    finally:
        for k, v in saved.items():
            setattr(env.dp, k, v)


def _topk(n: int) -> torch.Tensor:
    return torch.arange(n * 4, dtype=torch.int32).reshape(n, 4)  # every row distinct


def _ceil_align(x: int, k: int) -> int:
    return -(-x // k) * k


# Per-rank token counts of one forward before SGLang pads them for the gather.
RAW: Dict[str, List[int]] = {
    "2-unequal": [3, 5],
    "2-first-idle": [0, 7],
    "2-last-idle": [6, 0],
    "3-unequal": [1, 9, 4],
    "3-middle-idle": [5, 0, 2],
    "4-unequal": [6, 2, 3, 7],
    "5-idle-run": [2, 0, 0, 5, 1],
    "8-distinct": [4, 1, 3, 7, 2, 6, 5, 8],
    "8-only-last-busy": [0, 0, 0, 0, 0, 0, 0, 3],
}
GRAPH_BATCHES = (1, 2, 4, 8, 12, 16)  # decode CUDA-graph batch sizes (the smallest that fits is replayed)


class Case(NamedTuple):
    """One forward as rank ``slot`` sees it: what SGLang publishes for the gather, and what its slicer is given."""

    name: str
    published: List[int]  # per-rank counts set_dp_buffer_len publishes while the routers run
    gathered: int  # the gathered batch's length (what every router routes)
    max_len: bool
    slot: int
    graph_bs: Optional[int]  # a decode CUDA graph's batch: recorded with `published`, replayed with `replay`
    replay: List[int]  # the forward's own counts, as get_dp_local_slice_cpu reads them


def _layouts(raw: List[int]):
    n = len(raw)
    yield "sum-len", raw, sum(raw), False, None, raw
    aligned = [_ceil_align(c, 2) for c in raw]  # attention-TP 2: each rank rounded up to the TP width
    yield "sum-len-attn-tp-2", aligned, sum(aligned), False, None, aligned
    longest = [max(raw)] * n
    yield "max-len", longest, max(raw) * n, True, None, longest
    bs = min(b for b in GRAPH_BATCHES if b >= max(raw))
    yield "cuda-graph", [bs] * n, bs * n, True, bs, longest


def _cases() -> List[Case]:
    out = []
    for name, raw in RAW.items():
        for mode, published, gathered, max_len, bs, replay in _layouts(raw):
            for slot in range(len(raw)):
                out.append(Case(f"{name}/{mode}/rank{slot}", published, gathered, max_len, slot, bs, replay))
    return out


CASES = _cases()


def _oracle(env, case: Case) -> torch.Tensor:
    """The rows SGLang's own slicer takes for this rank out of the gathered top-k."""
    start, n = env.dp.get_dp_local_slice_cpu(
        SimpleNamespace(global_num_tokens_cpu=list(case.replay)), case.graph_bs is not None, case.graph_bs
    )
    return _topk(case.gathered)[start : start + n]


def _ours(env, case: Case) -> Optional[torch.Tensor]:
    # A fresh list per forward, as ForwardBatch.prepare_mlp_sync_batch publishes one.
    published = list(case.published)
    env.dp.set_dp_buffer_len(case.gathered, published[case.slot], case.max_len, published)
    return env.window(_topk(case.gathered))


def _read_at_forward_end(window: torch.Tensor, case: Case) -> torch.Tensor:
    # The capturer files the first len(out_cache_loc) staged rows: the forward's own count for this rank.
    return window[: case.replay[case.slot]] if case.graph_bs is not None else window


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_window_equals_sglangs_own_local_slice(sglang_dp, case):
    with as_rank(sglang_dp, case.slot, len(case.published)):
        want = _oracle(sglang_dp, case)
        got = _ours(sglang_dp, case)
    assert got is not None
    if case.graph_bs is not None:
        assert got.shape[0] == case.graph_bs  # the graph records its whole per-rank block
    torch.testing.assert_close(_read_at_forward_end(got, case), want, rtol=0, atol=0)


# Formulas a window could be written with, each wrong: (counts, slot, gathered) -> (start, length).
WRONG: Dict[str, Callable[[List[int], int, int], tuple]] = {
    "from the tail (total - counts[slot])": lambda c, s, g: (g - c[s], c[s]),
    "equal ranks (slot * counts[slot])": lambda c, s, g: (s * c[s], c[s]),
    "slot * longest rank": lambda c, s, g: (s * max(c), c[s]),
    "even split of the gathered batch": lambda c, s, g: (s * (g // len(c)), g // len(c)),
    "ranks in reverse order": lambda c, s, g: (sum(c[s + 1 :]), c[s]),
    "prefix including its own count": lambda c, s, g: (sum(c[: s + 1]), c[s]),
    "own prefix, longest rank's length": lambda c, s, g: (sum(c[:s]), max(c)),
    "own rows at the front": lambda c, s, g: (0, c[s]),
}


@pytest.mark.parametrize("formula", list(WRONG), ids=list(WRONG))
def test_every_wrong_formula_fails_somewhere(sglang_dp, formula):
    """The case table above can fail each of these: were the window written so, some case would differ from
    SGLang's slice."""
    wrong = WRONG[formula]
    differs = []
    for case in CASES:
        with as_rank(sglang_dp, case.slot, len(case.published)):
            want = _oracle(sglang_dp, case)
        start, n = wrong(case.published, case.slot, case.gathered)
        got = _read_at_forward_end(_topk(case.gathered)[max(start, 0) : max(start, 0) + n], case)
        if got.shape != want.shape or not torch.equal(got, want):
            differs.append(case.name)
    assert differs, f"no case tells {formula!r} from SGLang's own slice"


def test_two_ranks_cannot_tell_these_formulas_apart():
    # Why the table has 3-8 ranks and unequal counts: with two ranks, the last rank's window taken from the tail
    # is always the right one, and with two equal ranks three more wrong formulas give the right windows.
    for counts in ([3, 5], [7, 2], [0, 4]):
        assert WRONG["from the tail (total - counts[slot])"](counts, 1, sum(counts)) == (counts[0], counts[1])
    counts, gathered = [6, 6], 12
    right = [(sum(counts[:s]), counts[s]) for s in (0, 1)]
    for formula in ("equal ranks (slot * counts[slot])", "slot * longest rank", "even split of the gathered batch"):
        assert [WRONG[formula](counts, s, gathered) for s in (0, 1)] == right, formula


def test_the_window_follows_each_forward_not_the_first(sglang_dp):
    # The window is computed once per forward (per published count list), for every router of the forward.
    # Consecutive forwards with the same gathered length and another split must each get their own window.
    topk = _topk(8)
    with as_rank(sglang_dp, 1, 2):
        seen = []
        for counts in ([3, 5], [5, 3], [3, 5], [4, 4]):
            published = list(counts)
            sglang_dp.dp.set_dp_buffer_len(8, counts[1], False, published)
            layers = [sglang_dp.window(topk) for _ in range(3)]  # three MoE routers of one forward
            assert all(torch.equal(w, layers[0]) for w in layers)
            seen.append(layers[0])
        assert [w.tolist() for w in seen] == [topk[c[0] :].tolist() for c in ([3, 5], [5, 3], [3, 5], [4, 4])]


def test_a_router_that_did_not_route_the_gathered_batch_files_nothing(sglang_dp):
    with as_rank(sglang_dp, 1, 2):
        sglang_dp.dp.set_dp_buffer_len(12, 8, False, [4, 8])
        assert sglang_dp.window(_topk(8)) is None  # this rank's own 8 tokens, not the 12 gathered
        assert sglang_dp.window(_topk(12)) is not None  # the forward's other routers still get their window


def test_a_skipped_gather_is_this_ranks_own_batch(sglang_dp):
    # A one-entry list is SGLang's all-gather-skipped batch: it carries this process's entry alone.
    for rank in (1, 2):
        with as_rank(sglang_dp, rank, 3):
            sglang_dp.dp.set_dp_buffer_len(5, 5, False, [5])
            topk = _topk(5)
            torch.testing.assert_close(sglang_dp.window(topk), topk, rtol=0, atol=0)


# -- counters: real rows only ------------------------------------------------------------------------------

def _layout():
    from sglang_r3.core.layout import LayerInfo, ModelLayout

    return ModelLayout("Glm4MoeForCausalLM", 4, (
        LayerInfo(0, "dense"), LayerInfo(1, "moe", None, 16, 4), LayerInfo(2, "moe", None, 16, 4),
        LayerInfo(3, "moe", None, 16, 4), LayerInfo(4, "mtp", 1, 16, 4)))


@pytest.mark.parametrize("deferred", [False, True], ids=["blocking", "overlap-scheduler"])
def test_dp_padding_rows_are_never_counted_as_captured(sglang_dp, deferred):
    """A short or idle rank's batch padded by SGLang itself (``ForwardBatch._pad_tensor_to_size``: padding tokens
    write slot 0, which SGLang's KV allocator never hands out): only the real tokens' rows count."""
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sglang_r3.serving.capture.capturer import RoutingCapturer

    slots = TokenToKVPoolAllocator(32, torch.float32, "cpu", None, False).alloc(32)
    assert 0 not in slots.tolist()  # slot 0 is SGLang's padding slot

    cap = RoutingCapturer(_layout(), num_slots=33, max_batch_tokens=16)

    def forward(loc):
        for layer in (1, 2, 3):
            cap.capture(layer, _topk(loc.shape[0]) % 16)
        fb = SimpleNamespace(out_cache_loc=loc, out_cache_loc_virtual=None)
        held = cap.on_forward_end(fb, no_copy_to_cpu=deferred)
        if held is not None:
            held.map_device_tensors(lambda t: t.to("cpu", copy=True))  # the result-copy stream's host copy
            held.finalize()

    forward(ForwardBatch._pad_tensor_to_size(None, slots[:3], 8))  # a rank with 3 tokens padded to the longest's 8
    forward(ForwardBatch._pad_tensor_to_size(None, slots[:0], 8))  # an idle rank's IDLE forward, padded to 8
    forward(slots[3:8])  # an unpadded forward of 5
    assert cap.stats.main_rows_written == 3 + 5
    assert cap.stats.main_forwards == 2  # the idle rank's padded forward captured no real token
    _, missing = cap.rows_for_slots(slots[:8])
    assert missing == 0
    cap.set_mode("off")
    forward(ForwardBatch._pad_tensor_to_size(None, slots[8:10], 6))
    assert cap.stats.rows_invalidated == 2


def test_a_draft_forward_whose_router_did_not_route_the_gathered_batch_is_counted(sglang_dp):
    """The router path the server runs (``adapter/capture_site.route_topk_to_capturers``) under DP attention: a draft
    forward whose MTP router routed another batch than the gathered one files no entry and is counted once in
    ``draft.forwards_refused`` (``/routing/stats``), however many of its routers refuse."""
    from sglang.srt.layers.moe.topk import TopKConfig
    from sglang.srt.state_capturer.routed_experts import set_global_experts_capturer

    from sglang_r3.serving.capture.capturer import RoutingCapturer
    from sglang_r3.serving.capture.draft import DraftCapturer
    from sglang_r3.serving.adapter import capture_site as capture_patch
    from sglang_r3.serving.adapter.dp_rows import _dp_window

    mtp = TopKConfig(top_k=4, allow_routed_experts_capture=False)  # a draft router: not allowed to write main rows
    cap = RoutingCapturer(_layout(), num_slots=32, max_batch_tokens=16)
    cap.draft = DraftCapturer({id(mtp): 1}, topk=4, dtype=cap.dtype, max_tokens=16)
    saved_rows = capture_patch._local_rows
    capture_patch._local_rows = _dp_window  # what install_our_capturer sets under DP attention
    set_global_experts_capturer(cap)
    try:
        with as_rank(sglang_dp, 1, 2):
            def draft_forward(routed: int, routers: int = 1):
                sglang_dp.dp.set_dp_buffer_len(8, 5, False, [3, 5])
                for _ in range(routers):
                    capture_patch.route_topk_to_capturers(mtp, 0, _topk(routed) % 16)
                n = 5
                cap.draft.file_forward([7], [n], [n], torch.arange(n), torch.arange(n), 0)

            draft_forward(8)  # the gathered batch: rank 1's 5 rows filed
            assert cap.draft.stats()["entries"] == 5 and cap.draft.stats()["forwards_refused"] == 0
            draft_forward(5, routers=2)  # routed 5 tokens where 8 were gathered: nothing filed, counted once
            assert cap.draft.stats()["entries"] == 5 and cap.draft.stats()["forwards_refused"] == 1
            draft_forward(8)  # the next forward files again
            assert cap.draft.stats()["entries"] == 10 and cap.draft.stats()["forwards_refused"] == 1
            sglang_dp.dp.set_dp_buffer_len(8, 5, False, [3, 5])
            capture_patch.route_topk_to_capturers(mtp, 0, _topk(3) % 16)
            cap.draft.drop_staged()  # a refused forward that ends without filing (nothing staged)
            assert cap.draft.stats()["forwards_refused"] == 2
            # /routing/stats' entry of this scheduler (get_internal_state's hook, on an empty scheduler).
            scheduler = SimpleNamespace(running_batch=None, waiting_queue=[])
            scheduler.scheduler = scheduler  # 0.5.23 hands the internal-state controller, 0.5.15 the Scheduler
            stats = capture_patch.add_capture_stats(SimpleNamespace(internal_state={}), scheduler).internal_state
        assert stats["sglang_r3"]["draft"]["forwards_refused"] == 2
        assert stats["sglang_r3"]["dp_rank"] == 1
    finally:
        set_global_experts_capturer(None)
        capture_patch._local_rows = saved_rows


def _gather_worker(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from sglang_r3.dev.cpu import activate_cpu_runtime

    activate_cpu_runtime()
    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import init_model_parallel_group
    from sglang.srt.runtime_context import get_parallel

    from sglang_r3.serving.adapter.dp_rows import _gathered_across_attn_tp

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
