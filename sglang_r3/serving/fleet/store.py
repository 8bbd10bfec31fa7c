"""One engine's record store: a named Ray actor, because a Ray object lives only as long as the process
that put it and records must outlive the engine's HTTP process. Trainer ranks ``take`` from it directly.
Bounded by count, bytes and TTL; when full it refuses a new record (``store_full``) rather than evict
one already handed out. A restart is a new incarnation: the old one's records are dropped and its
handles fail (``engine_restarted``); a store answers only handles that name it, its engine and incarnation.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import msgpack

from sglang_r3.core.codes import STORE_ERROR_CODES
from sglang_r3.core.record import RoutingRecord

TOMBSTONES = 65536  # how many released request ids a store remembers (for clear late-handle errors)


@dataclass(frozen=True)
class StoreBounds:
    max_records: int = 4096
    max_bytes: int = 256 << 20
    ttl_s: float = 600.0


@dataclass
class StoreStats:
    engine: str
    incarnation: int
    records: int = 0
    bytes: int = 0
    stored: int = 0
    fetched: int = 0
    expired: int = 0
    refused_full: int = 0
    refused_stale: int = 0
    dropped_restart: int = 0
    peak_records: int = 0
    peak_bytes: int = 0


@dataclass
class _Entry:
    incarnation: int
    record: RoutingRecord
    nbytes: int
    stored_at: float


def record_nbytes(record: RoutingRecord) -> int:
    n = record.experts.nbytes
    if record.mtp is not None:
        m = record.mtp
        n += sum(a.nbytes for a in (m.positions, m.depth, m.step, m.accepted, m.experts) if a is not None)
        n += sum(a.nbytes for a in (m.tokens, m.rounds) if a is not None)
    return n


def encode_record(record: RoutingRecord) -> bytes:
    """What the engine sends its store: the binary wire form (raw arrays, no base64)."""
    return msgpack.packb(record.to_wire(binary=True), use_bin_type=True)


class RecordStore:
    """Run as a Ray actor (``ray.remote(RecordStore)``); plain class so its logic is testable alone."""

    def __init__(self, store_name: str, engine: str, bounds: StoreBounds = StoreBounds()):
        self.name, self.engine, self.bounds = store_name, engine, bounds
        self._records: "OrderedDict[str, _Entry]" = OrderedDict()  # insertion order == storage time order
        self._gone: "OrderedDict[str, str]" = OrderedDict()  # rid -> why it left
        self._dead: Dict[int, str] = {}  # incarnation -> how it ended
        self.stats = StoreStats(engine=engine, incarnation=0)

    # -- engine side ------------------------------------------------------------------------

    def new_incarnation(self, reason: str = "restarted") -> int:
        """A new engine process is about to start: end the current incarnation and number the next."""
        old = self.stats.incarnation
        if old:
            self.end_incarnation(old, reason)
        self.stats.incarnation = old + 1
        return self.stats.incarnation

    def end_incarnation(self, incarnation: int, reason: str) -> None:
        """The engine process of ``incarnation`` is gone: its records go, its handles fail from now on."""
        self._dead.setdefault(incarnation, reason)
        for rid in [r for r, e in self._records.items() if e.incarnation == incarnation]:
            self._drop(rid, f"engine {self.engine} incarnation {incarnation} ended ({reason})")
            self.stats.dropped_restart += 1

    def put(self, incarnation: int, rid: str, wire: bytes) -> Dict[str, Any]:
        """Store one finished record. Returns {"ok": True} or {"ok": False, "code", "message"}."""
        self._expire()
        if incarnation != self.stats.incarnation or incarnation in self._dead:
            self.stats.refused_stale += 1
            return _refusal("engine_restarted", f"engine {self.engine} incarnation {incarnation} is not live "
                            f"(live: {self.stats.incarnation}); the record was not stored")
        record = RoutingRecord.from_wire(msgpack.unpackb(wire, raw=False))
        nbytes = record_nbytes(record)
        b = self.bounds
        if len(self._records) >= b.max_records or self.stats.bytes + nbytes > b.max_bytes:
            self.stats.refused_full += 1
            return _refusal("store_full", f"record store of engine {self.engine} is full ({len(self._records)} "
                            f"records, {self.stats.bytes} bytes; bounds {b.max_records} records, {b.max_bytes} "
                            f"bytes): fetch records to free it; this request's record was not stored")
        if rid in self._records or rid in self._gone:
            return _refusal("duplicate", f"request id {rid} was already stored by engine {self.engine}")
        self._records[rid] = _Entry(incarnation, record, nbytes, time.monotonic())
        s = self.stats
        s.stored += 1
        s.records, s.bytes = len(self._records), s.bytes + nbytes
        s.peak_records, s.peak_bytes = max(s.peak_records, s.records), max(s.peak_bytes, s.bytes)
        return {"ok": True}

    # -- trainer side -----------------------------------------------------------------------

    def take(self, handles: List[Dict[str, Any]], release: bool = True) -> Dict[str, Any]:
        """Records for handles (wire dicts), in order: {"records": [...]} or {"errors": [(i, code, msg)]}.

        All or nothing: if any handle fails, nothing is released and every failure is listed.
        """
        self._expire()
        errors: List[Tuple[int, str, str]] = []
        out: List[RoutingRecord] = []
        for i, h in enumerate(handles):
            code, msg, rec = self._check(h)
            if code:
                errors.append((i, code, msg))
            else:
                out.append(rec)
        if errors:
            return {"errors": errors}
        if release:
            for h in handles:
                if h["rid"] in self._records:
                    self._drop(h["rid"], "already fetched")
                    self.stats.fetched += 1
        return {"records": out}

    def get_stats(self) -> Dict[str, Any]:
        self._expire()
        return {**asdict(self.stats), "bounds": asdict(self.bounds)}

    def ping(self) -> str:
        return self.name

    # -- internals --------------------------------------------------------------------------

    def _check(self, h: Dict[str, Any]) -> Tuple[Optional[str], str, Optional[RoutingRecord]]:
        what = f"request {h.get('rid')} of engine {h.get('engine')} (incarnation {h.get('incarnation')})"
        if h.get("store") != self.name or h.get("engine") != self.engine:
            return "wrong_store", f"{what} is not in store {self.name} of engine {self.engine}", None
        inc, rid = h.get("incarnation"), h.get("rid")
        if inc in self._dead:
            return "engine_restarted", (f"{what}: that engine incarnation died ({self._dead[inc]}); its records "
                                        f"were dropped (live incarnation: {self.stats.incarnation})"), None
        entry = self._records.get(rid)
        if entry is None:
            why = self._gone.get(rid)
            if why is not None:
                return "released", f"{what} is no longer held: {why}", None
            return "unknown", f"{what} was never stored here (or left longer ago than the store remembers)", None
        rec = entry.record
        if entry.incarnation != inc:
            return "mismatch", f"{what}: the record was stored by incarnation {entry.incarnation}", None
        want = (h.get("start"), h.get("num_tokens"), h.get("weight_version"), h.get("tokens_digest"))
        have = (rec.start, rec.num_tokens, rec.weight_version, rec.tokens_digest)
        if tuple(want) != have:
            return "mismatch", f"{what}: handle says (start, rows, weight_version, digest) = {want}, record {have}", None
        return None, "", rec

    def _drop(self, rid: str, why: str) -> None:
        entry = self._records.pop(rid)
        self.stats.records, self.stats.bytes = len(self._records), self.stats.bytes - entry.nbytes
        self._gone[rid] = why
        while len(self._gone) > TOMBSTONES:
            self._gone.popitem(last=False)

    def _expire(self) -> None:
        if not self._records:
            return
        cutoff = time.monotonic() - self.bounds.ttl_s
        while self._records:
            rid, entry = next(iter(self._records.items()))
            if entry.stored_at > cutoff:
                break
            self._drop(rid, f"expired unfetched after the store's TTL of {self.bounds.ttl_s:g} s")
            self.stats.expired += 1


def _refusal(code: str, message: str) -> Dict[str, Any]:
    if code not in STORE_ERROR_CODES:  # the HTTP layer forwards only documented codes
        raise ValueError(f"{code!r} is not one of {STORE_ERROR_CODES}")
    return {"ok": False, "code": code, "message": message}
