"""The capturer: main-model MoE routing per KV slot, in compact dtype.

Lifecycle of one row: the MoE router of main layer ``l`` picks top-k ids for
the tokens of a target forward -> ``capture(l, ids)`` stages them at
``[token, row(l)]`` -> ``on_forward_end`` scatters the staged rows into the
host buffer at each token's KV slot -> at request finish ``rows_for_slots``
gathers the request's slots. Keying by KV slot is what makes prefix-cache hits
and speculative verify correct for free: a slot's row is written by the
forward that computed that slot's KV, and only accepted tokens keep slots.

Only MoE layers get a column (dense layers have no routing), so a row is
``n_moe * topk`` bytes instead of upstream's ``num_hidden_layers * topk * 4``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

from sglang_r3.layout import ModelLayout

logger = logging.getLogger(__name__)


class CaptureViolation(RuntimeError):
    """A forward tried to write routing where it must not (e.g. a draft into main rows)."""


def torch_dtype_for(layout: ModelLayout) -> torch.dtype:
    # int16 holds ids < 32768 and views losslessly as uint16 on the wire.
    return torch.uint8 if layout.expert_dtype == "uint8" else torch.int16


@dataclass
class CaptureStats:
    main_forwards: int = 0
    main_rows_written: int = 0
    main_captures_from_draft: int = 0  # must stay 0: checked by tests through /routing/stats
    unknown_layer_captures: int = 0
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


class RoutingCapturer:
    """Duck-types SGLang's RoutedExpertsCapturer (capture / on_forward_end / destroy)."""

    def __init__(
        self,
        layout: ModelLayout,
        num_slots: int,
        max_batch_tokens: int,
        device: str | torch.device = "cpu",
    ):
        self.layout = layout
        self.topk = layout.topk
        self.num_moe = len(layout.moe_layer_ids)
        self.dtype = torch_dtype_for(layout)
        # layer id -> column; -1 for layers without main rows (dense).
        self._column = [-1] * layout.num_hidden_layers
        for col, layer_id in enumerate(layout.moe_layer_ids):
            self._column[layer_id] = col
        self.host = torch.zeros((num_slots, self.num_moe, self.topk), dtype=self.dtype)
        self.staging = torch.zeros((max_batch_tokens, self.num_moe, self.topk), dtype=self.dtype, device=device)
        self.stats = CaptureStats()
        # Set while a draft (MTP) forward runs; a main capture then is a bug.
        self._draft_depth = threading.local()
        self.draft: Optional["object"] = None  # DraftCapturer, attached by the speculative worker
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
    @property
    def in_draft_forward(self) -> bool:
        return getattr(self._draft_depth, "n", 0) > 0

    def enter_draft_forward(self) -> None:
        self._draft_depth.n = getattr(self._draft_depth, "n", 0) + 1

    def exit_draft_forward(self) -> None:
        self._draft_depth.n -= 1

    # -- SGLang capturer interface ------------------------------------------
    def capture(self, layer_id: int, topk_indices: torch.Tensor) -> None:
        if not self.capture_main:
            return
        if self.in_draft_forward:
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
        if n > self.staging.shape[0]:  # a bigger forward than any so far (rare): grow once
            self.staging = torch.zeros((2 * n, *self.staging.shape[1:]), dtype=self.dtype, device=self.staging.device)
        # Upstream may append fused shared-expert columns after the routed ones.
        self.staging[:n, col, :] = topk_indices[:, : self.topk]

    def on_forward_end(self, forward_batch, can_run_graph=False, cuda_graph_batch=None, no_copy_to_cpu=False):
        if not self.capture_main:
            return None
        loc = getattr(forward_batch, "out_cache_loc_virtual", None)
        if loc is None:
            loc = forward_batch.out_cache_loc
        n = int(loc.shape[0])
        if n:
            self.host[loc.to("cpu", non_blocking=False).long()] = self.staging[:n].to("cpu")
        self.stats.main_forwards += 1
        self.stats.main_rows_written += n
        return None  # rows are already on the host; nothing for the overlap thread

    def destroy(self) -> None:
        self.host = None
        self.staging = None

    # -- reads ---------------------------------------------------------------
    def rows_for_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """[len(slots), n_moe, topk] copy of the rows at these KV slots."""
        return self.host[slots.to("cpu").long()].clone()

    def move_rows(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Follow a KV move inside a request (tree drafting keeps accepted tokens' KV at new slots)."""
        self.stats.kv_moves += 1
        src = src_slots.to("cpu").long().reshape(-1)
        dst = dst_slots.to("cpu").long().reshape(-1)
        keep = (src >= 0) & (dst >= 0) & (src != dst)  # -1: sentinel of an unused accept slot
        if not bool(keep.any()):
            return
        src, dst = src[keep], dst[keep]
        self.host[dst] = self.host[src].clone()  # clone: src and dst ranges may overlap
        self.stats.rows_moved += int(dst.numel())

    def host_bytes_per_slot(self) -> int:
        return self.num_moe * self.topk * self.host.element_size()
