"""Join one sample's records served over several requests (multi-turn, partial rollouts) into the record
it would have had in one request. Turn ``i+1`` asks for rows from ``routing_start = len(tokens_i) - 1``; a
part must start exactly there (no gap, no overlap), extend the previous part's ids, and match its own digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from sglang_r3.core.record import RecordError, RoutingRecord, token_array, token_digest

# The server names a request that spanned a weight update "mixed:v1,v2" (adapter/outputs.py);
# the joined record uses the same spelling so a trainer that declares a version refuses it alike.
MIXED_PREFIX = "mixed:"


@dataclass(frozen=True)
class RecordPart:
    """One request's record and that request's full token ids (prompt + completion)."""

    record: RoutingRecord
    tokens: Any  # list of ints, numpy array or torch tensor


@dataclass(frozen=True)
class Segment:
    """Where one part's rows sit in the joined record, and which weights routed them."""

    part: int
    row_start: int  # first row (== token position) of the part in the joined record
    row_stop: int  # one past its last row
    weight_version: Optional[str]


@dataclass(frozen=True)
class JoinedRecord:
    record: RoutingRecord  # start 0, rows for every token of `tokens` but the last
    tokens: np.ndarray  # int64, the final sequence (the last part's tokens)
    segments: Tuple[Segment, ...]

    @property
    def weight_versions(self) -> Tuple[Optional[str], ...]:
        """Each segment's weight version, in part order."""
        return tuple(s.weight_version for s in self.segments)


def join_records(parts: Sequence[Any], *, allow_mixed_versions: bool = False) -> JoinedRecord:
    """Join the records of one sample's requests, in order; raise RecordError naming the part and what differs.

    parts: ``RecordPart``s, ``(record, tokens)`` pairs, or client ``GenerateResult``s (anything with
    ``.record`` and ``.tokens``). allow_mixed_versions: accept parts routed under different weight
    versions; the joined record's weight_version is then ``"mixed:v1,v2"`` and the per-segment
    versions are on ``JoinedRecord.segments``.
    """
    items = [_as_part(p, i) for i, p in enumerate(parts)]
    if not items:
        raise RecordError("join_records needs at least one part")
    ids = [_check_own(p, i) for i, p in enumerate(items)]
    first = items[0].record
    if first.start != 0:
        raise RecordError(
            f"part 0 starts at token {first.start}; the first part of a sample must start at 0 "
            f"(send the first turn without routing_start)"
        )
    for i in range(1, len(items)):
        _check_same_kind(first, items[i].record, i)
        _check_continues(ids[i - 1], items[i].record, ids[i], i)
    segments = tuple(
        Segment(i, p.record.start, p.record.start + p.record.num_tokens, p.record.weight_version)
        for i, p in enumerate(items)
    )
    version = _joined_version(segments, allow_mixed_versions)
    experts = np.concatenate([p.record.experts for p in items], axis=0)
    record = RoutingRecord(
        layout=first.layout,
        start=0,
        layers=tuple(first.layers),
        experts=experts,
        mtp=None,
        weight_version=version,
        tokens_digest=token_digest(ids[-1]),
    )
    return JoinedRecord(record=record, tokens=ids[-1], segments=segments)


def _as_part(p: Any, i: int) -> RecordPart:
    if isinstance(p, RecordPart):
        return p
    if isinstance(p, tuple) and len(p) == 2:
        return RecordPart(*p)
    if hasattr(p, "record") and hasattr(p, "tokens"):
        return RecordPart(p.record, p.tokens)
    raise RecordError(f"part {i}: expected a RecordPart, a (record, tokens) pair or a GenerateResult, got {type(p).__name__}")


def _check_own(p: RecordPart, i: int) -> np.ndarray:
    """A part on its own: a record of its tokens, with exactly the rows its start says."""
    r = p.record
    if not isinstance(r, RoutingRecord):
        raise RecordError(f"part {i}: expected a RoutingRecord, got {type(r).__name__}")
    if r.mtp is not None:
        # MTP entries are tagged with server-wide speculation rounds and per-request draft state that
        # a concatenation cannot re-number faithfully; the trainer never replays them anyway.
        raise RecordError(
            f"part {i}: record carries an mtp section; joining keeps main rows only "
            f"(request without return_routing.mtp, or pass dataclasses.replace(record, mtp=None))"
        )
    try:
        ids = token_array(p.tokens)
    except RecordError as e:
        raise RecordError(f"part {i}: {e}") from None
    if r.tokens_digest is None:
        raise RecordError(f"part {i}: record carries no tokens_digest; nothing proves it belongs to these tokens")
    if r.tokens_digest != token_digest(ids):
        raise RecordError(
            f"part {i}: tokens_digest {r.tokens_digest} != {token_digest(ids)} of the part's {len(ids)} "
            f"tokens; the record was produced for another token sequence"
        )
    want = len(ids) - 1 - r.start
    if r.num_tokens != want:
        raise RecordError(
            f"part {i}: record has {r.num_tokens} rows from token {r.start}, but its {len(ids)} tokens "
            f"need {want} (one per token from {r.start} to the last but one)"
        )
    return ids


def _check_same_kind(first: RoutingRecord, r: RoutingRecord, i: int) -> None:
    if r.layout != first.layout:
        raise RecordError(f"part {i}: layout {r.layout!r} differs from part 0's {first.layout!r}")
    if tuple(r.layers) != tuple(first.layers):
        raise RecordError(f"part {i}: layers {list(r.layers)} differ from part 0's {list(first.layers)}")
    if r.topk != first.topk:
        raise RecordError(f"part {i}: top-{r.topk} differs from part 0's top-{first.topk}")
    if r.experts.dtype != first.experts.dtype:
        raise RecordError(f"part {i}: dtype {r.experts.dtype} differs from part 0's {first.experts.dtype}")


def _check_continues(prev: np.ndarray, r: RoutingRecord, ids: np.ndarray, i: int) -> None:
    n = len(prev)
    if len(ids) <= n:
        raise RecordError(
            f"part {i}: has {len(ids)} tokens, part {i - 1} has {n}; a continuation must extend the "
            f"previous part's tokens by at least one token"
        )
    differ = np.flatnonzero(ids[:n] != prev)
    if differ.size:
        at = int(differ[0])
        raise RecordError(
            f"part {i}: token {at} is {int(ids[at])}, part {i - 1} has {int(prev[at])} there; its tokens do "
            f"not start with part {i - 1}'s {n} tokens (another sample, or the history was re-tokenized)"
        )
    want = n - 1  # part i-1's rows end at its last token, which only became an input in part i
    if r.start < want:
        raise RecordError(
            f"part {i}: starts at token {r.start}, overlapping part {i - 1}'s rows (which end before "
            f"token {want}); send it with routing_start={want}"
        )
    if r.start > want:
        raise RecordError(
            f"part {i}: starts at token {r.start}, leaving tokens {want}..{r.start - 1} without rows "
            f"(part {i - 1}'s rows end before token {want}); send it with routing_start={want}"
        )


def _versions_of(v: Optional[str]) -> List[Optional[str]]:
    if v is not None and v.startswith(MIXED_PREFIX):
        return v[len(MIXED_PREFIX) :].split(",")
    return [v]


def _joined_version(segments: Sequence[Segment], allow_mixed: bool) -> Optional[str]:
    # A part that itself spanned an update ("mixed:a,b") counts as those versions, not as one.
    versions = list(dict.fromkeys(x for s in segments for x in _versions_of(s.weight_version)))
    if len(versions) == 1:
        return versions[0]
    named = ", ".join(f"part {s.part}: {s.weight_version!r}" for s in segments)
    if None in versions:
        # "mixed:" cannot spell an unknown version; a trainer could not tell it from a real one.
        raise RecordError(f"parts mix records with and without a weight_version ({named}); refusing to join")
    if not allow_mixed:
        raise RecordError(
            f"parts were routed under different weight versions ({named}); pass "
            f"allow_mixed_versions=True to join them as {MIXED_PREFIX}{','.join(versions)}"
        )
    return MIXED_PREFIX + ",".join(versions)
