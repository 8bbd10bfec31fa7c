"""megatron-core's ``RouterReplay`` driven from SGLang routing records: decoder MoE routers replay (forward
and activation recompute), MTP routers stay live (SGLang's MTP-draft routing comes from another forward).
Several microbatches per step: every Megatron schedule runs a chunk's forwards and backwards in microbatch
order, so one FIFO per router serves them all. On a GPU, rows reach a router through pinned memory.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch

from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RoutingRecord
from sglang_r3.trainer.routers import RouterBinding, RouterState, pack_microbatches, router_device
from sglang_r3.trainer.discovery import RouterSite, as_chunks
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.health import HealthCounts, in_backward
from sglang_r3.trainer.model_check import model_config
from sglang_r3.trainer.packing import PackedRows, TokenLayout, pack_rows
from sglang_r3.trainer.validate import check_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FillSummary:
    num_samples: int
    num_rows: int  # rows handed to each decoder router on this rank
    replayed_layers: Tuple[int, ...]
    live_mtp_layers: Tuple[int, ...]


@dataclass
class _RouterQueue:
    """One decoder router's rows for the step: filled microbatches in order, and forwards awaiting recompute."""

    forward: Deque[Tuple[int, torch.Tensor]]  # (microbatch, [rows, topk]) not yet consumed by a forward
    recompute: Deque[Tuple[int, torch.Tensor]]  # forwarded, not yet recomputed
    filled: int
    forwards: int = 0
    recomputes: int = 0


class ReplayFiller:
    """Binds once to a model; ``fill`` before each microbatch's forward, ``clear`` after the step.

    With several microbatches per step, ``fill_microbatches`` once before ``forward_backward_func``
    and ``finish`` after it.
    """

    def __init__(
        self,
        model_or_chunks: Any,
        layout: ModelLayout,
        token_layout: Optional[TokenLayout] = None,
        weight_version: Optional[str] = None,
        allow_mixed_versions: bool = False,
        measure: bool = False,
    ):
        """weight_version: the version of the weights the trainer holds (SGLang's weight version string
        of the policy that generated the rollouts). When set, records routed with other weights are
        refused; update it with ``filler.weight_version = v`` after each weight sync.
        allow_mixed_versions: accept records that spanned a weight update (``"mixed:v1,v2"``), which
        are refused by default.
        measure: count, during replayed forwards, the pairs where a router's own routing differs from
        the record (``health()``); device-side, read once per step."""
        self.chunks = as_chunks(model_or_chunks)
        self.layout = layout
        self.weight_version = weight_version
        self.allow_mixed_versions = allow_mixed_versions
        self.measure = bool(measure)
        self._token_layout = token_layout
        self._columns = {lid: i for i, lid in enumerate(layout.moe_layer_ids)}
        self._routers = RouterBinding(self.chunks, layout, rows=_replay_rows, prepare=_ensure_replay)
        self.sites: List[RouterSite] = self._routers.sites
        self.decoder_sites = self._routers.decoder
        self.mtp_sites = self._routers.mtp
        self._drop_queues()
        if self.measure:
            self._routers.open_health()
        logger.info(
            "R3 replay: %d decoder MoE routers replay records (layers %s); %d MTP router(s) left live "
            "(routing computed by the trainer)",
            len(self.decoder_sites),
            [s.layer_id for s in self.decoder_sites],
            len(self.mtp_sites),
        )
        self._live_mtp()

    @property
    def weight_version(self) -> Optional[str]:
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: Optional[str]) -> None:
        if version is not None and not isinstance(version, str):
            raise ReplayError(f"weight_version must be a string or None, got {type(version).__name__}")
        self._weight_version = version

    # -- token layout ----------------------------------------------------------
    def token_layout(self) -> TokenLayout:
        if self._token_layout is None:
            self._token_layout = TokenLayout.from_megatron(config=model_config(self.chunks, self.sites))
        return self._token_layout

    def pack(self, records: Sequence[RoutingRecord], tokens: Sequence[Any]) -> PackedRows:
        """Check every record, then lay the rows out as this rank's packed microbatch.

        tokens[i]: sample i's token ids (prompt + completion; 1-D tensor, array or list of ints).
        """
        check_records(records, tokens, self.layout, self.weight_version, self.allow_mixed_versions)
        return pack_rows([r.experts for r in records], self.layout.num_experts, self.token_layout())

    # -- actions ---------------------------------------------------------------
    def fill(self, records: Sequence[RoutingRecord], tokens: Sequence[Any]) -> FillSummary:
        """Replay one microbatch: records[i] holds the routing of sample i, whose token ids are tokens[i]."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        packed = self.pack(records, tokens)  # raises before any router is touched
        per_layer = packed.layer_tensors()
        targets = [per_layer[self._columns[s.layer_id]] for s in self.decoder_sites]
        self._drop_queues()  # a single fill replaces a queued step
        self._routers.arm(self.measure, [packed.real])
        for s, t in zip(self.decoder_sites, targets):
            rr = s.router.router_replay
            rr.set_target_indices(_on_device(t, router_device(s.router)))  # also queued for recomputation
            rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        self._live_mtp()
        return self._summary(len(records), packed.num_rows)

    def fill_microbatches(
        self, microbatches: Sequence[Tuple[Sequence[RoutingRecord], Sequence[Any]]]
    ) -> List[FillSummary]:
        """Queue a whole step: microbatches[m] = (records, tokens) of microbatch m, in the order the
        schedule's data iterator yields them. Every record of every microbatch is checked before any
        router is touched. Each decoder router then replays microbatch m's rows in its m-th forward
        and again in its m-th activation recompute; call ``finish`` after ``forward_backward_func``."""
        packed = pack_microbatches(microbatches, self.pack, "fill_microbatches")
        self.clear()
        self._routers.arm(self.measure, [p.real for p in packed])
        per_mb = [p.layer_tensors() for p in packed]
        for s, st in zip(self.decoder_sites, self._routers.decoder_states):
            col = self._columns[s.layer_id]
            dev = router_device(s.router)
            st.data = _RouterQueue(
                forward=deque((m, _pinned_for(layers[col], dev)) for m, layers in enumerate(per_mb)),
                recompute=deque(),
                filled=len(per_mb),
            )
        self._live_mtp()
        return [self._summary(len(b[0]), p.num_rows) for b, p in zip(microbatches, packed)]

    def finish(self) -> None:
        """After the step: every filled microbatch must have reached every decoder router once, and a
        router that recomputes must have recomputed each of its forwards; then clear.
        Raises naming the router otherwise (rows left over: the schedule ran fewer microbatches
        than were filled)."""
        problems = []
        for s, st in zip(self.decoder_sites, self._routers.decoder_states):
            q = st.data
            if q is None:
                continue
            if q.forward:
                problems.append(
                    f"{s.describe()}: microbatch(es) {[m for m, _ in q.forward]} of {q.filled} filled were "
                    f"never forwarded"
                )
            # A router recomputes every forward of a step or none (Megatron decides per layer; a
            # forward-only step recomputes nothing).
            if q.recomputes and q.recompute:
                problems.append(
                    f"{s.describe()}: recomputed {q.recomputes} forward(s) but not microbatch(es) "
                    f"{[m for m, _ in q.recompute]}"
                )
        self.clear()
        if problems:
            raise ReplayError("replay queue not consumed exactly: " + "; ".join(problems))

    # -- live health -------------------------------------------------------------
    def health(self, reset: bool = True) -> Dict[str, float]:
        """This step's R3 health as a flat dict for any logger (one device->host copy):

        ``r3/flip_rate`` (share of replayed (token, MoE layer) pairs whose own expert set differs from
        the record's), ``r3/tokens_with_flip`` (share of replayed rows with a flip in some layer),
        ``r3/flip_rate/layer_{id}``, ``r3/rows_replayed`` (record rows, pad rows excluded), counts
        (``r3/pairs_replayed``, ``r3/pairs_flipped``, ``r3/tokens_flipped``), and the MTP routers'
        own figures apart: ``r3/mtp/rows_routed[/layer_{id}]`` (rows they routed live).
        Counts are this rank's layers and rows; ``health_counts`` gives them for summing across ranks."""
        return self.health_counts(reset).metrics()

    def health_counts(self, reset: bool = True) -> HealthCounts:
        if not self.measure:
            raise ReplayError("health() needs ReplayFiller(..., measure=True)")
        return self._routers.read_health(reset)

    def _summary(self, num_samples: int, num_rows: int) -> FillSummary:
        return FillSummary(
            num_samples=num_samples,
            num_rows=num_rows,
            replayed_layers=tuple(s.layer_id for s in self.decoder_sites),
            live_mtp_layers=tuple(s.layer_id for s in self.mtp_sites),
        )

    def _drop_queues(self) -> None:
        for st in self._routers.decoder_states:
            st.data = None

    def replay_backward(self) -> None:
        """After the forward: recomputed router forwards (activation recompute) pop the queued rows."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for s in self.decoder_sites:
            s.router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        self._live_mtp()

    def record(self) -> None:
        """Let decoder routers compute their routing and keep it (for the fidelity report)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self._drop_queues()
        for s in self.decoder_sites:
            s.router.router_replay.clear_indices()
            s.router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
        self._live_mtp()

    def recorded(self) -> Dict[int, torch.Tensor]:
        """layer id -> [rows, topk] the trainer chose in the last RECORD forward."""
        out = {}
        for s in self.decoder_sites:
            idx = s.router.router_replay.get_recorded_indices()
            if idx is None:
                raise ReplayError(f"{s.describe()}: nothing recorded; call record() and run a forward first")
            out[s.layer_id] = idx.detach().cpu()
        return out

    def clear(self) -> None:
        """Drop targets, queued rows and actions: routers compute their own routing again.

        Drops silently (for error paths); ``finish`` checks that a queued step was consumed first."""
        self._drop_queues()
        for s in self.decoder_sites:
            s.router.router_replay.clear_indices()
            s.router.router_replay.clear_router_replay_action()
        self._routers.drop_bindings()  # counts so far stay for health()

    def _live_mtp(self) -> None:
        # A global RouterReplay.set_global_router_replay_action would reach MTP routers too.
        for s in self.mtp_sites:
            rr = getattr(s.router, "router_replay", None)
            if rr is not None:
                rr.clear_router_replay_action()


def _ensure_replay(sites: Sequence[RouterSite]) -> None:
    """Give a decoder router built without moe_enable_routing_replay its own RouterReplay instance."""
    for site in sites:
        if not site.is_mtp and getattr(site.router, "router_replay", None) is None:
            from megatron.core.transformer.moe.router_replay import RouterReplay

            site.router.router_replay = RouterReplay()


def _pinned_for(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host rows for a GPU router in pinned memory, so the copy before its forward need not block."""
    return rows.pin_memory() if device.type == "cuda" and rows.device.type == "cpu" else rows


def _on_device(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """rows on the router's device, copied without the host waiting (pinned source, non-blocking)."""
    if rows.device == device:
        return rows
    return _pinned_for(rows, device).to(device, non_blocking=True)


def _replay_rows(state: RouterState, router: Any) -> Optional[Tuple[Any, str]]:
    """The core's row source: serve a queued microbatch, then the rows this forward replays."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    rr = router.router_replay
    if rr is None:
        return None
    where = _take_queued(state, router, rr, state.data) if state.data is not None else ""
    action = rr.router_replay_action
    if action == RouterReplayAction.REPLAY_FORWARD:
        return rr.target_topk_idx, where
    if action == RouterReplayAction.REPLAY_BACKWARD:
        return (rr.replay_backward_list[0] if rr.replay_backward_list else None), where
    return None


def _take_queued(state: RouterState, router: Any, rr: Any, q: _RouterQueue) -> str:
    """Point Megatron's RouterReplay at the rows this call must use; return ' (microbatch m)' for messages."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    if in_backward():
        if not q.recompute:
            raise ReplayError(
                f"{state.name}: activation recompute #{q.recomputes + 1} but no forward is awaiting "
                f"recompute ({q.forwards} forward(s), {q.recomputes} recomputed)"
            )
        m, rows = q.recompute.popleft()
        q.recomputes += 1
        rr.replay_backward_list = [rows]
        rr.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        return f" (recompute of microbatch {m})"
    if not q.forward:
        raise ReplayError(
            f"{state.name}: forward #{q.forwards + 1} but only {q.filled} microbatch(es) were filled"
        )
    m, rows = q.forward.popleft()
    rows = _on_device(rows, router_device(router))  # kept on the device for the recompute too
    q.forwards += 1
    # Kept whatever the grad mode: a checkpointed layer's first forward runs under no_grad.
    q.recompute.append((m, rows))
    rr.target_topk_idx = rows
    rr.replay_backward_list = []
    rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    return f" (microbatch {m})"
