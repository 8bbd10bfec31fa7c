"""MTP-draft routing, kept apart from main rows.

Draft forwards route tokens the target has not verified yet, so their routing
can never be replayed as main routing. It is kept per request (keyed by the
request's ``req_pool_idx``) as a list of entries, each one routed token of
one draft forward:

* ``step 0``: a draft-extend forward over verified tokens (after prefill or
  after a verify) -- the routed token is part of the sequence;
* ``step i >= 1``: the i-th draft-decode forward of a speculation round, whose
  input is the i-th drafted token. Its ``accepted`` flag is resolved when the
  round's verify reports how many drafts were accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from sglang_r3.record import MtpRouting


@dataclass
class _Chunk:
    positions: np.ndarray
    tokens: np.ndarray
    depth: int
    step: int
    round: int
    experts: np.ndarray
    accepted: np.ndarray


@dataclass
class DraftStats:
    forwards: int = 0
    entries: int = 0
    resolved_rounds: int = 0

    def as_dict(self):
        return dict(self.__dict__)


class DraftCapturer:
    """Stages draft-router top-k per depth during a draft forward, then files them per request."""

    def __init__(
        self,
        depth_of_config: Dict[int, int],
        topk: int,
        dtype: torch.dtype,
        max_tokens: int = 4096,
        device: str | torch.device = "cpu",
    ):
        self.depth_of_config = depth_of_config  # id(topk_config) -> MTP depth
        self.topk = topk
        self.dtype = dtype
        n_depth = max(depth_of_config.values(), default=0)
        # Allocated once: a CUDA graph of a draft forward writes into this storage on every replay.
        self.staging = torch.zeros((max(n_depth, 1), max_tokens, topk), dtype=dtype, device=device)
        self._staged: Dict[int, int] = {}  # depth -> tokens staged in the current draft forward
        self._graph_depths: Dict[int, int] = {}  # depths a recorded draft graph writes (replays skip capture())
        self._by_req: Dict[int, List[_Chunk]] = {}
        self._pending: List[tuple] = []  # (req_pool_idx, chunk) awaiting this round's verify
        self.round = 0
        self._stats = DraftStats()

    # -- during a draft forward ----------------------------------------------
    def capture(self, topk_config, topk_ids: torch.Tensor) -> None:
        depth = self.depth_of_config.get(id(topk_config))
        if depth is None:
            return  # a router we were not told about (not an MTP router): never filed
        n = topk_ids.shape[0]
        if n > self.staging.shape[1]:
            raise RuntimeError(
                f"a draft forward routed {n} tokens but the MTP capture staging holds {self.staging.shape[1]}"
            )
        # A device copy, no host sync: routers may run inside CUDA graph capture.
        self.staging[depth - 1, :n] = topk_ids[:, : self.topk]
        self._staged[depth] = n
        self._graph_depths[depth] = n

    def has_pending(self) -> bool:
        return bool(self._pending)

    def has_staged(self, graph_replay: bool = False) -> bool:
        return bool(self._staged or (graph_replay and self._graph_depths))

    def drop_staged(self) -> None:
        self._staged.clear()

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
        depths = dict(self._graph_depths) if graph_replay and not self._staged else self._staged
        self._staged = {}
        if not depths:
            return
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
        ids_all = packed[2 * n :].reshape(hi, n, self.topk)
        np_dtype = np.uint8 if self.dtype == torch.uint8 else np.uint16
        for depth in sorted(depths):
            ids_np = ids_all[depth - 1].astype(np_dtype)
            offset = 0
            for pool_idx, rows, valid in zip(req_pool_indices, rows_per_req, valid_per_req):
                sl = slice(offset, offset + valid)
                offset += rows
                if valid <= 0:
                    continue
                chunk = _Chunk(
                    positions=pos[sl].copy(),
                    tokens=tok[sl].copy(),
                    depth=depth,
                    step=step,
                    round=self.round,
                    experts=ids_np[sl].copy(),
                    accepted=np.full(valid, step == 0),
                )
                self._by_req.setdefault(int(pool_idx), []).append(chunk)
                self._stats.entries += valid
                if step > 0:
                    self._pending.append((int(pool_idx), chunk))

    # -- after a verify --------------------------------------------------------
    def resolve_round(self, req_pool_indices: Sequence[int], accepted_drafts: Sequence[int]) -> None:
        """accepted_drafts[b]: how many drafted tokens request b's verify accepted (bonus token excluded)."""
        n_ok = {int(p): int(a) for p, a in zip(req_pool_indices, accepted_drafts)}
        for pool_idx, chunk in self._pending:
            if pool_idx in n_ok:
                chunk.accepted[:] = chunk.step <= n_ok[pool_idx]
        self._pending = []
        self.round += 1
        self._stats.resolved_rounds += 1

    # -- request lifecycle -------------------------------------------------------
    def forget(self, req_pool_indices: Sequence[int]) -> None:
        gone = {int(p) for p in req_pool_indices}
        for p in gone:
            self._by_req.pop(p, None)
        if self._pending:
            self._pending = [(p, c) for p, c in self._pending if p not in gone]

    def collect(self, req_pool_idx: int, seqlen: int) -> Optional[MtpRouting]:
        """Pop a finished request's entries. ``seqlen``: tokens of the returned sequence.

        A verify can accept tokens past a stop (max_new_tokens, a stop string) that
        the response then trims; their entries are kept but marked not accepted.
        """
        chunks = self._by_req.pop(int(req_pool_idx), [])
        if not chunks:
            return None
        for c in chunks:
            c.accepted &= c.positions + 1 < seqlen
        cat = lambda f: np.concatenate([getattr(c, f) for c in chunks])  # noqa: E731
        n = [len(c.positions) for c in chunks]
        return MtpRouting(
            positions=cat("positions"),
            depth=np.repeat([c.depth for c in chunks], n).astype(np.uint8),
            step=np.repeat([c.step for c in chunks], n).astype(np.uint8),
            accepted=cat("accepted"),
            experts=np.concatenate([c.experts for c in chunks]),
            tokens=cat("tokens"),
            rounds=np.repeat([c.round for c in chunks], n).astype(np.int32),
        )

    def stats(self):
        return {**self._stats.as_dict(), "requests_held": len(self._by_req)}
