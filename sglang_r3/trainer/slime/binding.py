"""This rank's routers bound for slime's replay: slime's stage protocol (``ROUTING_REPLAY_STAGE`` under
``ENABLE_ROUTING_REPLAY=1``), decoder MoE routers served the rows their own ``routing_replay`` pops, MTP routers
routing live by running their forward under slime's ``fallthrough`` stage (a replay object is never shown the
scores)."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Sequence, Tuple

from sglang_r3.core.layout import ModelLayout
from sglang_r3.trainer.routers import LiveRouting, RouterBinding, RouterState
from sglang_r3.trainer.discovery import RouterSite
from sglang_r3.trainer.errors import ReplayError

logger = logging.getLogger("sglang_r3.trainer.slime")

STAGE_ENV = "ROUTING_REPLAY_STAGE"
ENABLE_ENV = "ENABLE_ROUTING_REPLAY"
LIVE_STAGE = "fallthrough"
REPLAY_FORWARD = "replay_forward"
_REPLAY_STAGES = (REPLAY_FORWARD, "replay_backward")


def replay_enabled() -> bool:
    """slime replays in this process: ``ENABLE_ROUTING_REPLAY=1`` (set by slime for the actor role only)."""
    return os.environ.get(ENABLE_ENV, "0") == "1"


def replaying_forward() -> bool:
    return replay_enabled() and os.environ.get(STAGE_ENV) == REPLAY_FORWARD


def bind(model: Any, layout: ModelLayout) -> RouterBinding:
    """This rank's routers bound to the layout (the core's binding, made once per model and layout): decoder
    routers serve slime's recorded rows, MTP routers route live under every stage."""
    return RouterBinding.shared(
        model, layout, rows=_recorded_rows, live=_LIVE, live_counting=_mtp_counted, prepare=_require_slime_replays,
    )


def _require_slime_replays(sites: Sequence[RouterSite]) -> None:
    missing = [s.describe() for s in sites if not _is_slime_replay(getattr(s.router, "routing_replay", None))]
    if missing:
        raise ReplayError(
            f"router(s) without slime's routing_replay: {', '.join(missing)}. slime's megatron patch gives "
            f"every TopKRouter one when the model is built with {ENABLE_ENV}=1 (slime sets it for actors "
            f"started with --use-routing-replay / --use-rollout-routing-replay)"
        )
    decoder = [s.layer_id for s in sites if not s.is_mtp]
    mtp = [s.layer_id for s in sites if s.is_mtp]
    logger.info(
        "R3 (slime): %d decoder MoE routers replay their own rows (layers %s); %d MTP router(s) route live "
        "under every %s (layers %s)", len(decoder), decoder, len(mtp), STAGE_ENV, mtp,
    )


def _is_slime_replay(replay: Any) -> bool:
    return all(callable(getattr(replay, name, None)) for name in ("record", "clear", "pop_forward", "pop_backward"))


def _enter_live(state: RouterState) -> None:
    if state.data is None:
        state.data = []  # the stages this router's live forwards replaced
    state.data.append(os.environ.get(STAGE_ENV))
    os.environ[STAGE_ENV] = LIVE_STAGE


def _leave_live(state: RouterState) -> None:
    if not state.data:  # an earlier pre-forward hook raised before ours ran
        return
    prev = state.data.pop()
    if prev is None:
        os.environ.pop(STAGE_ENV, None)
    else:
        os.environ[STAGE_ENV] = prev


_LIVE = LiveRouting(_enter_live, _leave_live)


def _recorded_rows(state: RouterState, router: Any) -> Optional[Tuple[Any, str]]:
    """The core's row source: the entry slime's replay pops in this forward (a message where it has none)."""
    stage = os.environ.get(STAGE_ENV)
    if stage not in _REPLAY_STAGES or not replay_enabled():
        return None
    replay = router.routing_replay
    entries = getattr(replay, "top_indices_list", None)
    index = getattr(replay, "forward_index" if stage == REPLAY_FORWARD else "backward_index", None)
    if entries is None or index is None:
        return None  # not slime's RoutingReplay layout; slime's own checks apply
    if index >= len(entries):
        raise ReplayError(
            f"{state.name}: {stage} #{index + 1}, but {len(entries)} microbatch(es) were recorded "
            f"for this router (fill_routing_replay before the pass, RoutingReplay.clear_all_forward() "
            f"between the log-prob pass and training)"
        )
    return entries[index], f" (microbatch {index}, {stage})"


def _mtp_counted(router: Any) -> bool:
    """Whether an MTP router's forward counts for health (a training forward slime replays), read before its
    live stage replaces the ambient one."""
    return bool(router.training) and replaying_forward()
