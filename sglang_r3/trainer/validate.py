"""Check a routing record against the layout and its sample before anything is replayed."""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

from sglang_r3.layout import ModelLayout
from sglang_r3.record import RecordError, RoutingRecord


def token_count(tokens: Any) -> int:
    """A sample's token count, from an int, a 1-D tensor/array or a list of ids."""
    if isinstance(tokens, (int, np.integer)):
        return int(tokens)
    shape = getattr(tokens, "shape", None)
    if shape is not None:
        if len(shape) != 1:
            raise RecordError(f"a sample's tokens must be 1-D, got shape {tuple(shape)}")
        return int(shape[0])
    return len(tokens)


def _layer_difference(got: Sequence[int], want: Sequence[int]) -> str:
    missing = [l for l in want if l not in got]
    extra = [l for l in got if l not in want]
    parts = []
    if missing:
        parts.append(f"omit layer(s) {missing}")
    if extra:
        parts.append(f"have layer(s) {extra} the layout does not route")
    if not parts:
        parts.append("are out of order")
    return f"record layers {list(got)} {' and '.join(parts)} (layout MoE layers: {list(want)})"


def check_record(record: RoutingRecord, layout: ModelLayout, num_tokens: int, sample: int = 0) -> None:
    """Raise RecordError naming what differs; return silently when the record fits."""
    where = f"sample {sample}"
    if not isinstance(record, RoutingRecord):
        raise RecordError(f"{where}: expected a RoutingRecord, got {type(record).__name__}")
    if record.layout != layout.fingerprint:
        raise RecordError(
            f"{where}: record belongs to layout {record.layout!r}, but the trainer's layout is "
            f"{layout.fingerprint!r} ({layout.architecture}); it comes from another model"
        )
    want = tuple(layout.moe_layer_ids)
    if tuple(record.layers) != want:
        raise RecordError(f"{where}: {_layer_difference(record.layers, want)}")
    if record.topk != layout.topk:
        raise RecordError(f"{where}: record is top-{record.topk}, layout is top-{layout.topk}")
    if record.start != 0:
        raise RecordError(
            f"{where}: record starts at token {record.start}; replay needs rows from token 0 "
            f"(request routing without routing_start, or join the partial records first)"
        )
    if num_tokens < 1:
        raise RecordError(f"{where}: has {num_tokens} tokens")
    if record.num_tokens != num_tokens - 1:
        raise RecordError(
            f"{where}: record has {record.num_tokens} rows, but the sample has {num_tokens} tokens "
            f"(expected {num_tokens - 1} rows: one per token but the last)"
        )
    if not np.issubdtype(record.experts.dtype, np.integer):
        raise RecordError(f"{where}: expert ids have dtype {record.experts.dtype}, expected an integer dtype")
    if record.num_tokens == 0:
        return
    for col, info in enumerate(layout.moe_layers):
        ids = record.experts[:, col, :]
        hi, lo = int(ids.max()), int(ids.min())
        if hi >= info.num_experts or lo < 0:
            bad = hi if hi >= info.num_experts else lo
            row = int(np.argwhere(ids == bad)[0][0])
            raise RecordError(
                f"{where}: expert id {bad} at row {row}, layer {info.id} is outside 0..{info.num_experts - 1}"
            )


def check_records(records: Sequence[RoutingRecord], tokens: Sequence[Any], layout: ModelLayout) -> List[int]:
    """Check every record before any is used; return each sample's token count."""
    if len(records) != len(tokens):
        raise RecordError(f"{len(records)} records for {len(tokens)} samples")
    counts = [token_count(t) for t in tokens]
    for i, (r, n) in enumerate(zip(records, counts)):
        check_record(r, layout, n, i)
    return counts
