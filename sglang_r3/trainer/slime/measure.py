"""Live R3 health under slime: the training forwards counted through slime's ``get_routing_replay_compute_topk``
(``fill_routing_replay(..., measure=True)``), read with ``health(model)`` once per training step."""

from __future__ import annotations

import functools
from typing import Any, Dict, Tuple

from sglang_r3.trainer.routers import RouterBinding, current_meter, measured_compute_topk
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.health import HealthCounts
from sglang_r3.trainer.slime.binding import replaying_forward

SLIME_REPLAY_MODULE = "slime.utils.routing_replay"


def health(model: Any, reset: bool = True, prefix: str = "r3/") -> Dict[str, float]:
    """This rank's R3 health since the last read, as a flat dict for slime's ``log_dict`` (one
    device->host copy; call once per training step, after ``train_one_step``).

    ``r3/flip_rate`` (share of replayed (record row, MoE layer) pairs whose own expert set differs from
    the replayed one), ``r3/tokens_with_flip`` (share of replayed record rows with a flip in some
    layer), ``r3/flip_rate/layer_{id}``, ``r3/rows_replayed`` (record rows, pad rows excluded), the
    counts behind them (``r3/pairs_replayed``, ``r3/pairs_flipped``, ``r3/tokens_flipped``) and the MTP
    routers' own figures apart: ``r3/mtp/rows_routed[/layer_{id}]`` (rows they routed live). What is
    counted: ``fill_routing_replay``'s ``measure``. The figures cover this rank's layers (its pipeline
    stage) and rows (its data-parallel shard); ``health_counts`` on every rank and
    ``sglang_r3.trainer.diagnostics.merge_counts`` give totals."""
    return health_counts(model, reset).metrics(prefix)


def health_counts(model: Any, reset: bool = True) -> HealthCounts:
    """``health``'s counts, for summing across ranks or steps."""
    binding = RouterBinding.of(model)
    if binding is None:
        raise ReplayError("health(model) needs fill_routing_replay(model, ..., measure=True) on this model first")
    if not binding.measuring or binding.health is None:
        raise ReplayError("health(model): the last fill_routing_replay on this model was not called with measure=True")
    return binding.read_health(reset)


def measure_slime_compute_topk() -> None:
    """Wrap slime's ``get_routing_replay_compute_topk`` (once per process) so that the ``compute_topk``
    it builds also counts, through the core's ``measured_compute_topk``, in counted forwards.

    The megatron.patch hunk imports the function from its module at every call of
    ``topk_routing_with_score_function``, so the wrap reaches every router from the next forward on;
    routers without an armed meter (MTP, other models) are not affected."""
    module, get = slime_compute_topk_factory()
    if getattr(get, "_r3_measuring", False):
        return

    @functools.wraps(get)
    def get_routing_replay_compute_topk(old_compute_topk):
        # old_compute_topk: megatron's own compute_topk at that call, the routing without replay.
        return measured_compute_topk(get(old_compute_topk), old_compute_topk, _counted_forward)

    get_routing_replay_compute_topk._r3_measuring = True
    module.get_routing_replay_compute_topk = get_routing_replay_compute_topk


def slime_compute_topk_factory() -> Tuple[Any, Any]:
    """slime's routing-replay module and its ``get_routing_replay_compute_topk``; ``ReplayError`` naming what is missing."""
    import importlib

    try:
        module = importlib.import_module(SLIME_REPLAY_MODULE)
    except ImportError as e:
        raise ReplayError(f"measure=True needs slime's {SLIME_REPLAY_MODULE} ({e})") from None
    get = getattr(module, "get_routing_replay_compute_topk", None)
    if not callable(get):
        raise ReplayError(
            f"measure=True needs {SLIME_REPLAY_MODULE}.get_routing_replay_compute_topk (slime 624b824's "
            f"compute_topk factory, which megatron.patch calls in topk_routing_with_score_function)"
        )
    return module, get


def _counted_forward() -> bool:
    """Host test inside a decoder router's compute_topk: a training forward that slime replays.
    (``measured_compute_topk`` already leaves out router forwards inside autograd's backward.)"""
    m = current_meter()
    return m is not None and m.training and replaying_forward()
