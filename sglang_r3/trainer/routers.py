"""The trainer core both replay drivers share: bind a model's routers to a layout by identity, check and
pack every microbatch before any router is touched, guard each router's rows against the tokens that
reach it, and arm live health. A driver (``megatron.ReplayFiller``: megatron-core's ``RouterReplay``;
``trainer/slime/``: slime's ``RoutingReplay``) says only where rows go and how MTP routers stay live.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np
import torch

from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RecordError
from sglang_r3.trainer.discovery import RouterSite, as_chunks, find_routers
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.health import HealthBook, HealthCounts, LiveMeter, RouterMeter, in_backward
from sglang_r3.trainer.model_check import check_model_against_layout

T = TypeVar("T")

# rows(state, router): the rows this forward replays and " (microbatch m)" for messages; None: nothing to check
RowSource = Callable[["RouterState", Any], Optional[Tuple[Any, str]]]


@dataclass(frozen=True)
class LiveRouting:
    """How a driver keeps an MTP router live: ``enter(state)`` before its forward, ``leave(state)`` after
    it (also when the forward raises)."""

    enter: Callable[["RouterState"], None]
    leave: Callable[["RouterState"], None]


@dataclass(eq=False)
class RouterState:
    """Everything R3 keeps for one Megatron router (``state_of``). It holds no reference to the router,
    so a router that is dropped takes its state along."""

    name: str  # where the router sits and which layer it routes, for messages
    layer_id: int
    rows: Optional[RowSource] = None  # decoder router: the claiming driver's rows for each forward
    live: Optional[LiveRouting] = None  # MTP router: the claiming driver's live routing
    data: Any = None  # the driver's own (ReplayFiller: this step's queue; slime: the stage a live forward replaced)
    meter: Optional[RouterMeter] = None  # flips against the replayed rows
    live_meter: Optional[LiveMeter] = None  # rows routed live
    counted_replay: Any = None  # the RouterReplay whose get_replay_topk counts into ``meter``


class _Routers:
    """What the core owns: every router it has touched (weakly, by identity), the one whose forward is
    running (a slime-style ``compute_topk`` is not shown its router), and slime's bindings per model."""

    def __init__(self) -> None:
        self.states: "weakref.WeakKeyDictionary[Any, RouterState]" = weakref.WeakKeyDictionary()
        self.current: Optional[RouterState] = None
        self.bindings: "weakref.WeakKeyDictionary[Any, RouterBinding]" = weakref.WeakKeyDictionary()


_ROUTERS = _Routers()


def state_of(router: Any, layer_id: Optional[int] = None, name: Optional[str] = None) -> RouterState:
    """The router's state, made (with the router's one pre-forward and one forward hook) on first use."""
    st = _ROUTERS.states.get(router)
    if st is None:
        if layer_id is None:
            raise ReplayError("router not bound by R3 yet: a layer id is needed")
        st = RouterState(name or f"router (layer {layer_id})", int(layer_id))
        _ROUTERS.states[router] = st
        router.register_forward_pre_hook(functools.partial(_before_forward, st))
        router.register_forward_hook(functools.partial(_after_forward, st), always_call=True)
    elif name is not None:
        st.name = name
    return st


def router_device(router: Any) -> torch.device:
    w = getattr(router, "weight", None)
    return w.device if isinstance(w, torch.Tensor) else torch.device("cpu")


def _before_forward(st: RouterState, module: Any, args: Any) -> None:
    _ROUTERS.current = st
    if st.meter is not None:
        st.meter.training = bool(module.training)
    if st.live_meter is not None:
        st.live_meter.count(module, args)  # before the driver's live stage: counting reads the ambient one
    if st.live is not None:
        st.live.enter(st)
    if st.rows is not None:
        _row_guard(st, module, args)


def _after_forward(st: RouterState, module: Any, args: Any, output: Any) -> None:
    if _ROUTERS.current is st:
        _ROUTERS.current = None
    if st.live is not None:
        st.live.leave(st)


def _row_guard(st: RouterState, module: Any, args: Any) -> None:
    """Name the layer and microbatch where rows and the tokens reaching the router disagree (Megatron and
    slime would fail later with a bare shape error, or not at all)."""
    got = st.rows(st, module)
    x = args[0] if args else None
    if got is None or x is None or not hasattr(got[0], "shape"):
        return
    rows, where = got
    tokens = x.numel() // x.shape[-1]
    if int(rows.shape[0]) != tokens:
        raise ReplayError(
            f"{st.name}{where}: {tokens} tokens reach the router but {int(rows.shape[0])} rows were filled; "
            f"the microbatch and its rows disagree (order of microbatches, padding, CP/SP slicing)"
        )


# -- validate and pack ----------------------------------------------------------------------------------

def pack_microbatches(
    microbatches: Sequence[Any], pack: Callable[[Any, Any], T], caller: str, what: str = "records"
) -> List[T]:
    """``pack(samples, tokens)`` of every microbatch before any router is touched; an error names its microbatch."""
    if not microbatches:
        raise ReplayError(f"{caller} needs at least one microbatch")
    out = []
    for m, batch in enumerate(microbatches):
        try:
            samples, tokens = batch
        except (TypeError, ValueError):
            raise ReplayError(f"microbatch {m}: expected a ({what}, tokens) pair") from None
        try:
            out.append(pack(samples, tokens))
        except (RecordError, ReplayError) as e:
            raise type(e)(f"microbatch {m}: {e}") from None
    return out


# -- binding by identity ----------------------------------------------------------------------------------

class RouterBinding:
    """One model's routers bound by identity to one layout: decoder MoE routers replay the driver's rows,
    MTP routers stay live. ``prepare(sites)`` is the driver's check or set-up before any hook is placed."""

    def __init__(
        self,
        model: Any,
        layout: ModelLayout,
        rows: RowSource,
        live: Optional[LiveRouting] = None,
        live_counting: Optional[Callable[[Any], bool]] = None,
        prepare: Optional[Callable[[List[RouterSite]], None]] = None,
    ):
        chunks = as_chunks(model)
        if not chunks:
            raise ReplayError("no model chunks")
        self.chunk_ids = tuple(id(c) for c in chunks)  # not the chunks: a cached binding must not keep its model
        self.fingerprint = layout.fingerprint
        self.sites: List[RouterSite] = find_routers(chunks, layout.num_hidden_layers)
        check_model_against_layout(chunks, self.sites, layout)
        if prepare is not None:
            prepare(self.sites)
        self.decoder = [s for s in self.sites if not s.is_mtp]
        self.mtp = [s for s in self.sites if s.is_mtp]
        self.decoder_states = [state_of(s.router, s.layer_id, s.describe()) for s in self.decoder]
        self.mtp_states = [state_of(s.router, s.layer_id, s.describe()) for s in self.mtp]
        self._rows, self._live, self._live_counting = rows, live, live_counting
        self.health: Optional[HealthBook] = None
        self.measuring = False  # the last fill asked to measure
        self.claim()

    @classmethod
    def shared(cls, model: Any, layout: ModelLayout, **driver: Any) -> "RouterBinding":
        """The model's binding to this layout, made once (slime fills every step; the model stays)."""
        chunks = as_chunks(model)
        cached = cls.of(chunks)
        if cached is not None and cached.fingerprint == layout.fingerprint:
            return cached
        binding = cls(chunks, layout, **driver)
        _ROUTERS.bindings[chunks[0]] = binding
        return binding

    @staticmethod
    def of(model: Any) -> Optional["RouterBinding"]:
        """The binding ``shared`` made for exactly these chunks, or None."""
        chunks = as_chunks(model)
        binding = _ROUTERS.bindings.get(chunks[0]) if chunks else None
        if binding is None or binding.chunk_ids != tuple(id(c) for c in chunks):
            return None
        return binding

    def claim(self) -> None:
        """Make this binding's driver the one its routers answer to (the last fill's driver wins)."""
        for st in self.decoder_states:
            st.rows = self._rows
        for st in self.mtp_states:
            st.live = self._live

    def open_health(self) -> HealthBook:
        """Meters on every router of the binding, counted from zero."""
        self.health = HealthBook(
            [measure_router(s.router, s.layer_id) for s in self.decoder],
            [live_router(s.router, s.layer_id, self._live_counting) for s in self.mtp],
        )
        return self.health

    def arm(self, measure: bool, reals: Sequence[Optional[np.ndarray]] = ()) -> None:
        """A fill: claim the routers; meters count only for a fill that asked to (the model is shared, so
        meters someone else attached are disarmed too); each microbatch's pad mask is bound, in forward order."""
        self.claim()
        if measure and self.health is None:
            self.open_health()
        for st in self.decoder_states:
            if st.meter is not None:
                st.meter.armed = measure
                st.meter.drop_bindings()
        for st in self.mtp_states:
            if st.live_meter is not None:
                st.live_meter.armed = measure
        self.measuring = bool(measure)
        if not measure:
            return
        self.health.start_fill()
        self.health.arm(True)
        for real in reals:
            if real is not None:  # None: no MoE layer on this rank
                self.health.bind_microbatch(real)

    def drop_bindings(self) -> None:
        """Forget the microbatches bound for counting; counts so far stay."""
        for st in self.decoder_states:
            if st.meter is not None:
                st.meter.drop_bindings()

    def read_health(self, reset: bool = True) -> HealthCounts:
        return self.health.read(reset)


# -- meters on routers ----------------------------------------------------------------------------------

def measure_router(router: Any, layer_id: int) -> RouterMeter:
    """Attach (once) a flip meter to a megatron-core ``TopKRouter``. Where the router has Megatron's
    ``RouterReplay``, its ``get_replay_topk`` also takes the router's own top-k and counts; a slime-style
    ``compute_topk`` reaches the same meter through ``measured_compute_topk``."""
    st = state_of(router, layer_id)
    if st.meter is None:
        st.meter = RouterMeter(layer_id, router_device(router))
    elif st.meter.layer_id != int(layer_id):
        raise ValueError(f"router already measured as layer {st.meter.layer_id}, not {layer_id}")
    rr = getattr(router, "router_replay", None)
    if rr is not None and st.counted_replay is not rr:
        _count_replay(rr, st.meter)
        st.counted_replay = rr
    return st.meter


def live_router(router: Any, layer_id: int, counting: Optional[Callable[[Any], bool]] = None) -> LiveMeter:
    """Attach (once) a count of rows routed live (MTP routers). counting: which forwards count; given, it
    replaces the meter's."""
    st = state_of(router, layer_id)
    if st.live_meter is None:
        st.live_meter = LiveMeter(layer_id, counting)
    elif counting is not None:
        st.live_meter.counting = counting
    return st.live_meter


def current_meter() -> Optional[RouterMeter]:
    """The meter of the router now in its forward."""
    st = _ROUTERS.current
    return st.meter if st is not None else None


def _count_replay(rr: Any, meter: RouterMeter) -> None:
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    original = RouterReplay.get_replay_topk.__get__(rr)  # the class's own method, never a wrapper of ours

    def get_replay_topk(scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        probs, ids = original(scores, topk, num_groups, group_topk, default_compute_topk)
        if (
            meter.armed
            and rr.router_replay_action is RouterReplayAction.REPLAY_FORWARD
            and default_compute_topk is not None
            and not in_backward()  # an activation recompute routes the same inputs again
        ):
            with torch.no_grad():
                _, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            meter.observe(ids, own)
        return probs, ids

    rr.get_replay_topk = get_replay_topk  # instance attribute: this router only


def measured_compute_topk(
    compute_topk: Callable[..., Tuple[torch.Tensor, torch.Tensor]],
    own_topk: Callable[..., Tuple[torch.Tensor, torch.Tensor]],
    replaying: Callable[[], bool],
    meter: Optional[Callable[[], Optional[RouterMeter]]] = None,
) -> Callable[..., Tuple[torch.Tensor, torch.Tensor]]:
    """Wrap a replaying ``compute_topk(scores, topk, num_groups=None, group_topk=None)`` so that it also
    counts: own_topk is what the router would route with, replaying() a host test of the replay stage,
    meter which meter counts (default ``current_meter``). Recomputes in autograd's backward never count."""
    which = meter or current_meter

    def compute(scores, topk, num_groups=None, group_topk=None):
        probs, ids = compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        m = which()
        if m is not None and m.armed and not in_backward() and replaying():
            with torch.no_grad():
                _, own = own_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            m.observe(ids, own)
        return probs, ids

    return compute
