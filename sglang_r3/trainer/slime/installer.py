"""slime's extension points (THUDM/slime 624b824), no edit to slime, on both sides of a run.

Trainer side, ``--custom-megatron-init-path sglang_r3.trainer.slime.install``: ``install(args)`` puts
``fill.fill_routing_replay`` in place of ``MegatronTrainRayActor.fill_routing_replay``, refuses settings under which
replay would silently not happen, checks every sample of the rollout data it is given (``sample_problems``), and
with ``SGLANG_R3_HEALTH`` on wraps ``model.train_one_step`` so each step's health (``ranks.step_health``) joins
slime's ``train/...`` log.

Rollout side, ``--rollout-function-path sglang_r3.trainer.slime.generate_rollout`` (``RolloutManager``,
``slime/ray/rollout.py``): slime's own ``slime.rollout.sglang_rollout.generate_rollout`` with two additions.
Before it runs, ``watch_responses()`` wraps slime's ``Sample._apply_meta_info`` (``slime/utils/types.py``, which
reads every /generate response's ``meta_info`` and keeps of R3's only ``routed_experts`` and ``weight_version``)
once per process, so a response's ``routing_error`` is kept on the sample too (``Sample.r3_routing_errors``;
``Sample.to_dict`` / ``from_dict`` carry it). After a training rollout, ``check_rollout`` refuses it, naming each
sample whose routing cannot be replayed by slime's index, the code and the fix: a response with ``routing_error``
(``sglang_r3.core.codes.ROUTING_ERROR_CODES``), no rows, rows != tokens - 1, another layer count or top-k than the
layout of ``--hf-checkpoint``, or more than one weight version. Without it, slime's
``_convert_samples_to_train_data`` meets such a rollout with ``torch.as_tensor(None)``, or, when the first sample
has no rows, drops every sample's rows (the installed fill then says so, without the code). Evaluation rollouts
are not checked (nothing of them is replayed). A rollout function of your own calls ``watch_responses()`` before
generating and ``check_rollout(args, samples, rollout_id)`` after.

What slime can check of a sample without our record: it keeps, per sample, upstream's ``rollout_routed_experts``
(int32 ``[T-1, num_layers, topk]``), its ``tokens`` and one ``weight_versions`` entry per finished /generate
response. That is the identity there is to check: rows = tokens - 1, the layout's layer count and top-k, one
weight version (the last on the rollout side only: ``weight_versions`` does not reach the trainer).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from sglang_r3.core import settings
from sglang_r3.core.codes import ROUTING_ERROR_CODES
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
ROLLOUT_FUNCTION_PATH = "sglang_r3.trainer.slime.generate_rollout"
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
    step's counts, summed over data-parallel ranks, enter that step's ``log_dict`` as ``train/r3/...``. Before
    anything is replayed, the fill checks every sample of slime's ``rollout_routed_experts`` (rows = tokens - 1,
    the layout's layer count and top-k) and refuses with ``SlimeSampleError`` naming each by slime's sample index;
    a rollout_data without them is refused saying why (the first sample had no rows: ``routing_error``) and that
    ``--rollout-function-path sglang_r3.trainer.slime.generate_rollout`` names the sample and its code.

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
        if key not in rollout_data:
            raise RecordError(_NO_ROWS)
        if key == "rollout_routed_experts":
            _check_samples(rollout_data, done.layout)
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


_NO_ROWS = (
    "rollout_routed_experts is required in rollout_data when use_rollout_routing_replay is set (slime's message). "
    "R3 (slime): slime's ray/rollout.py keeps the rollout's routed_experts only when its first sample has them "
    "(samples[0].rollout_routed_experts), so at least that sample came back from /generate without routed_experts: "
    f"its response carried routing_error (one of {', '.join(ROUTING_ERROR_CODES)}), or its request did not ask "
    "for it (a --custom-generate-function-path function without return_routed_experts). slime keeps no "
    f"routing_error on the sample: run the rollout with --rollout-function-path {ROLLOUT_FUNCTION_PATH} to have "
    "each such sample refused by its index with the code and the fix (docs/slime.md)"
)


def _check_samples(rollout_data: Mapping[str, Any], layout: ModelLayout) -> None:
    """Every sample of this rank's rollout_data, as slime can check it without a record (rows = tokens - 1, the
    layout's layer count and top-k), named by slime's sample index before anything is replayed."""
    routed, tokens = rollout_data["rollout_routed_experts"], rollout_data.get("tokens") or []
    indices = rollout_data.get("sample_indices")
    if indices is None or len(indices) != len(routed):
        indices = [f"#{j} (position on this rank)" for j in range(len(routed))]
    if len(tokens) != len(routed):
        raise RecordError(f"rollout_data has {len(routed)} rollout_routed_experts for {len(tokens)} token sequences")
    problems = [p for j, (r, t) in enumerate(zip(routed, tokens))
                for p in sample_problems(indices[j], len(t), r, layout)]
    if problems:
        raise SlimeSampleError(problems, len(routed), "this data-parallel rank's rollout_data")


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


# -- what slime can check of a sample without our record, and how a refused sample is named --------------------

# The fix for each routing_error code, as docs/api.md#routing_errorcode and docs/troubleshooting.md give it.
ROUTING_ERROR_FIXES = {
    "missing_rows": "some of its KV was computed by a forward that did not capture (capture switched off, then back "
                    "on; the prefix cache keeps such KV): POST /flush_cache and regenerate; if it recurs with capture "
                    "on and a flushed cache, report it with the server's log",
    "capture_off": "capture is switched off (POST /routing/capture {\"mode\": \"off\"}): switch it back on "
                   "({\"mode\": \"main\"} or \"main+mtp\"), POST /flush_cache (the prefix cache keeps the missing "
                   "marks until that KV is recomputed) and regenerate",
    "image_attention": "Gemma-4 image prompts are not served exactly on a GPU: train on text prompts, or on the "
                       "CPU runtime raise --chunked-prefill-size above the prompt (docs/models.md)",
    "mtp_drafted_on_prefill": "PD disaggregation: the prefill engine sent no MTP draft routing for the prompt (its "
                              "request did not ask for the MTP section): ask both engines for it (the same body, or "
                              "--r3-default-routing main+mtp on both), or for main rows only, and regenerate",
    "store_full": "fleet: fetch (and so release) records faster, or raise --store-max-records / --store-max-bytes; "
                  "then regenerate",
    "store_unavailable": "fleet: check its Ray cluster (the message has the store's error); then regenerate",
    "engine_restarted": "fleet: regenerate through the gateway (the engine that computed it was restarted)",
    "duplicate": "fleet: give every request its own rid; then regenerate",
}
_UNKNOWN_FIX = "see docs/troubleshooting.md for this code; regenerate the sample"

# Codes of what the identity lacks (not routing_error codes: nothing the server sent names these).
NO_ROWS, ROWS, SHAPE, WEIGHT_VERSIONS = "no_routed_experts", "rows", "shape", "weight_versions"
_LISTED = 8  # problems spelled out in one message; the rest are counted, their samples listed


@dataclass(frozen=True)
class SampleProblem:
    """One refused sample: slime's index, the code (a routing_error code or one of NO_ROWS, ROWS, SHAPE,
    WEIGHT_VERSIONS), what is wrong, and the fix."""

    index: Any
    code: str
    detail: str
    fix: str

    def describe(self) -> str:
        return f"sample {self.index} [{self.code}]: {self.detail}. Fix: {self.fix}"


class SlimeSampleError(RecordError):
    """Samples of a slime rollout whose routing cannot be replayed; ``problems`` names each (slime's sample
    index, code, fix). Raised before anything is replayed."""

    def __init__(self, problems: Sequence[SampleProblem], total: int, where: str):
        self.problems = tuple(problems)
        samples = list(dict.fromkeys(p.index for p in self.problems))
        shown = "; ".join(p.describe() for p in self.problems[:_LISTED])
        rest = len(self.problems) - _LISTED
        more = f"; and {rest} more (samples {samples})" if rest > 0 else ""
        super().__init__(
            f"R3 (slime): {len(samples)} of {total} samples of {where} cannot be replayed (slime's sample index, "
            f"the code, the fix): {shown}{more}"
        )


def routing_error_problem(index: Any, error: Any) -> SampleProblem:
    """The problem of a response whose meta_info carried ``routing_error`` (a malformed one still counts)."""
    if not isinstance(error, Mapping):
        error = {"code": "unknown", "message": str(error)}
    code = str(error.get("code") or "unknown")
    missing, rows = error.get("missing_rows"), error.get("rows")
    count = f" ({missing} of {rows} rows missing)" if isinstance(missing, int) and isinstance(rows, int) else ""
    message = error.get("message") or "no message"
    return SampleProblem(
        index, code,
        f"its /generate response carried routing_error {code}{count}, so it has no routed_experts: {message}",
        ROUTING_ERROR_FIXES.get(code, _UNKNOWN_FIX),
    )


def sample_problems(
    index: Any,
    num_tokens: int,
    routed: Any,
    layout: ModelLayout,
    *,
    errors: Iterable[Any] = (),
    weight_versions: Sequence[Any] = (),
    shaped_by: Optional[Tuple[Any, Any]] = None,
    mixed_versions: bool = False,
) -> List[SampleProblem]:
    """Why a sample's routing cannot be replayed (empty: it can). errors: the routing_error of each of its
    responses; routed: its ``rollout_routed_experts`` (None when slime kept none); weight_versions: slime's
    ``Sample.weight_versions``; shaped_by: slime's ``(--num-layers, --moe-router-topk)``, which it reshapes
    the array with (named in the message when given); mixed_versions: slime's --partial-rollout was given, so a
    sample resumed under new weights is the user's choice (each row is still what its own forward routed, as a
    ``mixed:`` record under allow_mixed_versions)."""
    out = [routing_error_problem(index, e) for e in errors]
    if not out:
        out += _rows_problems(index, num_tokens, routed, layout, shaped_by)
    versions = list(dict.fromkeys(str(v) for v in weight_versions))
    if len(versions) > 1 and not mixed_versions:
        out.append(SampleProblem(
            index, WEIGHT_VERSIONS,
            f"it was generated under weight versions {versions} (slime records one per finished /generate "
            f"response): its tokens and routing span a weight update, so no one policy routed it",
            "regenerate it under one version; if resuming aborted requests under new weights is intended, pass "
            "slime's --partial-rollout (then such samples are accepted: each row is what its own forward routed)",
        ))
    return out


def _rows_problems(index, num_tokens, routed, layout, shaped_by) -> List[SampleProblem]:
    if routed is None:
        return [SampleProblem(
            index, NO_ROWS,
            "it has no routed_experts, and no /generate response of it carried routing_error",
            "send return_routed_experts with every /generate request of a training sample (slime's generate "
            "does under --use-rollout-routing-replay; a --custom-generate-function-path function must too), to "
            "a rollout server started with SGLANG_R3_ENABLED=1",
        )]
    shape = _shape(routed)
    L, k = layout.num_hidden_layers, layout.topk
    if len(shape) != 3 or shape[1:] != (L, k):
        args = (f"; slime reshapes the array with --num-layers {shaped_by[0]} and --moe-router-topk {shaped_by[1]}"
                if shaped_by is not None else "")
        return [SampleProblem(
            index, SHAPE,
            f"routed_experts has shape {shape}, but the layout of --hf-checkpoint ({layout.architecture}, "
            f"{layout.fingerprint}) has {L} layers and top-{k}: [T-1, {L}, {k}] expected{args}",
            f"train the checkpoint the rollout serves, with --num-layers {L} --moe-router-topk {k}",
        )]
    if shape[0] != num_tokens - 1:
        cause = ("tokens were appended after the last /generate response that returned routing (tool or "
                 "environment tokens added without meta_info), or a later turn came back without routed_experts"
                 if shape[0] < num_tokens - 1 else
                 "the tokens were cut after the routing was returned")
        return [SampleProblem(
            index, ROWS,
            f"routed_experts has {shape[0]} rows, but the sample has {num_tokens} tokens ({num_tokens - 1} rows "
            f"expected, one per token but the last): {cause}",
            "keep sample.tokens exactly the tokens the last /generate request and its completion covered (end a "
            "multi-turn sample with a generated turn, or send routed_experts_start_len so each turn's rows join)",
        )]
    return []


def _shape(routed: Any) -> Tuple[int, ...]:
    shape = getattr(routed, "shape", None)
    if shape is None:
        shape = np.shape(routed)
    return tuple(int(s) for s in shape)


# -- the rollout side: --rollout-function-path sglang_r3.trainer.slime.generate_rollout ----------------------------

SLIME_TYPES_MODULE = "slime.utils.types"
SLIME_ROLLOUT_MODULE = "slime.rollout.sglang_rollout"
ERRORS_ATTR = "r3_routing_errors"  # on slime's Sample: the routing_error of each of its responses
_META_PARAMS = ("self", "args", "meta_info")


def watch_responses() -> None:
    """Keep each /generate response's ``routing_error`` on slime's sample: wraps ``Sample._apply_meta_info``
    once per process (idempotent). Raises ``SlimeInstallError`` when this slime has no such method."""
    try:
        module = importlib.import_module(SLIME_TYPES_MODULE)
    except ImportError as e:
        raise SlimeInstallError(f"{SLIME_TYPES_MODULE} does not import ({e}); is slime installed in this process?")
    cls = getattr(module, "Sample", None)
    fn = getattr(cls, "_apply_meta_info", None)
    if getattr(fn, "_r3_watching", False):
        return
    try:
        params = tuple(inspect.signature(fn).parameters) if callable(fn) else ()
    except (TypeError, ValueError):
        params = ()
    if params[: len(_META_PARAMS)] != _META_PARAMS:
        raise SlimeInstallError(
            f"{SLIME_TYPES_MODULE}.Sample has no _apply_meta_info{_META_PARAMS} (slime 624b824's, which reads each "
            f"/generate response's meta_info): {ROLLOUT_FUNCTION_PATH} cannot see a response's routing_error"
        )

    @functools.wraps(fn)
    def _apply_meta_info(self, args, meta_info, *rest, **kwargs):
        error = meta_info.get("routing_error") if isinstance(meta_info, Mapping) else None
        if error is not None:
            self.__dict__.setdefault(ERRORS_ATTR, []).append(dict(error) if isinstance(error, Mapping) else error)
        return fn(self, args, meta_info, *rest, **kwargs)

    _apply_meta_info._r3_watching = True
    _apply_meta_info._r3_slime_original = fn
    cls._apply_meta_info = _apply_meta_info


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's ``--rollout-function-path``: slime's own ``generate_rollout``, each training rollout checked
    (``check_rollout``) before slime converts it. Raises ``SlimeSampleError`` naming every refused sample."""
    try:
        slimes = importlib.import_module(SLIME_ROLLOUT_MODULE).generate_rollout
    except (ImportError, AttributeError) as e:
        raise SlimeInstallError(f"{SLIME_ROLLOUT_MODULE}.generate_rollout is not there ({e}); is slime installed?")
    replaying = bool(getattr(args, "use_rollout_routing_replay", False))
    if replaying:
        watch_responses()
    output = slimes(args, rollout_id, data_source, evaluation=evaluation)
    if replaying and not evaluation:
        check_rollout(args, getattr(output, "samples", output), rollout_id)
    return output


def check_rollout(args: Any, samples: Any, rollout_id: Any = None) -> None:
    """Refuse a training rollout (slime's nested lists of ``Sample``) where some sample's routing cannot be
    replayed, naming each by slime's index with the code and the fix; before anything of it is converted."""
    flat = list(_leaves(samples))
    layout = rollout_layout(args)
    shaped_by = (getattr(args, "num_layers", None), getattr(args, "moe_router_topk", None))
    problems = []
    for pos, s in enumerate(flat):
        index = s.index if getattr(s, "index", None) is not None else f"#{pos} (no index)"
        problems += sample_problems(
            index, len(s.tokens), s.rollout_routed_experts, layout,
            errors=getattr(s, ERRORS_ATTR, None) or (), weight_versions=getattr(s, "weight_versions", None) or (),
            shaped_by=shaped_by, mixed_versions=bool(getattr(args, "partial_rollout", False)),
        )
    if problems:
        raise SlimeSampleError(problems, len(flat), f"rollout {rollout_id}")


def rollout_layout(args: Any) -> ModelLayout:
    """The layout of ``--hf-checkpoint`` (the model the rollout serves), read once per path."""
    path = getattr(args, "hf_checkpoint", None)
    if not path:
        raise SlimeInstallError(f"{ROLLOUT_FUNCTION_PATH}: --hf-checkpoint is not set (the layout is read from its "
                                f"config.json)")
    return _layout(str(path))


@functools.lru_cache(maxsize=None)
def _layout(path: str) -> ModelLayout:
    from sglang_r3.core.layout import layout_from_model_path

    try:
        return layout_from_model_path(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SlimeInstallError(f"{ROLLOUT_FUNCTION_PATH}: cannot read the model layout from --hf-checkpoint "
                                f"{path}/config.json: {e}")


def _leaves(node: Any) -> Iterator[Any]:
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from _leaves(item)
    else:
        yield node

