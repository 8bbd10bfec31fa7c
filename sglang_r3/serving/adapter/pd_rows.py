"""PD disaggregation (issue 54): the prompt's rows travel with its KV, from the prefill engine to the decode engine.

The capturer's host rows ``[num_slots, n_moe, topk]`` and ``written`` flags ``[num_slots]`` are indexed by KV slot,
like the KV pages. Both engines append them to the KV transfer's state components right after SGLang's
``disaggregation.utils.setup_state_kv_args`` (``PrefillBootstrapQueue._init_kv_manager`` and
``DecodePreallocQueue._init_kv_manager`` call it before the KV manager registers every buffer with the transfer
engine), so Mooncake registers them and, with the request's last chunk, writes the prefill engine's rows and marks of
the request's KV pages into the decode engine's rows and marks of its KV pages (``MooncakeKVManager.maybe_send_extra``,
the page-indexed generic state path). The decode engine's record then holds the rows the prefill engine's target
forward wrote: the marks travel with them, so a slot the prefill engine did not capture stays unmarked on the decode
engine (``missing_rows``), never zeros.

Carrier (``release.pd_rows_carrier``): on 0.5.23 ``StateType.BLOCK_SCALE``, whose payload on both sides is the
request's full KV page ids (``_full_kv_pages_payload``) and which every page-indexed transfer path sends as it sends
KV; on 0.5.15.post1 ``StateType.MINIMAX_INDEX_K``, whose payload is the same page ids (``_dsa_payload``) and which
Mooncake sends flat (``force_flat``), used otherwise only by a MiniMax sparse index-K pool. SGLang's state types are
a closed enum with closed payload tables, so the rows ride as a component of the one type whose payload is exactly the
request's KV pages and which a KV pool uses only for MXFP8 block scales: ``--kv-cache-dtype mxfp8`` is refused at
start-up (refusals/startup.py), and a pool that has block scales all the same stops the transfer's set-up here. The
layer ids make the layout flat (one region per buffer; plain MHA would otherwise split the entries into K and V
halves) and pair the two buffers on both peers. SGLang's KV layout digest (``utils.kv_layout_digest``: state types and
item sizes) differs for a peer without our rows or with another row size, which SGLang refuses per transfer.

A decode engine backs a retracted request's KV up and restores it into new slots with no forward (SGLang's
``--disaggregation-decode-retraction-backup``, ``host_pool`` or ``cpu_tensor``; 0.5.15.post1: CPU tensors): its rows
and marks are kept and put back with it, after any forward in flight has landed its rows.

The decode engine's request rows come from ``DecodeReqToTokenPool``, not a ``ReqToTokenPool``: the MTP opt-in of a row
(adapter/draft_site.py's hooks on ``ReqToTokenPool.alloc`` / ``free_rows``) is noted on it too.

The MTP section: the prefill engine's draft-extend files a request's prompt entries (step 0; its decode rounds run on
the decode engine). For a model with MTP layers both engines register three more per-slot buffers in the same
component (``DraftSlots``: per KV slot and MTP depth, the entry's experts, its token and a mark), so the pairing
depends on the layout only, not on the speculation flags. Before the last chunk's send the prefill engine writes the
request's entries at their positions' slots and a mark at every prompt slot (``SENT``, ``ENTRY``; ``NONE`` when it
has no entries to send: not asked for, or multi-layer MTP); after the transfer is committed the decode engine files
them ahead of its own, or, where a prompt slot arrived unmarked, notes why the section would be short (the request's
MTP section is then refused by name, ``mtp_drafted_on_prefill``).

The weight version: the prompt's rows and the first output token come from the prefill engine's weights. The prefill
engine writes the version it serves into the request's metadata row before the last chunk's send, in the 15 spare
int32 of SGLang's ``MetadataBuffers.output_ids`` row (16 wide for the 64 B RDMA minimum; SGLang reads only its first:
the first output token). No buffer is added, so a peer without sglang-r3 still pairs (it leaves the spare ints zero:
``unknown``). The decode engine reads it at commit, and where it is not the version it serves itself files it as the
version of the request's first output token (``release.file_prefill_weight_version``: 0.5.23 inserts SGLang's own
``WeightVersionEvent``, as a weight update after that token would; 0.5.15.post1, whose scheduler holds no version,
hands it to the record in the routing payload). The output's ``weight_versions`` spans then name both and the
record's ``weight_version`` says ``mixed:`` (the trainer refuses it). A request whose prefill engine sent no version
is filed as ``unknown``, never as the decode engine's. Where a scheduler learns the version it serves:
``release.served_weight_version``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np
import torch

from sglang_r3.seam import release
from sglang_r3.seam.hooks import register
from sglang_r3.serving.adapter.runtime import capturer as _capturer

logger = logging.getLogger(__name__)

# Pair the entries on both peers (unsigned on the wire); not model layers. Rows and marks, then the draft slots'.
ROW_LAYER_IDS = [1_000_000, 1_000_001]
DRAFT_LAYER_IDS = [1_000_002, 1_000_003, 1_000_004]

# DraftSlots.marks: what the prefill engine sent at a prompt slot and MTP depth.
NONE, SENT, ENTRY = 0, 1, 2  # nothing sent (stale or no entries), sent with no entry (a cached prefix), an entry


@dataclass
class DraftSlots:
    """Per KV slot and MTP depth: the prefill engine's draft-extend entry (experts, token) and its mark. Host
    tensors allocated once, registered with the KV transfer; numpy views for the host-side reads and writes."""

    experts: torch.Tensor  # [num_slots, depths, topk], the capturer's id dtype
    tokens: torch.Tensor  # int32 [num_slots, depths]
    marks: torch.Tensor  # uint8 [num_slots, depths]

    @classmethod
    def allocate(cls, num_slots: int, depths: int, topk: int, dtype: torch.dtype) -> "DraftSlots":
        return cls(torch.zeros((num_slots, depths, topk), dtype=dtype), torch.zeros((num_slots, depths), dtype=torch.int32),
                   torch.zeros((num_slots, depths), dtype=torch.uint8))

    def views(self):
        ids = self.experts.numpy()
        return (ids.view(np.uint16) if ids.dtype == np.int16 else ids), self.tokens.numpy(), self.marks.numpy()

    def buffers(self):
        return [self.experts, self.tokens, self.marks]


_draft_slots: "DraftSlots | None" = None  # this scheduler's, set with the KV transfer (one scheduler per process)

VERSION_INTS = slice(1, 16)  # of a MetadataBuffers.output_ids row (int32 [size, 16]): SGLang reads only [0]
VERSION_BYTES = 60  # a weight version's UTF-8 bytes, zero-padded; a longer one travels as its sha256
UNSENT_VERSION = "unknown (the prefill engine sent no weight version)"


def _wire_version(version) -> bytes:
    """The version as it travels (zero-padded to VERSION_BYTES); None (not known here) travels as zeros."""
    raw = b"" if version is None else str(version).encode()
    if len(raw) > VERSION_BYTES:
        raw = ("sha256:" + hashlib.sha256(raw).hexdigest())[:VERSION_BYTES].encode()
    return raw.ljust(VERSION_BYTES, b"\0")


def _write_version(metadata_buffers, index: int, version) -> None:
    row = torch.from_numpy(np.frombuffer(_wire_version(version), dtype=np.int32).copy())
    metadata_buffers.output_ids[index, VERSION_INTS] = row.to(metadata_buffers.output_ids.device)


def _take_version(metadata_buffers, index: int) -> bytes:
    """What the prefill engine wrote (all zeros for a peer without sglang-r3); the row's spare ints are cleared, so a
    transfer that brings no metadata (a fake one) never reads a slot's earlier request's."""
    ints = metadata_buffers.output_ids[index, VERSION_INTS]
    raw = ints.to("cpu").numpy().tobytes()
    ints.zero_()
    return raw


_PREFILL = "sglang.srt.disaggregation.prefill"
_DECODE = "sglang.srt.disaggregation.decode"


class RowsCarrierTaken(RuntimeError):
    """The KV pool already sends a component of the carrier's state type: the rows' carrier is taken."""


def append_capture_rows(result, kv_args, token_to_kv_pool, *args, **kwargs):
    """After ``setup_state_kv_args`` (prefill and decode engine alike): the capture rows and their marks become one
    more state component of the KV transfer, one item per KV page."""
    from sglang.srt.disaggregation.base.conn import StateType
    from sglang.srt.disaggregation.utils import append_state_component

    cap = _capturer()
    if cap is None:
        raise RuntimeError("sglang-r3: PD disaggregation with no sglang-r3 capturer in this scheduler when its KV "
                           "transfer is set up: the prompt's rows could not travel with its KV")
    if any(cap.host.data_ptr() in ptrs for ptrs in kv_args.state_data_ptrs):
        # Both targets name one function (prefill.py and decode.py import it from utils.py): SGLang's registry may
        # run this hook twice for one call.
        return result
    carrier = release.pd_rows_carrier()
    state_type = getattr(StateType, carrier.state_type)
    if state_type in kv_args.state_types:
        raise RowsCarrierTaken(
            f"sglang-r3: this KV pool sends {carrier.used_by} as the KV transfer's {state_type.value} component, the "
            "one the prompt's routing rows travel in under PD disaggregation; this model and KV cache cannot be "
            "served under PD with routing")
    page = int(token_to_kv_pool.page_size)
    buffers, layer_ids = [cap.host, cap.written], list(ROW_LAYER_IDS)
    global _draft_slots
    depths = int(cap.layout.num_mtp_layers)
    if depths:
        # By the layout, not the speculation flags: both peers of a pair register the same buffers.
        _draft_slots = DraftSlots.allocate(cap.host.shape[0], depths, cap.topk, cap.dtype)
        buffers += _draft_slots.buffers()
        layer_ids += DRAFT_LAYER_IDS
    per_slot = [b[0].numel() * b.element_size() for b in buffers]
    append_state_component(
        kv_args, state_type,
        [b.data_ptr() for b in buffers],
        [b.numel() * b.element_size() for b in buffers],
        [n * page for n in per_slot],
        **({"layer_ids": layer_ids} if carrier.layer_ids else {}),
    )
    # SGLang's own KV items (one per page and layer buffer) beside ours: what the rows add to a request's transfer
    # (benchmarks/pd_cost.py reads this line).
    kv_bytes = sum(int(n) for n in kv_args.kv_item_lens) // page
    logger.info("sglang-r3 PD: the capture rows travel with the KV transfer (%d B per KV slot; the KV: %d B per KV "
                "slot; of ours, MTP draft slots: %d B)", sum(per_slot), kv_bytes, sum(per_slot[2:]))
    return result


def _prompt_slots(req_to_token_pool, req) -> np.ndarray:
    """The KV slots of the request's prompt (one small device->host read, on the scheduler path)."""
    n = len(req.origin_input_ids)
    return req_to_token_pool.req_to_token[release.req_pool_idx(req), :n].to("cpu", torch.int64).numpy()


def send_prompt_extras(self, req, last_chunk=False, *args, **kwargs):
    """Before the prefill engine's last chunk of a request is sent (``send_kv_chunk(req, last_chunk=True)``, which
    sends the state components and the metadata): the weight version it serves, in the request's metadata slot; every
    prompt slot's draft marks say what this request sends, never what a slot's earlier request left, and where its
    draft-extend filed entries, they are written at their positions' slots."""
    cap = _capturer()
    if not last_chunk or cap is None:
        return None
    if req.metadata_buffer_index >= 0:
        _write_version(self.disagg_metadata_buffers, req.metadata_buffer_index, release.served_weight_version(req))
    if _draft_slots is None:
        return None
    ids, tokens, marks = _draft_slots.views()
    slots = _prompt_slots(self.req_to_token_pool, req)
    marks[slots] = NONE
    entries = cap.draft.prompt_entries(release.req_pool_idx(req)) if cap.draft is not None else None
    if entries is None:
        return None
    entries = entries[entries["positions"] < slots.shape[0]]
    marks[slots] = SENT
    at, depth = slots[entries["positions"]], entries["depth"].astype(np.int64) - 1
    ids[at, depth] = entries["experts"]
    tokens[at, depth] = entries["tokens"]
    marks[at, depth] = ENTRY
    return None


def take_prompt_extras(result, self, decode_req, *args, **kwargs):
    """After the decode engine commits a request's transfer (``DecodeTransferQueue._commit_transfer_to_req``): the
    prefill engine's weight version, where it is not this engine's, becomes the version of the request's first
    output token; the prefill engine's prompt entries are filed ahead of this engine's, or, where a prompt slot
    arrived with no mark, the request notes why its MTP section would be short."""
    cap = _capturer()
    req = decode_req.req
    if decode_req.metadata_buffer_index >= 0:
        _note_prefill_weight_version(req, self.metadata_buffers, decode_req.metadata_buffer_index)
    if cap is None or cap.draft is None or _draft_slots is None or release.req_pool_idx(req) is None:
        return result
    row = release.req_pool_idx(req)
    if not cap.draft.wants(row):
        return result
    ids, tokens, marks = _draft_slots.views()
    slots = _prompt_slots(self.scheduler.req_to_token_pool, req)
    got = marks[slots]
    unsent = int((got == NONE).all(axis=1).sum())
    if unsent:
        cap.draft.mark_not_carried(row, (
            f"the prefill engine sent no MTP draft routing for {unsent} of the prompt's {slots.shape[0]} positions "
            "(its request did not ask for the MTP section, it ran no MTP draft, or it runs multi-layer MTP, whose "
            "prompt drafts wait for a verify on the decode engine)"))
        return result
    pos, depth = np.nonzero(got == ENTRY)
    order = np.lexsort((pos, depth))  # as a draft forward files them: each depth's positions in order
    pos, depth = pos[order], depth[order]
    cap.draft.file_carried(row, pos.astype(np.int32), (depth + 1).astype(np.uint8), tokens[slots[pos], depth],
                           ids[slots[pos], depth])
    return result


def drop_drafts_of_freed_decode_request(self, req, *args, **kwargs):
    cap = _capturer()
    if cap is not None and cap.draft is not None and release.req_pool_idx(req) is not None:
        cap.draft.forget([release.req_pool_idx(req)])
    return None


def _note_prefill_weight_version(req, metadata_buffers, index: int) -> None:
    raw = _take_version(metadata_buffers, index)
    if raw != _wire_version(release.served_weight_version(req)):
        prefill = raw.rstrip(b"\0").decode(errors="replace") or UNSENT_VERSION
        release.file_prefill_weight_version(req, prefill)


def unmark_preallocated_slots(result, self, req, *args, **kwargs):
    """After a decode engine allocates a request's KV slots (``DecodePreallocQueue._pre_alloc``: a new PD request's,
    or a resumed one's): no mark there says captured until the prefill engine's rows arrive with the KV (or a resumed
    request's own are put back), so a peer that sends none, or a transfer that writes none, leaves ``missing_rows``,
    never the rows a slot's previous request left. At allocation, before the decode engine tells the prefill engine
    where to write: one small device->host read per request, off the forward path."""
    cap = _capturer()
    if cap is None or result is None:
        return result
    slots = result.to("cpu", torch.int64).reshape(-1)
    slots = slots[slots >= 0]
    cap.written[slots] = False
    if _draft_slots is not None:
        _draft_slots.marks[slots] = NONE
    return result


def _req_to_token_pool(args, kwargs):
    """The ReqToTokenPool among a hooked call's arguments (0.5.23's module functions and 0.5.15's Req methods
    place it differently: release.pd_retraction_targets)."""
    return next(a for a in (*args, *kwargs.values()) if hasattr(a, "req_to_token"))


def keep_rows_of_retracted_request(req, *args, **kwargs):
    """Before a decode engine copies a retracted request's KV out (0.5.23 ``mem_cache.common.backup_kv_cache``,
    called by ``schedule_batch.release_req`` in decode mode only; 0.5.15 ``Req.offload_kv_cache``): keep its rows and
    marks. SGLang copies the KV of its first ``seqlen - 1`` tokens out (``cpu_tensor``: ``Req.offload_kv_cache``;
    ``host_pool``: ``UnifiedRadixCache._retraction_device_transfers``) and back into new slots on resume with no
    forward, so the rows must follow, or the new slots would serve whatever the marks there say (another request's
    rows)."""
    cap = _capturer()
    n = int(req.seqlen) - 1
    if cap is None or n <= 0:
        return None
    # One small device->host read at retraction, beside SGLang's own KV copy out (not on the forward path).
    pool = _req_to_token_pool(args, kwargs)
    slots = pool.req_to_token[release.req_pool_idx(req), :n].to("cpu", torch.int64)
    # Its MTP entries leave with it too: the row is freed next, and its draft entries with it.
    kept = {"n": n, "drafts": cap.draft.detach(release.req_pool_idx(req)) if cap.draft is not None else None}
    req._r3_retracted_rows = kept
    # The forward in flight (overlap scheduler) may still be bringing this request's last row to the host.
    cap.after_rows_land(lambda: kept.update(rows=cap.host[slots], marks=cap.written[slots]))
    return None


def put_back_rows_of_resumed_request(result, req, *args, **kwargs):
    """After SGLang restores a resumed request's KV into its new slots (0.5.23 ``restore_kv_cache``, 0.5.15
    ``Req.load_kv_cache``): its rows and marks go to the same slots; a forward in flight that still writes there (a
    finished request's redundant forward, as SGLang's ``resume_retracted_reqs`` notes) lands first."""
    kept = getattr(req, "_r3_retracted_rows", None)
    cap = _capturer()
    if kept is None or cap is None:
        return result
    del req._r3_retracted_rows
    pool = _req_to_token_pool(args, kwargs)
    slots = pool.req_to_token[release.req_pool_idx(req), : kept["n"]].to("cpu", torch.int64)
    if cap.draft is not None:
        cap.draft.attach(release.req_pool_idx(req), kept["drafts"])

    def put_back():
        if "rows" not in kept:  # never kept (no forward landed them): the slots stay unmarked, missing_rows
            cap.written[slots] = False
            return
        cap.host[slots] = kept["rows"]
        cap.written[slots] = kept["marks"]

    cap.after_rows_land(put_back)
    return result


def install_pd_patches() -> None:  # called once, by install_capture_patches
    from sglang_r3.serving.adapter.draft_site import start_rows_without_drafts

    register(f"{_PREFILL}.setup_state_kv_args", append_capture_rows, "after")
    register(f"{_DECODE}.setup_state_kv_args", append_capture_rows, "after")
    register(f"{_DECODE}.DecodeReqToTokenPool.alloc", start_rows_without_drafts, "after")
    register(f"{_DECODE}.DecodeReqToTokenPool.free", drop_drafts_of_freed_decode_request, "before")
    register(f"{_DECODE}.DecodePreallocQueue._pre_alloc", unmark_preallocated_slots, "after")
    register(f"{_PREFILL}.SchedulerDisaggregationPrefillMixin.send_kv_chunk", send_prompt_extras, "before")
    register(f"{_DECODE}.DecodeTransferQueue._commit_transfer_to_req", take_prompt_extras, "after")
    out, back = release.pd_retraction_targets()
    register(out, keep_rows_of_retracted_request, "before")
    register(back, put_back_rows_of_resumed_request, "after")
