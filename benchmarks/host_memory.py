"""Capturer host memory: bytes per KV slot (main rows) and per MTP draft entry, vs upstream.

Upstream SGLang keeps ``[kv_slots, num_hidden_layers, topk]`` int32 on the host: ``L * topk * 4`` bytes per
slot. The capturer keeps only main MoE layers in uint8/int16. The MTP side keeps per-request entries
(``DraftCapturer``); bytes per entry are measured on the real class by filing synthetic draft forwards.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import httpx
import numpy as np
import torch

from benchmarks.shapes import SHAPES, Shape
from sglang_r3.serving.capture.capturer import RoutingCapturer, torch_dtype_for
from sglang_r3.serving.capture.draft import DraftCapturer
from sglang_r3.core.layout import ModelLayout


def upstream_bytes_per_slot(num_hidden_layers: int, topk: int) -> int:
    return num_hidden_layers * topk * 4


def main_bytes_per_slot(layout: ModelLayout) -> int:
    """The real capturer's figure for this layout (tiny buffers; the figure is per slot)."""
    return RoutingCapturer(layout, num_slots=4, max_batch_tokens=4).host_bytes_per_slot()


def draft_bytes_per_entry(layout: ModelLayout, requests: int = 8, rounds: int = 50, steps: int = 3) -> Dict[str, float]:
    """File `rounds` speculation rounds of `steps` draft steps for `requests` requests, then weigh what is held."""
    dtype = torch_dtype_for(layout)
    mtp_depths = {i: l.depth for i, l in enumerate(layout.mtp_layers)}
    if not mtp_depths:
        return {}
    draft = DraftCapturer(depth_of_config={id(k): d for k, d in mtp_depths.items()}, topk=layout.topk, dtype=dtype)
    keys = list(mtp_depths)  # stand-ins for the MTP routers' topk_config objects
    rng = np.random.default_rng(0)
    pos = 0
    for _ in range(rounds):
        for step in range(steps):
            n = requests
            for k in keys:
                ids = torch.from_numpy(rng.integers(0, layout.num_experts, (n, layout.topk)).astype(np.int64))
                draft.capture(k, ids)
            draft.file_forward(
                list(range(requests)), [1] * n, [1] * n,
                torch.full((n,), pos, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), step,
            )
        draft.resolve_round(list(range(requests)), [1] * requests)
        pos += 1
    held = draft.held_bytes()
    entries = held["entries"]
    array_bytes = sum(np.dtype(d).itemsize for d in ("i4", "i4", "u1", "u1", "i4", "?")) + layout.topk * (
        1 if dtype == torch.uint8 else 2
    )
    return {
        "entries": entries,
        "requests": requests,
        "array_bytes_per_entry": array_bytes,
        "total_bytes_per_entry": round(held["bytes"] / entries, 2),
        "note": "DraftCapturer.held_bytes(): column capacity (grown 1.5x per request) plus numpy and Python "
        "object headers, divided by live entries; array_bytes_per_entry: positions, tokens, round int32; "
        "depth, step uint8; accepted bool; topk ids",
    }


def for_shapes(shapes: List[Shape] = list(SHAPES)) -> Dict[str, Any]:
    out = {}
    for s in shapes:
        layout = s.layout()
        main = main_bytes_per_slot(layout)
        up = upstream_bytes_per_slot(s.num_hidden_layers, s.topk)
        out[s.name] = {
            "main_bytes_per_slot": main,
            "upstream_bytes_per_slot": up,
            "upstream_over_ours": round(up / main, 3),
            "mtp": draft_bytes_per_entry(layout),
        }
    return out


def live(url: str, layout_url: Optional[str] = None) -> Dict[str, Any]:
    """host_bytes_per_slot as the running server reports it, against upstream's for its layout."""
    stats = httpx.get(url + "/routing/stats", timeout=60).json()[0]
    layout = ModelLayout.from_dict(httpx.get(url + "/routing/layout", timeout=60).json())
    per_slot = stats["host_bytes_per_slot"]
    up = upstream_bytes_per_slot(layout.num_hidden_layers, layout.topk)
    draft = stats.get("draft") or {}
    return {
        "host_bytes_per_slot": per_slot,
        "upstream_bytes_per_slot": up,
        "upstream_over_ours": round(up / per_slot, 3),
        "expected_from_layout": main_bytes_per_slot(layout),
        "draft_entries_total": draft.get("entries"),
        "main_rows_written_total": stats.get("main_rows_written"),
        "draft_entries_per_main_row": round(draft["entries"] / stats["main_rows_written"], 3)
        if draft.get("entries") and stats.get("main_rows_written") else None,
        "mtp_bytes_per_entry_arrays": draft_bytes_per_entry(layout)["array_bytes_per_entry"] if layout.mtp_layers else None,
    }
