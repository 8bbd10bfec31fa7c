"""slime's ``--custom-megatron-init-path sglang_r3.trainer.slime.install``: the whole trainer side, no edit to
slime. ``install(args)`` puts ``fill.fill_routing_replay`` in place of ``MegatronTrainRayActor.fill_routing_replay``,
refuses settings under which replay would silently not happen, and with ``SGLANG_R3_HEALTH`` on wraps
``model.train_one_step`` so each step's health (``ranks.step_health``) joins slime's ``train/...`` log."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from sglang_r3.core import settings
from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.slime.binding import ENABLE_ENV, replay_enabled
from sglang_r3.trainer.slime.fill import fill_routing_replay
from sglang_r3.trainer.slime.measure import measure_slime_compute_topk, slime_compute_topk_factory
from sglang_r3.trainer.slime.ranks import step_health

logger = logging.getLogger("sglang_r3.trainer.slime")

SLIME_ACTOR_MODULE = "slime.backends.megatron_utils.actor"
SLIME_MODEL_MODULE = "slime.backends.megatron_utils.model"
INSTALL_PATH = "sglang_r3.trainer.slime.install"
HEALTH_ENV = settings.HEALTH
RECORD_KEY = "r3_routing"  # sample.train_metadata[RECORD_KEY]: our record, where slime forwards "metadata"
_FILL_PARAMS = ("self", "data_iterator", "num_microbatches", "rollout_data")
_STEP_PARAMS = ("args", "rollout_id", "step_id", "data_iterator", "model")


class SlimeInstallError(ReplayError):
    """``install(args)`` refused: the slime in this process or its settings cannot replay by identity."""


@dataclass(frozen=True)
class SlimeInstall:
    """What ``install`` put in place in this process."""

    layout: ModelLayout
    health: bool  # SGLANG_R3_HEALTH=1: each training step's R3 health goes into slime's per-step log


def install(args: Any) -> Optional[SlimeInstall]:
    """slime's ``--custom-megatron-init-path sglang_r3.trainer.slime.install``: the whole trainer side.

    slime 624b824 calls it at the end of ``slime/backends/megatron_utils/initialize.py`` ``init(args)`` in every
    Megatron training actor, after the process groups and before the model is built. It makes
    ``MegatronTrainRayActor.fill_routing_replay`` (looked up on the class by ``train_actor``) this package's
    ``fill_routing_replay``: decoder MoE routers replayed by identity from slime's ``rollout_routed_experts``
    (or records, where ``rollout_data["metadata"]`` carries them under ``"r3_routing"``), MTP routers live. With
    ``SGLANG_R3_HEALTH=1`` it also wraps ``model.train_one_step`` (called by name from ``model.train``) so each
    step's counts, summed over data-parallel ranks, enter that step's ``log_dict`` as ``train/r3/...``.

    Nothing happens (returns None) without ``--use-rollout-routing-replay`` (R3 is off: slime's log says so, as a
    warning, since the init path then does nothing), and in an actor that slime does not replay in (it sets
    ``ENABLE_ROUTING_REPLAY=1`` for the actor role only, not the critic; said at INFO). Idempotent.
    Raises ``SlimeInstallError`` naming every problem: slime's class, method or function missing, or a setting
    under which the replay would silently not happen or not match the layout. A user with an init function of
    their own calls ``install(args)`` from it."""
    # slime's configure_logger sets the root logger to INFO (basicConfig, force=True) in every actor: our
    # logger's records reach slime's log through it.
    if not getattr(args, "use_rollout_routing_replay", False):
        logger.warning(
            "R3 (slime): off, --use-rollout-routing-replay was not given: sglang-r3 installed nothing and slime "
            "trains without routing replay. Add --use-rollout-routing-replay to replay the rollout's routing "
            "(or drop --custom-megatron-init-path %s)", INSTALL_PATH,
        )
        return None
    if not replay_enabled():
        logger.info("R3 (slime): %s is not 1 in this actor (slime sets it for the actor role only, not the "
                    "critic); nothing installed here", ENABLE_ENV)
        return None
    health_on = settings.current().health
    problems: List[str] = []
    actor_cls = _slime_target(SLIME_ACTOR_MODULE, "MegatronTrainRayActor", problems)
    if actor_cls is not None:
        _check_params(actor_cls, "fill_routing_replay", _FILL_PARAMS, "MegatronTrainRayActor", problems)
    model_module = None
    if health_on:
        model_module = _slime_module(SLIME_MODEL_MODULE, problems)
        if model_module is not None:
            _check_params(model_module, "train_one_step", _STEP_PARAMS, SLIME_MODEL_MODULE, problems)
        try:
            slime_compute_topk_factory()  # wrapped below, once nothing is refused
        except ReplayError as e:
            problems.append(f"{HEALTH_ENV}=1: {e}")
    problems += _settings_problems(args)
    layout = _layout_of(args, problems)
    if problems:
        raise SlimeInstallError(
            f"sglang-r3 cannot install its R3 fill into slime ({INSTALL_PATH}): " + "; ".join(problems)
        )
    done = SlimeInstall(layout, health_on)
    current = actor_cls.fill_routing_replay
    original = getattr(current, "_r3_slime_original", current)
    actor_cls.fill_routing_replay = _fill_method(done, original)
    if health_on:
        measure_slime_compute_topk()
        if not getattr(model_module.train_one_step, "_r3_slime_health", False):
            model_module.train_one_step = _train_one_step_with_health(model_module.train_one_step)
    logger.info(
        "R3 (slime): MegatronTrainRayActor.fill_routing_replay replays %d decoder MoE layers by identity, %d MTP "
        "layer(s) route live; health in the training log: %s", len(layout.moe_layer_ids), layout.num_mtp_layers,
        "on" if health_on else f"off ({HEALTH_ENV}=1 turns it on)",
    )
    return done


def _slime_module(name: str, problems: List[str]) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        problems.append(f"{name} does not import ({e}); is slime installed in this process?")
        return None


def _slime_target(module_name: str, attr: str, problems: List[str]) -> Any:
    module = _slime_module(module_name, problems)
    if module is None:
        return None
    target = getattr(module, attr, None)
    if target is None:
        problems.append(f"{module_name} has no {attr} (written for slime 624b824)")
    return target


def _check_params(owner: Any, name: str, want: Tuple[str, ...], where: str, problems: List[str]) -> None:
    import inspect

    fn = getattr(owner, name, None)
    fn = getattr(fn, "_r3_slime_original", fn)  # ours from an earlier install: check slime's own
    if not callable(fn):
        problems.append(f"{where} has no {name}{want} (slime 624b824's); this slime cannot take the fill")
        return
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    if params[: len(want)] != want:
        problems.append(f"{where}.{name} takes {params}, not slime 624b824's {want}")


def _settings_problems(args: Any) -> List[str]:
    """Settings under which slime's replay silently does not happen, or does not replay what the rollout routed."""
    out = []
    if getattr(args, "moe_router_fusion", False):
        out.append(
            "--moe-router-fusion: megatron-core's fused top-k (topk_routing_with_score_function with fused=True) "
            "returns before compute_topk, so slime's replay never runs and every router routes live; drop the flag"
        )
    balancing = getattr(args, "moe_router_load_balancing_type", None)
    if balancing == "sinkhorn" or (isinstance(balancing, (list, tuple)) and "sinkhorn" in balancing):
        out.append(
            "--moe-router-load-balancing-type sinkhorn: sinkhorn routing never calls topk_routing_with_score_function, "
            "so nothing is replayed"
        )
    if getattr(args, "moe_expert_capacity_factor", None) is not None:
        out.append(
            "--moe-expert-capacity-factor: token dropping (apply_router_token_dropping) runs after the replay and "
            "drops replayed routes of tokens beyond an expert's capacity, so training does not route as the rollout did"
        )
    return out


def _layout_of(args: Any, problems: List[str]) -> Optional[ModelLayout]:
    from sglang_r3.core.layout import layout_from_model_path

    path = getattr(args, "hf_checkpoint", None)
    if not path:
        problems.append(
            "--hf-checkpoint is not set: the layout (the one the rollout server serves at /routing/layout) is read "
            "from its config.json"
        )
        return None
    try:
        layout = layout_from_model_path(str(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        problems.append(f"cannot read the model layout from --hf-checkpoint {path}/config.json: {e}")
        return None
    mtp = int(getattr(args, "mtp_num_layers", None) or 0)
    if mtp != layout.num_mtp_layers:
        problems.append(
            f"--mtp-num-layers {mtp}: slime builds {mtp} MTP layer(s), but --hf-checkpoint {path} has "
            f"{layout.num_mtp_layers}; records bind by identity to the checkpoint's layers (pass "
            f"--mtp-num-layers {layout.num_mtp_layers})"
        )
    return layout


def _fill_method(done: SlimeInstall, original: Any):
    """``MegatronTrainRayActor.fill_routing_replay`` as slime 624b824 calls it from ``train_actor``."""

    def method(self, data_iterator, num_microbatches, rollout_data):
        key = "metadata" if _carries_records(rollout_data) else "rollout_routed_experts"
        if key not in rollout_data:  # slime's own message
            raise ValueError(
                "rollout_routed_experts is required in rollout_data when use_rollout_routing_replay is set."
            )
        for iterator in data_iterator:
            iterator.reset()
        microbatches = []
        for _ in range(sum(num_microbatches)):  # slime's order: data_iterator[0], one get_next per microbatch
            batch = data_iterator[0].get_next([key, "tokens"])
            samples = batch[key]
            if key == "metadata":
                samples = [_record_of(m[RECORD_KEY]) for m in samples]
            microbatches.append((samples, batch["tokens"]))
        args = self.args
        fill_routing_replay(
            self.model, microbatches, done.layout,
            data_pad_size_multiplier=int(getattr(args, "data_pad_size_multiplier", 1) or 1),
            sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
            allgather_cp=bool(getattr(args, "allgather_cp", False)),
            measure=done.health,
        )
        rollout_data.pop("rollout_routed_experts", None)  # as slime's fill: the arrays are not needed again
        if key == "metadata":  # nor the records; metadata holding nothing else goes (log_rollout_data averages lists)
            rollout_data["metadata"] = [{k: v for k, v in m.items() if k != RECORD_KEY} for m in rollout_data["metadata"]]
            if not any(rollout_data["metadata"]):
                del rollout_data["metadata"]
        for iterator in data_iterator:
            iterator.reset()

    method._r3_slime_original = original
    method._r3_slime_install = done
    method.__name__ = "fill_routing_replay"
    method.__qualname__ = "MegatronTrainRayActor.fill_routing_replay"
    return method


def _carries_records(rollout_data: Any) -> bool:
    metadata = rollout_data.get("metadata") if hasattr(rollout_data, "get") else None
    if not metadata:
        return False
    has = [isinstance(m, Mapping) and RECORD_KEY in m for m in metadata]
    if any(has) and not all(has):
        raise RecordError(
            f"{sum(has)} of {len(has)} samples carry a record in metadata[{RECORD_KEY!r}]; every sample of a "
            f"rollout needs one (or none, for slime's rollout_routed_experts)"
        )
    return all(has)


def _record_of(wire: Any) -> RoutingRecord:
    return wire if isinstance(wire, RoutingRecord) else RoutingRecord.from_wire(wire)


def _train_one_step_with_health(original: Any):
    """slime's ``model.train_one_step`` (every rank, every step), then that step's R3 health summed over
    data-parallel ranks into the loss dict it returns on the last pipeline stage, which ``model.train`` turns
    into ``log_dict["train/r3/..."]`` and logs through ``logging_utils.log``."""

    @functools.wraps(original)
    def train_one_step(args, rollout_id, step_id, data_iterator, model, *rest, **kwargs):
        out = original(args, rollout_id, step_id, data_iterator, model, *rest, **kwargs)
        counts = step_health(model, args)
        if counts is None:
            return out
        loss_dict, grad_norm = out
        from megatron.core import parallel_state as mpu

        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            loss_dict = {**loss_dict, **counts.metrics("r3/")}
        return loss_dict, grad_norm

    train_one_step._r3_slime_health = True
    train_one_step._r3_slime_original = original
    return train_one_step
