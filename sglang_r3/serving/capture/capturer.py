"""Main-model MoE routing per KV slot, in compact dtype.

Rows are keyed by KV slot, so prefix-cache hits and speculative verify are right for free: a slot's row is
written by the forward that computed its KV. Fail closed: a forward writes every MoE column of a slot or
clears its mark, and a request with an unmarked slot gets no rows. The staging buffer is sized once (CUDA
graphs keep its storage); under the overlap scheduler the host copy is deferred (``DeferredRows``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np
import torch

from sglang_r3.core.layout import ModelLayout

logger = logging.getLogger(__name__)


class CaptureViolation(RuntimeError):
    """A forward tried to write routing where it must not (e.g. a draft into main rows)."""


def torch_dtype_for(layout: ModelLayout) -> torch.dtype:
    # int16 holds ids < 32768 and views losslessly as uint16 on the wire.
    return torch.uint8 if layout.expert_dtype == "uint8" else torch.int16


@dataclass
class CaptureStats:
    # Real tokens only: padding rows of a batch SGLang padded (DP attention) are never counted.
    main_forwards: int = 0  # target forwards whose rows were written (with at least one real token)
    main_rows_written: int = 0  # rows written, one per real token (each row holds every MoE layer)
    main_captures_from_draft: int = 0  # must stay 0: checked by tests through /routing/stats
    unknown_layer_captures: int = 0
    rows_invalidated: int = 0  # slots whose KV a forward computed without capturing their rows
    incomplete_forwards: int = 0  # eager forwards where some MoE layer did not capture
    # Host-buffer writes made on the forward path (a blocking device->host copy on a GPU); 0 under
    # the overlap scheduler, which hands every copy to its result-copy stream (deferred_copies).
    blocking_copies: int = 0
    deferred_copies: int = 0  # copies handed to the overlap scheduler's result-copy stream
    kv_moves: int = 0  # KV-move calls seen (tree drafting)
    rows_moved: int = 0  # rows that actually changed slot
    extra: Dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, int]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


CAPTURE_MODES = ("off", "main", "main+mtp")
# SGLang's /set_internal_state channel carries numbers only.
CAPTURE_MODE_CODES = {0: "off", 1: "main", 2: "main+mtp"}


_NO_TOKENS = 1 << 62  # _seen_tokens before any column captured in the current forward
_VIEW_CACHE = 8  # batch sizes whose staging views are kept (decode batches repeat their sizes)
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # topk ids of one (token, layer)


class StagingOverflow(CaptureViolation):
    """A forward carried more tokens than the staging buffer sized from the server's limits."""


@dataclass
class DeferredRows:
    """One forward's rows on their way to the host, for SGLang's overlap scheduler.

    Duck-types upstream's ``TopkCaptureOutput``: ``map_device_tensors`` is handed
    SGLang's pinned non-blocking D2H copy (run on the result-copy stream), and
    ``finalize`` runs after ``copy_done.synchronize()``, before the batch's
    results (and so any request finish) are processed.
    """

    loc: torch.Tensor  # [n] KV slots (device until mapped)
    rows: Optional[torch.Tensor]  # [n, n_moe, topk], or None: invalidate the slots (nothing captured)
    capturer: "RoutingCapturer"
    # KV moves made after this forward in the same step (tree drafting moves accepted verify
    # tokens' KV): applied after the rows land, in order.
    moves: list = field(default_factory=list)
    # Host-side row work queued after this forward in the same step (a PD decode engine's retraction keeps and puts
    # back a request's rows, adapter/pd_rows.py): run after the rows land and the moves, in order.
    then: list = field(default_factory=list)

    def map_device_tensors(self, fn):
        self.loc = fn(self.loc)
        if self.rows is not None:
            self.rows = fn(self.rows)
        self.moves = [(fn(src), fn(dst)) for src, dst in self.moves]

    def finalize(self):
        cap = self.capturer
        cap._store(self.loc, self.rows)
        for src, dst in self.moves:
            cap._move(src, dst)
        for fn in self.then:
            fn()
        if cap._open is self:
            cap._open = None


class RoutingCapturer:
    """Duck-types SGLang's RoutedExpertsCapturer (capture / on_forward_end / destroy)."""

    def __init__(
        self,
        layout: ModelLayout,
        num_slots: int,
        max_batch_tokens: int,
        device: str | torch.device = "cpu",
        host_word_scatter: bool = True,
    ):
        """host_word_scatter: with CPU staging of word-sized rows, scatter staging words straight into
        the host buffer (False: the row buffer and ``_store``, the path device staging always takes)."""
        self.layout = layout
        self.topk = layout.topk
        self.num_moe = len(layout.moe_layer_ids)
        self.dtype = torch_dtype_for(layout)
        self.device = torch.device(device)
        # layer id -> column; -1 for layers without main rows (dense).
        self._column = [-1] * layout.num_hidden_layers
        for col, layer_id in enumerate(layout.moe_layer_ids):
            self._column[layer_id] = col
        self._all_columns = (1 << self.num_moe) - 1
        self._seen = 0  # bit per column captured in the current eager forward
        self._seen_tokens = 0  # fewest tokens any column captured in the current forward
        pin = self.device.type == "cuda"  # non_blocking D2H lands only in pinned memory
        self.host = torch.zeros((num_slots, self.num_moe, self.topk), dtype=self.dtype, pin_memory=pin)
        # written[s]: the row at slot s was captured by the forward that computed slot s's KV.
        self.written = torch.zeros(num_slots, dtype=torch.bool, pin_memory=pin)
        # The same host memory seen by numpy: the per-forward scatter and the per-request gather index it
        # with a handful of slots at a time, where a torch op's dispatch costs more than the copy.
        self._host_np, self._written_np = self.host.numpy(), self.written.numpy()
        # Layer-major [n_moe, max_tokens, topk]: each layer's capture is one contiguous block (the
        # int32 -> compact conversion into a strided row-major slice is the slow form of the same
        # copy); the forward end reads it back as rows [n, n_moe, topk] through a transposed view.
        self.staging = torch.zeros((self.num_moe, max_batch_tokens, self.topk), dtype=self.dtype, device=self.device)
        # The forward end turns the layer-major staging into rows by moving each (layer, token) group of
        # topk ids as one machine word (a word-wise transpose copy), into a row buffer allocated once.
        word = _WORDS.get(self.topk * self.staging.element_size())
        self._staging_words = None if word is None else self.staging.view(word)
        self._rows = torch.empty((max_batch_tokens, self.num_moe, self.topk), dtype=self.dtype, device=self.device)
        # CPU staging is host memory already: the forward end scatters its words straight into the host
        # buffer's words through numpy ([slots, n_moe] <- [n_moe, n].T), one fancy assignment in place of
        # the row-buffer transpose, two tensor->numpy hops and a second copy.
        self._cpu_words = None
        if host_word_scatter and self._staging_words is not None and self.device.type == "cpu":
            stage_w = self._staging_words.numpy().reshape(self.num_moe, max_batch_tokens)
            host_w = self._host_np.view(stage_w.dtype).reshape(num_slots, self.num_moe)
            # A copy would have its own bounds: the O(1) bounds check is enough (reshape of a contiguous array is a view).
            if not (np.may_share_memory(host_w, self._host_np) and np.may_share_memory(stage_w, self.staging.numpy())):
                raise RuntimeError("word views of the capture buffers are copies")
            self._cpu_words = (host_w, stage_w)
        # Every MoE layer of a forward captures the same token count: the per-column views of the
        # staging are built once per batch size, not once per layer (capture() runs per layer).
        self._views: Dict[int, list] = {}
        self._seen_tokens = _NO_TOKENS
        self.stats = CaptureStats()
        # Set while a draft (MTP) forward runs; a main capture then is a bug.
        self._draft_depth = threading.local()
        self.draft: Optional["object"] = None  # DraftCapturer, attached by the speculative worker
        self._open: Optional[DeferredRows] = None  # the latest forward's rows, not yet on the host
        # Runtime switch (benchmarks compare modes inside one server process).
        self.mode = "main+mtp"

    def set_mode(self, mode: str) -> None:
        if mode not in CAPTURE_MODES:
            raise ValueError(f"capture mode {mode!r} is not one of {CAPTURE_MODES}")
        self.mode = mode

    @property
    def capture_main(self) -> bool:
        return self.mode != "off"

    @property
    def capture_mtp(self) -> bool:
        return self.mode == "main+mtp"

    # -- draft guard -------------------------------------------------------
    def enter_draft_forward(self) -> None:
        self._draft_depth.n = getattr(self._draft_depth, "n", 0) + 1

    def exit_draft_forward(self) -> None:
        self._draft_depth.n -= 1

    # -- SGLang capturer interface ------------------------------------------
    def capture(self, layer_id: int, topk_indices: torch.Tensor) -> None:
        if self.mode == "off":  # the capture_main property, inlined: this runs once per MoE layer
            return
        if getattr(self._draft_depth, "n", 0) > 0:
            self.stats.main_captures_from_draft += 1
            raise CaptureViolation(
                f"a draft (MTP) forward tried to write main routing rows (layer_id={layer_id})"
            )
        col = self._column[layer_id] if 0 <= layer_id < len(self._column) else -1
        if col < 0:
            self.stats.unknown_layer_captures += 1
            raise CaptureViolation(
                f"routing captured for layer {layer_id}, which the layout ({self.layout.summary()}) "
                f"does not list as a main MoE layer"
            )
        n = topk_indices.shape[0]
        views = self._views.get(n)
        if views is None:
            if n > self.max_tokens:
                raise StagingOverflow(
                    f"a forward routed {n} tokens but the capture staging holds {self.max_tokens} "
                    f"(sized from the server's chunked-prefill / max-running-requests limits)"
                )
            if len(self._views) >= _VIEW_CACHE:
                self._views.clear()
            views = self._views[n] = list(self.staging[:, :n].unbind(0))
        # Upstream may append fused shared-expert columns after the routed ones.
        views[col].copy_(topk_indices if topk_indices.shape[1] == self.topk else topk_indices[:, : self.topk])
        if n < self._seen_tokens:
            self._seen_tokens = n
        self._seen |= 1 << col

    def on_forward_end(self, forward_batch, can_run_graph=False, cuda_graph_batch=None, no_copy_to_cpu=False):
        loc = getattr(forward_batch, "out_cache_loc_virtual", None)
        if loc is None:
            loc = forward_batch.out_cache_loc
        n = int(loc.shape[0])
        complete = self.capture_main and (
            # A replayed CUDA graph writes every column without calling capture() from Python;
            # the graph was recorded from an eager forward that did.
            can_run_graph or (self._seen == self._all_columns and self._seen_tokens >= n)
        )
        if self.capture_main and not complete and n:
            self.stats.incomplete_forwards += 1
        self._seen = 0
        self._seen_tokens = _NO_TOKENS
        if not n:
            return None
        # Under the overlap scheduler the next forward reuses staging and row buffer before the host copy
        # runs: the rows then go straight into a fresh tensor (one copy, not a copy and a clone).
        rows = self._rows_of(n, fresh=no_copy_to_cpu) if complete and (no_copy_to_cpu or self._cpu_words is None) else None
        if no_copy_to_cpu:
            self.stats.deferred_copies += 1
            self._open = DeferredRows(loc=loc.clone(), rows=rows, capturer=self)
            return self._open
        self.stats.blocking_copies += 1
        if complete and self._cpu_words is not None:
            host_w, stage_w = self._cpu_words
            idx = loc.numpy()
            host_w[idx] = stage_w[:, :n].T
            self._written_np[idx] = True
            self._count(idx, True)
            return None
        self._store(loc, rows)
        return None

    def _count(self, idx: np.ndarray, written: bool) -> None:
        """Counters of real rows only, read off the slots once they are on the host (no device sync): a
        batch SGLang padded (DP attention pads an idle or short rank's batch to the gather's length,
        ``ForwardBatch._pad_inputs_to_size``) carries padding tokens at slot 0, the slot SGLang's KV
        allocators never hand out ("the padded slot 0 is used for writing dummy outputs from padded
        tokens"). Their rows land in slot 0 and are never read; they are not counted."""
        real = int(np.count_nonzero(idx))
        if not real:
            return
        if written:
            self.stats.main_forwards += 1
            self.stats.main_rows_written += real
        else:
            self.stats.rows_invalidated += real

    def _rows_of(self, n: int, fresh: bool = False) -> torch.Tensor:
        """The staged forward as contiguous rows [n, n_moe, topk]: in the row buffer, or (``fresh``) in
        a tensor of their own."""
        dst = torch.empty_like(self._rows[:n]) if fresh else self._rows[:n]
        if self._staging_words is None:
            return dst.copy_(self.staging[:, :n].transpose(0, 1))
        dst.view(self._staging_words.dtype).copy_(self._staging_words[:, :n].transpose(0, 1))
        return dst

    def _store(self, loc: torch.Tensor, rows: Optional[torch.Tensor]) -> None:
        idx = loc.to("cpu").numpy()
        self._count(idx, rows is not None)
        if rows is None:
            self._written_np[idx] = False
            return
        self._host_np[idx] = rows.to("cpu").numpy()
        self._written_np[idx] = True

    def destroy(self) -> None:
        self._views = {}
        self._staging_words = self._rows = self._cpu_words = None
        self.host = self._host_np = None
        self.written = self._written_np = None
        self.staging = None

    # -- reads ---------------------------------------------------------------
    def rows_for_slots(self, slots: torch.Tensor):
        """(rows [len(slots), n_moe, topk] copied, number of those slots with no captured row)."""
        idx = slots.to("cpu").numpy()
        marks = self._written_np[idx]
        missing = 0 if marks.all() else int(idx.size - int(marks.sum()))
        return torch.from_numpy(self._host_np[idx]), missing  # advanced indexing already copies

    def move_rows(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Follow a KV move inside a request (tree drafting keeps accepted tokens' KV at new slots)."""
        self.stats.kv_moves += 1
        if self._open is not None:  # the moved rows are still on their way to the host
            self._open.moves.append((src_slots.clone(), dst_slots.clone()))
            return
        self.stats.blocking_copies += 1
        self._move(src_slots, dst_slots)

    def _move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        src = src_slots.to("cpu").long().reshape(-1)
        dst = dst_slots.to("cpu").long().reshape(-1)
        keep = (src >= 0) & (dst >= 0) & (src != dst)  # -1: sentinel of an unused accept slot
        if not bool(keep.any()):
            return
        src, dst = src[keep], dst[keep]
        self.host[dst] = self.host[src].clone()  # clone: src and dst ranges may overlap
        self.written[dst] = self.written[src].clone()
        self.stats.rows_moved += int(dst.numel())

    def after_rows_land(self, fn) -> None:
        """Run ``fn`` (host rows work) once the forward in flight has its rows on the host: now when none is."""
        if self._open is not None:
            self._open.then.append(fn)
        else:
            fn()

    def host_bytes_per_slot(self) -> int:
        return self.num_moe * self.topk * self.host.element_size() + self.written.element_size()

    @property
    def max_tokens(self) -> int:
        """Tokens one forward may route (the staging size fixed at start-up)."""
        return self.staging.shape[1]

    def staging_ptr(self) -> int:
        """Where the buffers the forward path writes live: staging and row buffer, one address.

        Both are allocated once (CUDA graphs keep writing where they were recorded); a change of
        either changes this value.
        """
        return hash((self.staging.untyped_storage().data_ptr(), self._rows.untyped_storage().data_ptr()))
