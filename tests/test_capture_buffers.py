"""The capturer's GPU-path properties, pinned on CPU tensors.

What a GPU run depends on and a CPU run cannot show by failing: CUDA graphs write into the
staging storage they were recorded with (so it is never replaced), the overlap scheduler needs
the device->host copy off the forward path (so it is deferred and counted), routers may run
inside graph capture (so no host copy happens inside ``capture``), and a slot whose KV a
forward computed without capturing its row must never hand out a row.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch.overrides import TorchFunctionMode

from sglang.srt.utils.common import async_d2h  # SGLang's own copy primitive of the overlap path

from sglang_r3.serving.capture.capturer import RoutingCapturer, StagingOverflow
from sglang_r3.serving.capture.draft import DraftCapturer
from sglang_r3.core.layout import LayerInfo, ModelLayout

pytestmark = pytest.mark.sglang

torch.set_num_threads(1)

LAYOUT = ModelLayout(
    "Glm4MoeForCausalLM",
    4,
    (
        LayerInfo(0, "dense"),
        LayerInfo(1, "moe", None, 16, 4),
        LayerInfo(2, "moe", None, 16, 4),
        LayerInfo(3, "moe", None, 16, 4),
        LayerInfo(4, "mtp", 1, 16, 4),
    ),
)
MAX_TOKENS = 64


def _batch(slots):
    return types.SimpleNamespace(out_cache_loc=torch.tensor(slots, dtype=torch.int64), out_cache_loc_virtual=None)


def _ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(n)]).to(torch.int32)


def _forward(cap, slots, seed=0, layers=(1, 2, 3), **end_kwargs):
    """One target forward: each MoE router captures its ids, then the forward ends."""
    chosen = {}
    for layer in layers:
        chosen[layer] = _ids(len(slots), seed * 10 + layer)
        cap.capture(layer, chosen[layer])
    return chosen, cap.on_forward_end(_batch(slots), **end_kwargs)


class _HostCopies(TorchFunctionMode):
    """Counts tensor operations that would move data from a device to the host (each a sync on a GPU).

    On CPU every tensor is already on the host, so the count is of the calls, not of bytes: a
    ``.to("cpu")``/``.cpu()``, or a ``.numpy()``/``.tolist()``/``.item()`` on a tensor that did
    not just come from one.
    """

    def __init__(self):
        super().__init__()
        self.n = 0
        self._host = set()

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        to_host = func is torch.Tensor.cpu or (
            func is torch.Tensor.to
            and any(isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu"
                    for a in (*args[1:], kwargs.get("device")) if a is not None)
        )
        if to_host:
            self.n += 1
            self._host.add(id(out))
        elif func in (torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.item) and id(args[0]) not in self._host:
            self.n += 1
        return out


def test_staging_storage_survives_forwards_up_to_the_limit_and_a_bigger_one_raises():
    cap = RoutingCapturer(LAYOUT, num_slots=1024, max_batch_tokens=MAX_TOKENS)
    ptr = cap.staging_ptr()
    for n in (1, 7, MAX_TOKENS, 3):
        _forward(cap, list(range(n)))
        assert cap.staging_ptr() == ptr
    with pytest.raises(StagingOverflow, match=r"routed 192 tokens but the capture staging holds 64"):
        cap.capture(1, _ids(3 * MAX_TOKENS, 0))
    assert cap.staging_ptr() == ptr


@pytest.mark.parametrize("word_scatter", [True, False], ids=["cpu-word-scatter", "row-buffer-store"])
@pytest.mark.parametrize("topk,experts", [(4, 16), (8, 160), (6, 64), (8, 300)])
def test_rows_land_at_their_kv_slots_and_are_marked_written(topk, experts, word_scatter):
    # top-4/8 uint8 ids move as one machine word at the forward end; top-6 uint8 and top-8 uint16
    # (16 bytes) take the plain transposed copy.
    layout = ModelLayout("Glm4MoeForCausalLM", 4, (
        LayerInfo(0, "dense"), *(LayerInfo(i, "moe", None, experts, topk) for i in (1, 2, 3)),
        LayerInfo(4, "mtp", 1, experts, topk)))
    cap = RoutingCapturer(layout, num_slots=32, max_batch_tokens=MAX_TOKENS, host_word_scatter=word_scatter)
    slots = [5, 9, 2]
    g = torch.Generator().manual_seed(topk * experts)
    chosen = {}
    for layer in (1, 2, 3):
        chosen[layer] = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in slots]).to(torch.int32)
        cap.capture(layer, chosen[layer])
    cap.on_forward_end(_batch(slots))
    rows, missing = cap.rows_for_slots(torch.tensor(slots))
    assert missing == 0 and rows.shape == (3, 3, topk)
    for col, layer in enumerate((1, 2, 3)):
        assert torch.equal(rows[:, col, :].to(torch.int32), chosen[layer])


def test_both_row_store_paths_leave_the_same_host_rows_and_marks_at_the_glm_shape():
    # Top-8 of 160 experts, uint8 (GLM-4.5 / DeepSeek-V3): one 64-bit word per (layer, token). On CPU the
    # forward end scatters staging words into the host buffer; device staging goes through the row
    # buffer and _store. Forwards of mixed sizes, one that misses a layer, and slots written twice.
    layout = ModelLayout("Glm4MoeForCausalLM", 5, (
        LayerInfo(0, "dense"), *(LayerInfo(i, "moe", None, 160, 8) for i in (1, 2, 3, 4)),
        LayerInfo(5, "mtp", 1, 160, 8)))
    caps = [RoutingCapturer(layout, num_slots=96, max_batch_tokens=MAX_TOKENS, host_word_scatter=w) for w in (True, False)]
    g = torch.Generator().manual_seed(8)
    steps = [(list(range(0, 40)), (1, 2, 3, 4)), ([50], (1, 2, 3, 4)), (list(range(30, 64)), (1, 2, 3, 4)),
             ([60, 61, 62], (1, 2, 4)), ([7, 95], (1, 2, 3, 4))]
    for slots, layers in steps:
        ids = {l: torch.stack([torch.randperm(160, generator=g)[:8] for _ in slots]).to(torch.int32) for l in layers}
        for cap in caps:
            for l in layers:
                cap.capture(l, ids[l])
            cap.on_forward_end(_batch(slots))
    words, store = caps
    assert torch.equal(words.host, store.host) and torch.equal(words.written, store.written)
    assert not bool(words.written[[60, 61, 62]].any())  # the forward without layer 3 cleared its slots' rows
    assert int(words.written.sum()) == 64 + 1 - 3  # slots 0..63 and 95, less the incomplete forward's


def test_deferred_copy_equals_the_synchronous_one_and_leaves_the_forward_path_copy_free():
    sync = RoutingCapturer(LAYOUT, num_slots=64, max_batch_tokens=MAX_TOKENS)
    deferred = RoutingCapturer(LAYOUT, num_slots=64, max_batch_tokens=MAX_TOKENS)
    steps = [([3, 4, 5], 1), ([10, 11], 2), ([20, 21, 22, 23], 3)]
    holders = []
    for slots, seed in steps:
        _forward(sync, slots, seed)
        with _HostCopies() as copies:
            _, holder = _forward(deferred, slots, seed, no_copy_to_cpu=True)
        assert copies.n == 0, "the deferred forward path copied to the host"
        holders.append(holder)
    assert deferred.stats.blocking_copies == 0 and deferred.stats.deferred_copies == len(steps)
    assert sync.stats.blocking_copies == len(steps)
    # Nothing reached the host yet: the overlap scheduler copies, then finalizes before results.
    assert not bool(deferred.written.any())
    for h in holders:
        h.map_device_tensors(async_d2h)
        h.finalize()
    assert torch.equal(sync.host, deferred.host)
    assert torch.equal(sync.written, deferred.written)


def test_deferred_holder_keeps_its_rows_when_the_next_forward_reuses_staging():
    cap = RoutingCapturer(LAYOUT, num_slots=64, max_batch_tokens=MAX_TOKENS)
    first, h1 = _forward(cap, [1, 2], seed=4, no_copy_to_cpu=True)
    _forward(cap, [7, 8], seed=5, no_copy_to_cpu=True)  # overlapped: overwrites staging[:2]
    h1.map_device_tensors(async_d2h)
    h1.finalize()
    rows, missing = cap.rows_for_slots(torch.tensor([1, 2]))
    assert missing == 0
    assert torch.equal(rows[:, 0, :].to(torch.int32), first[1])


def test_kv_move_under_deferred_copy_moves_the_rows_once_they_land():
    cap = RoutingCapturer(LAYOUT, num_slots=64, max_batch_tokens=MAX_TOKENS)
    chosen, holder = _forward(cap, [30, 31, 32], seed=6, no_copy_to_cpu=True)
    cap.move_rows(torch.tensor([32]), torch.tensor([31]))  # tree drafting: accepted node 32 moves to 31
    holder.map_device_tensors(async_d2h)
    holder.finalize()
    rows, missing = cap.rows_for_slots(torch.tensor([30, 31]))
    assert missing == 0
    assert torch.equal(rows[1, 0, :].to(torch.int32), chosen[1][2])


def test_row_work_queued_under_a_deferred_copy_runs_once_the_rows_land():
    """A PD decode engine's retraction keeps a request's rows while the forward that computed its last token may be
    in flight (adapter/pd_rows.py): the kept row is that forward's, not what the slot held before it."""
    cap = RoutingCapturer(LAYOUT, num_slots=64, max_batch_tokens=MAX_TOKENS)
    _forward(cap, [40, 41], seed=7)  # what the slots held before
    chosen, holder = _forward(cap, [41], seed=8, no_copy_to_cpu=True)  # in flight
    kept = {}
    cap.after_rows_land(lambda: kept.update(rows=cap.host[[41]], marks=cap.written[[41]]))
    assert not kept
    holder.map_device_tensors(async_d2h)
    holder.finalize()
    assert torch.equal(kept["rows"][0, 0, :].to(torch.int32), chosen[1][0]) and bool(kept["marks"].all())
    ran = []
    cap.after_rows_land(lambda: ran.append(True))  # nothing in flight: now
    assert ran == [True]


def test_capture_off_invalidates_the_slots_it_computes():
    cap = RoutingCapturer(LAYOUT, num_slots=32, max_batch_tokens=MAX_TOKENS)
    _forward(cap, [1, 2, 3], seed=1)
    cap.set_mode("off")
    _forward(cap, [2, 3, 4], seed=2)  # slots 2, 3 reused by a forward that captured nothing
    _, missing = cap.rows_for_slots(torch.tensor([1, 2, 3, 4]))
    assert missing == 3
    assert cap.stats.rows_invalidated == 3


def test_a_forward_with_a_moe_layer_that_did_not_capture_writes_no_rows():
    cap = RoutingCapturer(LAYOUT, num_slots=32, max_batch_tokens=MAX_TOKENS)
    _forward(cap, [4, 5], seed=1)
    _forward(cap, [4, 5, 6], seed=2, layers=(1, 3))  # layer 2's router bypassed the capture site
    _, missing = cap.rows_for_slots(torch.tensor([4, 5, 6]))
    assert missing == 3
    assert cap.stats.incomplete_forwards == 1


def test_a_replayed_cuda_graph_counts_as_a_complete_capture():
    cap = RoutingCapturer(LAYOUT, num_slots=32, max_batch_tokens=MAX_TOKENS)
    cap.on_forward_end(_batch([1, 2]), can_run_graph=True)  # replay: routers wrote staging, no Python call
    _, missing = cap.rows_for_slots(torch.tensor([1, 2]))
    assert missing == 0


def test_main_capture_does_no_host_copy_inside_the_router():
    cap = RoutingCapturer(LAYOUT, num_slots=32, max_batch_tokens=MAX_TOKENS)
    ids = _ids(8, 0)
    with _HostCopies() as copies:
        cap.capture(1, ids)
    assert copies.n == 0


def test_draft_capture_stages_in_place_and_copies_once_per_forward():
    topk_config = object()
    draft = DraftCapturer({id(topk_config): 1}, topk=4, dtype=torch.uint8, max_tokens=MAX_TOKENS)
    ptr = draft.staging.untyped_storage().data_ptr()
    ids = _ids(6, 3)
    with _HostCopies() as copies:
        draft.capture(topk_config, ids)
    assert copies.n == 0, "a draft router copied to the host"
    assert draft.staging.untyped_storage().data_ptr() == ptr
    positions = torch.arange(10, 16)
    tokens = torch.arange(100, 106)
    with _HostCopies() as copies:
        draft.file_forward([0, 1], [3, 3], [3, 3], positions, tokens, step=0)
    assert copies.n == 1
    mtp = draft.collect(0, seqlen=100)
    assert mtp.positions.tolist() == [10, 11, 12]
    assert mtp.experts.astype("int32").tolist() == ids[:3].tolist()


def test_draft_entries_are_filed_only_for_requests_that_asked_for_the_mtp_section():
    topk_config = object()
    draft = DraftCapturer({id(topk_config): 1}, topk=4, dtype=torch.uint8, max_tokens=MAX_TOKENS, per_request=True)
    draft.set_wanted(1, True)  # request row 1 asked for {"mtp": true}; row 0 did not
    ids = _ids(6, 5)
    draft.capture(topk_config, ids)
    draft.file_forward([0, 1], [3, 3], [3, 3], torch.arange(10, 16), torch.arange(100, 106), step=0)
    assert draft.collect(0, seqlen=100) is None
    mtp = draft.collect(1, seqlen=100)
    assert mtp.positions.tolist() == [13, 14, 15]
    assert mtp.experts.astype("int32").tolist() == ids[3:].tolist()
    draft.forget([1])  # the row is freed: its next request starts unmarked
    staged = draft.staging.clone()
    draft.capture(topk_config, ids[:3])  # nobody wants the MTP section now: not even staged
    assert not draft.has_staged() and torch.equal(draft.staging, staged)
    draft.file_forward([1], [3], [3], torch.arange(3), torch.arange(3), step=0)
    assert draft.collect(1, seqlen=100) is None


def test_a_prompts_draft_entries_carried_to_another_capturer_come_first_and_a_late_arrival_is_refused():
    """PD (adapter/pd_rows.py): the prefill engine's capturer hands its draft-extend entries over, and the decode
    engine's capturer files them ahead of its own rounds; entries arriving after its own could not be put in order,
    so the section is refused, never reordered; a retracted request's entries come back into its new row."""
    cfg = object()
    pre = DraftCapturer({id(cfg): 1}, topk=4, dtype=torch.uint8, max_tokens=MAX_TOKENS, per_request=True)
    pre.set_wanted(0, True)
    ids = _ids(5, 7)
    pre.capture(cfg, ids)
    pre.file_forward([0], [5], [5], torch.arange(0, 5), torch.arange(101, 106), step=0)  # the prompt's draft-extend
    sent = pre.prompt_entries(0)
    assert sent["positions"].tolist() == [0, 1, 2, 3, 4] and (sent["step"] == 0).all()
    pre.set_wanted(1, False)
    assert pre.prompt_entries(1) is None  # not asked for: nothing to send

    dec = DraftCapturer({id(cfg): 1}, topk=4, dtype=torch.uint8, max_tokens=MAX_TOKENS, per_request=True)
    dec.set_wanted(3, True)
    dec.file_carried(3, sent["positions"], sent["depth"], sent["tokens"], sent["experts"])
    dec.capture(cfg, ids[:1])
    dec.file_forward([3], [1], [1], torch.tensor([5]), torch.tensor([106]), step=1)  # a draft of round 0
    dec.resolve_round([3], [1])
    kept = dec.detach(3)  # retracted: its row is freed
    dec.forget([3])
    dec.set_wanted(8, True)
    dec.attach(8, kept)  # resumed in another row
    mtp = dec.collect(8, seqlen=100)
    assert mtp.positions.tolist() == [0, 1, 2, 3, 4, 5] and mtp.step.tolist() == [0, 0, 0, 0, 0, 1]
    assert mtp.experts.astype("int32").tolist() == ids.tolist() + ids[:1].tolist()
    assert mtp.accepted.all() and dec.not_carried(8) is None

    dec.set_wanted(4, True)
    dec.capture(cfg, ids[:1])
    dec.file_forward([4], [1], [1], torch.tensor([5]), torch.tensor([106]), step=0)
    dec.file_carried(4, sent["positions"], sent["depth"], sent["tokens"], sent["experts"])
    assert "after 1 entries of the decode engine" in dec.not_carried(4)
