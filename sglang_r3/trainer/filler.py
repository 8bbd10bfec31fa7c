"""Drive megatron-core's per-router RouterReplay from SGLang routing records.

Decoder MoE routers replay the record (forward, and backward recomputation);
MTP routers are left live: SGLang's MTP-draft routing comes from a different
forward (draft tokens, draft steps) than the trainer's MTP loss, so there is
no row to replay for them and their routing is computed.

Several microbatches per step (Megatron's ``forward_backward_func``): every
schedule Megatron has (no pipelining, 1F1B, interleaved) runs each model
chunk's forwards in microbatch order and its backwards in the same order, so
one FIFO per router serves them all: a forward takes the next microbatch's rows,
and an activation recompute (a router forward inside autograd's backward) takes
the rows of the oldest forward not yet recomputed. Megatron's own RouterReplay
holds a single forward target, so the filler sets it from the queue just
before each router forward.

Live health (``measure=True``, sglang_r3/trainer/health.py): every replaying decoder router also
takes its own top-k from the scores it computed and counts where its expert set differs from the
replayed one, on its device; ``health()`` reads the counts once per step.

On a GPU, rows reach the router's device before its forward through pinned memory and a
non-blocking copy (Megatron's RouterReplay would otherwise copy a host tensor inside the router,
a synchronous copy on the forward path).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang_r3.layout import ModelLayout
from sglang_r3.record import RecordError, RoutingRecord
from sglang_r3.trainer.discovery import RouterSite, as_chunks, find_routers
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.health import (
    LIVE_ATTR,
    METER_ATTR,
    HealthBook,
    HealthCounts,
    in_backward,
    live_router,
    measure_router,
    router_device,
)
from sglang_r3.trainer.model_check import check_model_against_layout, model_config
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
        self.sites: List[RouterSite] = find_routers(self.chunks, layout.num_hidden_layers)
        check_model_against_layout(self.chunks, self.sites, layout)
        self.decoder_sites = [s for s in self.sites if not s.is_mtp]
        self.mtp_sites = [s for s in self.sites if s.is_mtp]
        self.measure = bool(measure)
        self._token_layout = token_layout
        self._columns = {lid: i for i, lid in enumerate(layout.moe_layer_ids)}
        for s in self.decoder_sites:
            _ensure_replay(s)
            if not getattr(s.router, "_r3_row_guard", False):  # one guard per router, however many fillers
                s.router.register_forward_pre_hook(_row_guard(s))
                s.router._r3_row_guard = True
            s.router._r3_queue = None  # set by fill_microbatches, read by the guard
        self._health: Optional[HealthBook] = None
        if self.measure:
            self._health = HealthBook(
                [measure_router(s.router, s.layer_id) for s in self.decoder_sites],
                [live_router(s.router, s.layer_id) for s in self.mtp_sites],
            )
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
        self._arm()
        bind = self._binder(packed.real)
        for s, t in zip(self.decoder_sites, targets):
            rr = s.router.router_replay
            rr.set_target_indices(_on_device(t, router_device(s.router)))  # also queued for recomputation
            rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            bind(s)
        self._live_mtp()
        return self._summary(len(records), packed.num_rows)

    def fill_microbatches(
        self, microbatches: Sequence[Tuple[Sequence[RoutingRecord], Sequence[Any]]]
    ) -> List[FillSummary]:
        """Queue a whole step: microbatches[m] = (records, tokens) of microbatch m, in the order the
        schedule's data iterator yields them. Every record of every microbatch is checked before any
        router is touched. Each decoder router then replays microbatch m's rows in its m-th forward
        and again in its m-th activation recompute; call ``finish`` after ``forward_backward_func``."""
        if not microbatches:
            raise ReplayError("fill_microbatches needs at least one microbatch")
        packed = []
        for m, batch in enumerate(microbatches):
            try:
                records, tokens = batch
            except (TypeError, ValueError):
                raise ReplayError(f"microbatch {m}: expected a (records, tokens) pair") from None
            try:
                packed.append(self.pack(records, tokens))
            except (RecordError, ReplayError) as e:
                raise type(e)(f"microbatch {m}: {e}") from None
        self.clear()
        self._arm()
        per_mb = [p.layer_tensors() for p in packed]
        binders = [self._binder(p.real) for p in packed]
        for s in self.decoder_sites:
            col = self._columns[s.layer_id]
            dev = router_device(s.router)
            s.router._r3_queue = _RouterQueue(
                forward=deque((m, _pinned_for(layers[col], dev)) for m, layers in enumerate(per_mb)),
                recompute=deque(),
                filled=len(per_mb),
            )
            for bind in binders:  # one binding per microbatch, consumed by the router's forwards in order
                bind(s)
        self._live_mtp()
        return [self._summary(len(b[0]), p.num_rows) for b, p in zip(microbatches, packed)]

    def finish(self) -> None:
        """After the step: every filled microbatch must have reached every decoder router once, and a
        router that recomputes must have recomputed each of its forwards; then clear.
        Raises naming the router otherwise (rows left over: the schedule ran fewer microbatches
        than were filled)."""
        problems = []
        for s in self.decoder_sites:
            q = getattr(s.router, "_r3_queue", None)
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
        if self._health is None:
            raise ReplayError("health() needs ReplayFiller(..., measure=True)")
        return self._health.read(reset)

    def _arm(self) -> None:
        """Meters on these routers count only for a filler that asked to measure (models are shared)."""
        for s in self.decoder_sites:
            m = getattr(s.router, METER_ATTR, None)
            if m is not None:
                m.armed = self.measure
                m.drop_bindings()
        for s in self.mtp_sites:
            live = getattr(s.router, LIVE_ATTR, None)
            if live is not None:
                live.armed = self.measure
        if self._health is not None:
            self._health.start_fill()
            self._health.arm(True)

    def _binder(self, real: np.ndarray):
        """pushes one microbatch's binding (pad mask, token flags; one per device) onto a router's meter."""
        made: Dict[Any, Any] = {}

        def bind(site: RouterSite) -> None:
            if self._health is None:
                return
            dev = router_device(site.router)
            if dev not in made:
                made[dev] = self._health.binding(real, dev)
            getattr(site.router, METER_ATTR).push(made[dev])

        return bind

    def _summary(self, num_samples: int, num_rows: int) -> FillSummary:
        return FillSummary(
            num_samples=num_samples,
            num_rows=num_rows,
            replayed_layers=tuple(s.layer_id for s in self.decoder_sites),
            live_mtp_layers=tuple(s.layer_id for s in self.mtp_sites),
        )

    def _drop_queues(self) -> None:
        for s in self.decoder_sites:
            s.router._r3_queue = None

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
            m = getattr(s.router, METER_ATTR, None)
            if m is not None:
                m.drop_bindings()  # counts so far stay for health()

    def _live_mtp(self) -> None:
        # A global RouterReplay.set_global_router_replay_action would reach MTP routers too.
        for s in self.mtp_sites:
            rr = getattr(s.router, "router_replay", None)
            if rr is not None:
                rr.clear_router_replay_action()


def _ensure_replay(site: RouterSite) -> None:
    """Give a router built without moe_enable_routing_replay its own RouterReplay instance."""
    if getattr(site.router, "router_replay", None) is None:
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


def _row_guard(site: RouterSite):
    """Serve queued microbatches, and name the layer when rows do not match the tokens reaching the router."""

    def hook(module, args):
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        rr = module.router_replay
        x = args[0] if args else None
        q = getattr(module, "_r3_queue", None)
        where = ""
        if q is not None and rr is not None:
            where = _take_queued(site, rr, q)
        if rr is None or rr.router_replay_action not in (
            RouterReplayAction.REPLAY_FORWARD, RouterReplayAction.REPLAY_BACKWARD
        ):
            return None
        if rr.router_replay_action == RouterReplayAction.REPLAY_FORWARD:
            target = rr.target_topk_idx
        else:
            target = rr.replay_backward_list[0] if rr.replay_backward_list else None
        if x is None or target is None:
            return None
        tokens = x.numel() // x.shape[-1]
        rows = int(target.shape[0])
        if rows != tokens:
            raise ReplayError(
                f"{site.describe()}{where}: {tokens} tokens reach the router but {rows} rows were filled; "
                f"the packed microbatch and the records disagree (check padding, CP/SP slicing)"
            )
        return None

    return hook


def _take_queued(site: RouterSite, rr: Any, q: _RouterQueue) -> str:
    """Point Megatron's RouterReplay at the rows this call must use; return ' (microbatch m)' for messages."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    if in_backward():
        if not q.recompute:
            raise ReplayError(
                f"{site.describe()}: activation recompute #{q.recomputes + 1} but no forward is awaiting "
                f"recompute ({q.forwards} forward(s), {q.recomputes} recomputed)"
            )
        m, rows = q.recompute.popleft()
        q.recomputes += 1
        rr.replay_backward_list = [rows]
        rr.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        return f" (recompute of microbatch {m})"
    if not q.forward:
        raise ReplayError(
            f"{site.describe()}: forward #{q.forwards + 1} but only {q.filled} microbatch(es) were filled"
        )
    m, rows = q.forward.popleft()
    rows = _on_device(rows, router_device(site.router))  # kept on the device for the recompute too
    q.forwards += 1
    # Kept whatever the grad mode: a checkpointed layer's first forward runs under no_grad.
    q.recompute.append((m, rows))
    rr.target_topk_idx = rows
    rr.replay_backward_list = []
    rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    return f" (microbatch {m})"
