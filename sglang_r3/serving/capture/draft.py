"""MTP-draft routing, kept apart from main rows: drafts route tokens the target has not verified, so they are
never replayed as main routing. Per request, one packed array of entries (position, depth, step, round,
accepted), grown geometrically: a Python object per decode step would cost more than the entry.
``chain=True`` is multi-layer MTP, where row ``i`` of depth ``d`` routes the token at ``p + d`` (step
``max(0, i + d - valid)``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set

import numpy as np
import torch

from sglang_r3.core.record import MtpRouting

# Key in a request's sampling_params.custom_params that asks for the MTP section (set by our /generate when
# ``return_routing: {"mtp": true}``; read by the scheduler where the request gets its row).
MTP_WANTED_KEY = "sglang_r3_mtp"

# First capacity of a request's entries; a prefill's draft-extend files its whole prompt at once and
# gets exactly that, decode steps then grow the block by half each time.
_FIRST_CAPACITY = 16
_GROWTH = 1.5


def _entry_dtype(topk: int, ids: np.dtype) -> np.dtype:
    # One packed record per entry in one array per request: 23 B for top-8 uint8 ids, and a single
    # numpy header per request instead of one per column.
    return np.dtype([("positions", "<i4"), ("tokens", "<i4"), ("round", "<i4"), ("depth", "u1"),
                     ("step", "u1"), ("accepted", "?"), ("experts", ids, (topk,))])


class _Entries:
    """One request's draft entries (rows [0, n) of ``rows`` are live)."""

    __slots__ = ("n", "rows")

    def __init__(self, dtype: np.dtype, capacity: int):
        self.n = 0
        self.rows = np.empty(capacity, dtype)

    def reserve(self, extra: int) -> None:
        need = self.n + extra
        cap = self.rows.shape[0]
        if need > cap:
            grown = np.empty(max(need, int(cap * _GROWTH) + 1), self.rows.dtype)
            grown[: self.n] = self.rows[: self.n]
            self.rows = grown

    def nbytes(self) -> int:
        """Bytes held, objects included (allocated capacity, not only live rows)."""
        return sys.getsizeof(self) + sys.getsizeof(self.rows)


@dataclass
class DraftStats:
    forwards: int = 0
    entries: int = 0
    resolved_rounds: int = 0
    # Draft forwards that filed nothing because one of their routers did not route the batch SGLang published
    # for the forward (DP attention: not the gathered length, adapter/dp_rows.py); counted once per forward.
    forwards_refused: int = 0

    def as_dict(self):
        return dict(self.__dict__)


class DraftCapturer:
    """Stages draft-router top-k per depth during a draft forward, then files them per request.

    ``per_request``: file entries only for requests marked with ``set_wanted`` (the scheduler marks a
    request that asked for the MTP section when it gets its ``req_pool_idx``); otherwise for every
    request in the batch.
    """

    def __init__(
        self,
        depth_of_config: Dict[int, int],
        topk: int,
        dtype: torch.dtype,
        max_tokens: int = 4096,
        device: str | torch.device = "cpu",
        per_request: bool = False,
        num_depths: Optional[int] = None,
        chain: bool = False,
    ):
        self.depth_of_config = depth_of_config  # id(topk_config) -> MTP depth
        # chain: multi-layer MTP, one draft-extend forward per depth (steps per row, see the module doc).
        self.chain = chain
        self.topk = topk
        self.dtype = dtype
        self._np_dtype = np.dtype(np.uint8 if dtype == torch.uint8 else np.uint16)
        self._entry_dtype = _entry_dtype(topk, self._np_dtype)
        n_depth = num_depths if num_depths is not None else max(depth_of_config.values(), default=0)
        # Allocated once: a CUDA graph of a draft forward writes into this storage on every replay.
        self.staging = torch.zeros((max(n_depth, 1), max_tokens, topk), dtype=dtype, device=device)
        self._staged: Dict[int, int] = {}  # depth -> tokens staged in the current draft forward
        self._graph_depths: Dict[int, int] = {}  # depths a recorded draft graph writes (replays skip capture())
        self._by_req: Dict[int, _Entries] = {}
        # (req_pool_idx, entries, lo, hi, step) awaiting this round's verify. The entries object is held,
        # not looked up again: a request forgotten and its row reused must not receive the old flags.
        self._pending: List[tuple] = []
        self.per_request = per_request
        self._wanted: Set[int] = set()
        self._owner: Dict[int, Any] = {}  # row -> the request holding it (start_row)
        self.round = 0
        self._refused = False  # the running draft forward is refused (refuse_forward): it files nothing
        # PD decode engine: rows whose prompt entries the prefill engine did not send -> why (collect refuses them).
        self._not_carried: Dict[int, str] = {}
        self._stats = DraftStats()

    # -- which requests -----------------------------------------------------------
    def start_row(self, req_pool_idx: int, owner: Any, wanted: bool) -> None:
        """A request (``owner``: its rid) holds this row now. A row that changed hands without being freed
        through the pool (0.5.15's streaming sessions put rows back on the free list directly) drops the
        previous request's entries here, so they never reach the next one."""
        row = int(req_pool_idx)
        if self._owner.get(row, owner) != owner:
            self.forget([row])
        self._owner[row] = owner
        self.set_wanted(row, wanted)

    def set_wanted(self, req_pool_idx: int, wanted: bool) -> None:
        if wanted:
            self._wanted.add(int(req_pool_idx))
        else:
            self._wanted.discard(int(req_pool_idx))

    def wants(self, req_pool_idx: int) -> bool:
        return not self.per_request or int(req_pool_idx) in self._wanted

    def add_routers(self, depth_of_config: Dict[int, int]) -> None:
        """Routers of one more draft model (multi-layer MTP: one draft runner per depth)."""
        if depth_of_config and max(depth_of_config.values()) > self.staging.shape[0]:
            raise RuntimeError(
                f"MTP depth {max(depth_of_config.values())} beyond the {self.staging.shape[0]} depths staged"
            )
        self.depth_of_config.update(depth_of_config)

    # -- during a draft forward ----------------------------------------------
    def capture(self, topk_config, topk_ids: torch.Tensor) -> None:
        depth = self.depth_of_config.get(id(topk_config))
        if depth is None or self._refused:
            return  # a router we were not told about (not an MTP router), or a refused forward: never filed
        if self.per_request and not self._wanted and not self._recording_graph():
            return  # no live request asked for the MTP section; a graph being recorded still records the copy
        n = topk_ids.shape[0]
        if n > self.staging.shape[1]:
            raise RuntimeError(
                f"a draft forward routed {n} tokens but the MTP capture staging holds {self.staging.shape[1]}"
            )
        # A device copy, no host sync: routers may run inside CUDA graph capture.
        self.staging[depth - 1, :n] = topk_ids[:, : self.topk]
        self._staged[depth] = n
        self._graph_depths[depth] = n

    def _recording_graph(self) -> bool:
        return self.staging.is_cuda and torch.cuda.is_current_stream_capturing()

    def has_pending(self) -> bool:
        return bool(self._pending)

    def has_staged(self, graph_replay: bool = False) -> bool:
        return bool(self._staged or (graph_replay and self._graph_depths))

    def refuse_forward(self) -> None:
        """A router of the running draft forward routed another batch than the one published for it: what it
        staged is dropped, its later routers stage nothing, and the forward files nothing (counted once, when
        it ends)."""
        self._staged.clear()
        self._refused = True

    def drop_staged(self) -> None:
        """The running draft forward ends without filing."""
        self._staged.clear()
        self._end_refused()

    def _end_refused(self) -> bool:
        if not self._refused:
            return False
        self._refused = False
        self._stats.forwards_refused += 1
        return True

    def file_forward(
        self,
        req_pool_indices: Sequence[int],
        rows_per_req: Sequence[int],
        valid_per_req: Sequence[int],
        positions: torch.Tensor,
        tokens: torch.Tensor,
        step: int,
        graph_replay: bool = False,
    ) -> None:
        """Attach the staged routing of one draft forward to its requests (one device->host copy)."""
        if self._end_refused():
            self._staged = {}
            return
        depths = dict(self._graph_depths) if graph_replay and not self._staged else self._staged
        self._staged = {}
        if not depths:
            return
        if self.per_request and not any(int(p) in self._wanted for p in req_pool_indices):
            return  # no request in this batch asked for the MTP section: no copy at all
        self._stats.forwards += 1
        n = int(positions.shape[0])
        hi = max(depths)
        # Positions, tokens and every depth's ids leave the device together.
        packed = torch.cat(
            [positions[:n].long().view(1, -1), tokens[:n].long().view(1, -1),
             self.staging[:hi, :n].long().reshape(1, -1)], dim=1
        ).to("cpu").numpy().reshape(-1)
        pos = packed[:n].astype(np.int32)
        tok = packed[n : 2 * n].astype(np.int32)
        ids_all = packed[2 * n :].reshape(hi, n, self.topk).astype(self._np_dtype)
        # The whole forward's entries are built once, vectorised, then each request takes its slice with
        # one copy (the per-request loop runs for every request of every draft forward).
        block = np.empty(n, self._entry_dtype)
        block["positions"] = pos
        block["tokens"] = tok
        block["round"] = self.round
        block["step"] = step
        block["accepted"] = step == 0
        if self.chain and len(depths) != 1:
            raise RuntimeError(f"a multi-layer MTP draft forward routed depths {sorted(depths)}, expected one")
        for depth in sorted(depths):
            block["depth"] = depth
            block["experts"] = ids_all[depth - 1]
            offset = 0
            for pool_idx, rows, valid in zip(req_pool_indices, rows_per_req, valid_per_req):
                at = offset
                offset += rows
                if valid <= 0:
                    continue
                p = int(pool_idx)
                if self.per_request and p not in self._wanted:
                    continue
                e = self._by_req.get(p)
                if e is None:
                    e = self._by_req[p] = _Entries(self._entry_dtype, max(_FIRST_CAPACITY, valid))
                e.reserve(valid)
                lo, end = e.n, e.n + valid
                e.rows[lo:end] = block[at : at + valid]
                e.n = end
                self._stats.entries += valid
                if self.chain:
                    # Row i of depth d routes the token at positions[i] + d: verified for the first
                    # valid - d + 1 rows, the (i + d - valid)-th draft of the next round after them.
                    steps = np.maximum(0, np.arange(valid) + depth - valid)
                    e.rows["step"][lo:end] = steps
                    e.rows["accepted"][lo:end] = steps == 0
                    for j in np.flatnonzero(steps):
                        self._pending.append((p, e, lo + int(j), lo + int(j) + 1, int(steps[j])))
                elif step > 0:
                    self._pending.append((p, e, lo, end, step))

    # -- after a verify --------------------------------------------------------
    def take_pending(self) -> List[tuple]:
        """The drafts filed so far and not resolved yet (multi-layer MTP: the next verify resolves them,
        while the draft-extend after it files the round after)."""
        pending, self._pending = self._pending, []
        return pending

    def drop_pending(self, req_pool_indices: Sequence[int]) -> None:
        """Unresolved drafts of these requests were never verified (a chunked prefill goes on): they stay
        not accepted."""
        gone = {int(p) for p in req_pool_indices}
        if self._pending and gone:
            self._pending = [t for t in self._pending if t[0] not in gone]

    def resolve_round(
        self, req_pool_indices: Sequence[int], accepted_drafts: Sequence[int], pending: Optional[List[tuple]] = None
    ) -> None:
        """accepted_drafts[b]: how many drafted tokens request b's verify accepted (bonus token excluded).
        ``pending``: the entries this verify resolves (default: every pending entry)."""
        n_ok = {int(p): int(a) for p, a in zip(req_pool_indices, accepted_drafts)}
        for pool_idx, e, lo, end, step in (self._pending if pending is None else pending):
            if pool_idx in n_ok:
                e.rows["accepted"][lo:end] = step <= n_ok[pool_idx]
        if pending is None:
            self._pending = []
        self.round += 1
        self._stats.resolved_rounds += 1

    # -- request lifecycle -------------------------------------------------------
    def forget(self, req_pool_indices: Sequence[int]) -> None:
        gone = {int(p) for p in req_pool_indices}
        for p in gone:
            self._by_req.pop(p, None)
            self._wanted.discard(p)
            self._owner.pop(p, None)
            self._not_carried.pop(p, None)
        if self._pending:
            self._pending = [t for t in self._pending if t[0] not in gone]

    # -- PD disaggregation: a prompt's entries travel from the prefill engine (adapter/pd_rows.py) ---------------
    def prompt_entries(self, req_pool_idx: int) -> Optional[np.ndarray]:
        """On a prefill engine: the entries its draft-extend filed for this request's prompt, to travel with the
        KV (positions, depth, tokens, experts), or None when they cannot: the request did not ask for the MTP
        section, or multi-layer MTP, whose prefill entries wait for a verify the decode engine runs."""
        row = int(req_pool_idx)
        if not self.wants(row) or self.chain:
            return None
        e = self._by_req.get(row)
        r = e.rows[: e.n] if e is not None else np.empty(0, self._entry_dtype)
        if (r["step"] != 0).any():
            return None  # a draft of a round was filed here: not a prompt's draft-extend alone
        return r

    def file_carried(self, req_pool_idx: int, positions: np.ndarray, depths: np.ndarray, tokens: np.ndarray,
                     experts: np.ndarray) -> None:
        """On a decode engine: the prompt's draft-extend entries the prefill engine filed, arrived with the KV,
        before any entry of this engine (step 0, the decode engine's current round)."""
        row = int(req_pool_idx)
        n = int(positions.shape[0])
        e = self._by_req.get(row)
        if e is None:
            e = self._by_req[row] = _Entries(self._entry_dtype, max(_FIRST_CAPACITY, n))
        if e.n:
            # Not seen: entries of this engine before the prompt's (a transfer after decode rounds). The section
            # could not be put in order: refused at collect, never out of order (and the scheduler keeps serving).
            self.mark_not_carried(row, f"the prompt's draft entries arrived after {e.n} entries of the decode engine")
            return
        e.reserve(n)
        block = e.rows[:n]
        block["positions"], block["depth"], block["tokens"], block["experts"] = positions, depths, tokens, experts
        block["round"], block["step"], block["accepted"] = self.round, 0, True
        e.n = n
        self._stats.entries += n

    def mark_not_carried(self, req_pool_idx: int, why: str) -> None:
        self._not_carried[int(req_pool_idx)] = why

    def not_carried(self, req_pool_idx: int) -> Optional[str]:
        """Why this request's MTP section would be short (its prompt's entries did not arrive), or None."""
        return self._not_carried.get(int(req_pool_idx))

    def detach(self, req_pool_idx: int) -> Optional[tuple]:
        """A request leaves its row with no forward to come there (a PD decode engine's retraction): its entries
        and state, for ``attach`` to its next row. Drafts not yet resolved are not kept (a retraction comes
        between rounds)."""
        row = int(req_pool_idx)
        kept = (self._by_req.pop(row, None), self._not_carried.pop(row, None))
        return kept if kept != (None, None) else None

    def attach(self, req_pool_idx: int, kept: Optional[tuple]) -> None:
        if kept is None:
            return
        row = int(req_pool_idx)
        entries, why = kept
        if entries is not None:
            if self._by_req.get(row) is not None and self._by_req[row].n:
                # Not seen: entries filed in the new row before the kept ones came back; refused at collect.
                why = why or "a resumed request's draft entries came back after entries of its new row"
            self._by_req[row] = entries
        if why is not None:
            self._not_carried[row] = why

    def collect(self, req_pool_idx: int, seqlen: int, tokens: Optional[Sequence[int]] = None) -> Optional[MtpRouting]:
        """Pop a finished request's entries. ``seqlen``: tokens of the returned sequence; ``tokens``: the
        sequence itself (prompt + completion), when known.

        A verify can accept tokens past a stop (max_new_tokens, a stop string) that
        the response then trims; their entries are kept but marked not accepted. An entry at position
        p and depth d routed the token at p + d; with ``tokens`` given, one whose token is not the
        sequence's token there is never marked accepted.
        """
        self._not_carried.pop(int(req_pool_idx), None)
        e = self._by_req.pop(int(req_pool_idx), None)
        if e is None or not e.n:
            return None
        r = e.rows[: e.n]
        positions = r["positions"].copy()
        depth = r["depth"].copy()
        target = positions.astype(np.int64) + depth
        accepted = r["accepted"] & (target < seqlen)
        if tokens is not None:
            seq = np.asarray(tokens, dtype=np.int64)
            inside = np.flatnonzero(accepted)
            accepted[inside] = seq[target[inside]] == r["tokens"][inside]
        return MtpRouting(
            positions=positions,
            depth=depth,
            step=r["step"].copy(),
            accepted=accepted,
            experts=np.ascontiguousarray(r["experts"]),
            tokens=r["tokens"].copy(),
            rounds=r["round"].copy(),
        )

    def held_bytes(self) -> Dict[str, int]:
        """Entries and bytes held for live requests (column capacity and objects included)."""
        return {
            "entries": sum(e.n for e in self._by_req.values()),
            "bytes": sum(e.nbytes() for e in self._by_req.values()) + sys.getsizeof(self._by_req),
        }

    def stats(self):
        return {**self._stats.as_dict(), "requests_held": len(self._by_req)}
