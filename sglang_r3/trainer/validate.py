"""Check a routing record against the layout and its sample before anything is replayed: it must prove
its model (fingerprint, layers, top-k), its sample (row count, token digest) and, when declared, its
weights. What it cannot prove is refused: a wrong row that looks valid trains silently.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord, token_array, token_digest
from sglang_r3.trainer.join import MIXED_PREFIX


def sample_token_ids(tokens: Any, sample: int = 0) -> np.ndarray:
    """A sample's token ids as 1-D int64; a bare length is refused (it cannot identify a sample)."""
    if isinstance(tokens, (int, np.integer)) or (getattr(tokens, "ndim", None) == 0):
        raise RecordError(
            f"sample {sample}: got a bare length ({int(tokens)}); a length cannot prove which sample a "
            f"record belongs to (two samples of equal length would pass swapped), pass the token ids "
            f"(1-D tensor, numpy array or list of ints)"
        )
    try:
        return token_array(tokens)
    except RecordError as e:
        raise RecordError(f"sample {sample}: {e}") from None


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


def check_record(
    record: RoutingRecord,
    layout: ModelLayout,
    tokens: Any,
    sample: int = 0,
    weight_version: Optional[str] = None,
    allow_mixed_versions: bool = False,
) -> None:
    """Raise RecordError naming what differs; return silently when the record fits.

    tokens: the sample's token ids (prompt + completion). weight_version: the version of the
    weights the trainer holds; None skips that check (the caller does not know it).
    allow_mixed_versions: accept a record whose rows were routed under several weight versions
    (``"mixed:v1,v2"``: a request or a joined sample that spanned a weight update); with weight_version
    given too, the version the trainer holds must be one of those the record spans (slime's partial
    rollouts: begun under the previous weights, finished under the ones now trained).
    """
    where = f"sample {sample}"
    if not isinstance(record, RoutingRecord):
        raise RecordError(f"{where}: expected a RoutingRecord, got {type(record).__name__}")
    ids = sample_token_ids(tokens, sample)
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
    num_tokens = int(ids.shape[0])
    if num_tokens < 1:
        raise RecordError(f"{where}: has {num_tokens} tokens")
    if record.num_tokens != num_tokens - 1:
        raise RecordError(
            f"{where}: record has {record.num_tokens} rows, but the sample has {num_tokens} tokens "
            f"(expected {num_tokens - 1} rows: one per token but the last)"
        )
    _check_identity(record, ids, where, weight_version, allow_mixed_versions)
    if not np.issubdtype(record.experts.dtype, np.integer):
        raise RecordError(f"{where}: expert ids have dtype {record.experts.dtype}, expected an integer dtype")
    if record.num_tokens:
        _check_ids(record.experts, layout, where)


def _check_identity(
    record: RoutingRecord, ids: np.ndarray, where: str, weight_version: Optional[str], allow_mixed: bool = False
) -> None:
    if record.tokens_digest is None:
        raise RecordError(
            f"{where}: record carries no tokens_digest, so nothing proves it was produced for this "
            f"sample's tokens; refusing it (is the server older than the identity fields?)"
        )
    if record.tokens_digest != token_digest(ids):
        raise RecordError(
            f"{where}: record was produced for a different token sequence (tokens_digest "
            f"{record.tokens_digest} != {token_digest(ids)} of the sample's {len(ids)} tokens); "
            f"records and samples are mismatched (e.g. two samples swapped)"
        )
    mixed = record.weight_version is not None and record.weight_version.startswith(MIXED_PREFIX)
    if mixed:
        spanned = record.weight_version[len(MIXED_PREFIX):].split(",")
        if not allow_mixed:
            held = "" if weight_version is None else f", and the trainer holds weight version {weight_version!r}"
            raise RecordError(
                f"{where}: record was routed under several weight versions ({record.weight_version}); its rows "
                f"do not all belong to one set of weights{held} (pass allow_mixed_versions=True to accept it)"
            )
        if weight_version is not None and weight_version not in spanned:
            raise RecordError(
                f"{where}: record was routed under weight versions {spanned} ({record.weight_version}), none of "
                f"them the one the trainer holds, weight version {weight_version!r}; its routing belongs to "
                f"other weights"
            )
        return
    if weight_version is not None and record.weight_version != weight_version:
        got = "no weight_version" if record.weight_version is None else f"weight version {record.weight_version!r}"
        raise RecordError(
            f"{where}: record was routed with {got}, but the trainer holds weight version "
            f"{weight_version!r}; its routing belongs to other weights"
        )


def _check_ids(experts: np.ndarray, layout: ModelLayout, where: str) -> None:
    """Range per layer and distinct ids per (token, layer), over the whole array at once.

    Runs on every fill (32k tokens x 89 layers x top-8 for GLM-4.5): no loop over rows or layers;
    the per-layer bounds are only broadcast when the global max says something is out of range.
    """
    limits = np.array([l.num_experts for l in layout.moe_layers], dtype=np.int64)
    flat = experts.reshape(-1)
    hi = int(flat.max())
    lo = int(flat.min()) if experts.dtype.kind == "i" else 0  # unsigned ids cannot go below 0
    if hi >= int(limits.min()) or lo < 0:
        bad = (experts < 0) | (experts >= limits[None, :, None])
        if bad.any():
            row, col, slot = (int(x) for x in np.argwhere(bad)[0])
            info = layout.moe_layers[col]
            raise RecordError(
                f"{where}: expert id {int(experts[row, col, slot])} at row {row}, layer {info.id} "
                f"is outside 0..{info.num_experts - 1}"
            )
    _check_distinct(experts, layout, where)


def check_expert_ids(experts: np.ndarray, layout: ModelLayout, where: str) -> None:
    """[rows, layout MoE layers, topk] expert ids that came without a record (e.g. upstream SGLang's
    int32 array): integers, inside each layer's experts, distinct per row; raises RecordError naming
    the first one that is not."""
    if not np.issubdtype(experts.dtype, np.integer):
        raise RecordError(f"{where}: expert ids have dtype {experts.dtype}, expected an integer dtype")
    if experts.shape[0]:
        _check_ids(experts, layout, where)


# (token, layer) groups per block of the distinct-ids check: k columns of 128K ids stay in L2.
_DISTINCT_BLOCK = 1 << 17


def _check_distinct(experts: np.ndarray, layout: ModelLayout, where: str) -> None:
    """No expert id twice in one (token, layer).

    Per block of (token, layer) groups, the k slots are transposed into k contiguous columns and
    every pair of columns is compared: k(k-1)/2 byte-wise passes over cache-resident data. np.sort
    along the last axis pays per-row overhead on an axis of length 8, and the same pairwise passes
    over whole-array columns are memory-bound.
    """
    rows, layers, k = experts.shape
    if k < 2:
        return
    groups = np.ascontiguousarray(experts).reshape(-1, k)
    block = min(_DISTINCT_BLOCK, groups.shape[0])
    cols = np.empty((k, block), dtype=groups.dtype)
    same = np.empty(block, dtype=bool)
    for at in range(0, groups.shape[0], block):
        part = groups[at : at + block]
        n = part.shape[0]
        np.copyto(cols[:, :n], part.T)
        for i in range(k - 1):
            for j in range(i + 1, k):
                hit = np.equal(cols[i, :n], cols[j, :n], out=same[:n])
                if hit.any():
                    g = at + int(np.argmax(hit))
                    row, col = divmod(g, layers)
                    raise RecordError(
                        f"{where}: row {row}, layer {layout.moe_layers[col].id} names expert "
                        f"{int(groups[g, i])} twice in its top-{k}; a router picks distinct experts"
                    )


def check_records(
    records: Sequence[RoutingRecord],
    tokens: Sequence[Any],
    layout: ModelLayout,
    weight_version: Optional[str] = None,
    allow_mixed_versions: bool = False,
) -> List[int]:
    """Check every record before any is used; return each sample's token count.

    tokens[i]: sample i's token ids (1-D tensor, numpy array or list of ints), prompt + completion.
    """
    if len(records) != len(tokens):
        raise RecordError(f"{len(records)} records for {len(tokens)} samples")
    counts = []
    for i, (r, t) in enumerate(zip(records, tokens)):
        ids = sample_token_ids(t, i)
        check_record(r, layout, ids, i, weight_version, allow_mixed_versions)
        counts.append(int(ids.shape[0]))
    return counts
