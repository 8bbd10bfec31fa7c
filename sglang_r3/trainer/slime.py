"""slime's R3 replay by identity: the drop-in for ``MegatronTrainRayActor.fill_routing_replay`` (THUDM/slime
624b824), and ``install(args)`` for slime's ``--custom-megatron-init-path``. slime's own fill records rows into
``RoutingReplay.all_routing_replays`` by list position, which MTP routers break; here each decoder MoE router's
own ``routing_replay`` gets its layer's rows, prepared as slime prepares them, and each MTP router routes live
by running its forward under slime's ``fallthrough`` stage (a replay object is never shown the scores).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang_r3.core.layout import ROLE_DENSE, ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord
from sglang_r3.core import settings
from sglang_r3.trainer.core import (
    LiveRouting,
    RouterBinding,
    RouterState,
    current_meter,
    measured_compute_topk,
    pack_microbatches,
)
from sglang_r3.trainer.discovery import RouterSite, as_chunks
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.health import HealthCounts
from sglang_r3.trainer.model_check import model_config
from sglang_r3.trainer.packing import TokenLayout, layer_major, pack_rows
from sglang_r3.trainer.validate import check_expert_ids, check_record, sample_token_ids

logger = logging.getLogger(__name__)

STAGE_ENV = "ROUTING_REPLAY_STAGE"
ENABLE_ENV = "ENABLE_ROUTING_REPLAY"
LIVE_STAGE = "fallthrough"
REPLAY_FORWARD = "replay_forward"
_REPLAY_STAGES = (REPLAY_FORWARD, "replay_backward")
SLIME_REPLAY_MODULE = "slime.utils.routing_replay"


@dataclass(frozen=True)
class SlimeFill:
    """What ``fill_routing_replay`` recorded on this rank."""

    microbatches: int
    rows: Tuple[int, ...]  # rows recorded into every decoder replay, per microbatch
    replayed_layers: Tuple[int, ...]  # decoder MoE layers on this rank, each given its own rows
    live_mtp_layers: Tuple[int, ...]  # MTP layers on this rank, routing live under every stage
    digests_checked: bool  # False when some sample came as an upstream int32 array (no token digest)
    measured: bool = False  # measure=True: the training forwards count flips for health(model)


def fill_routing_replay(
    model: Any,
    microbatches: Sequence[Tuple[Sequence[Any], Sequence[Any]]],
    layout: ModelLayout,
    *,
    weight_version: Optional[str] = None,
    allow_mixed_versions: bool = False,
    data_pad_size_multiplier: int = 1,
    allgather_cp: bool = False,
    sequence_parallel: Optional[bool] = None,
    token_layout: Optional[TokenLayout] = None,
    measure: bool = False,
) -> SlimeFill:
    """Record every microbatch's rows into each decoder MoE router's own slime ``routing_replay``.

    model: slime's ``self.model`` (the list of model chunks, one per virtual pipeline stage, DDP-wrapped
    or not) or one module. microbatches[m] = ``(samples, tokens)`` of microbatch m in the order slime's
    data iterator yields them (``sum(num_microbatches)`` of them, as slime's own fill loop takes them);
    tokens[i] are sample i's token ids (prompt + completion). samples[i] is either

    * a ``RoutingRecord`` (``return_routing`` in the rollout): checked against the layout fingerprint,
      the MoE layers, row count, the digest of tokens[i] (so records of other samples are refused) and,
      when ``weight_version`` is given, the weights it was routed with; or
    * slime's upstream ``rollout_routed_experts`` entry (int32 ``[T-1, num_hidden_layers, topk]``, dense
      layers zero; tensor or array) with the layout from ``/routing/layout``: its MoE columns are taken,
      its shape, row count, zero dense columns, id ranges and distinct ids per row are checked. Such an
      array carries no token digest and no weight version: nothing proves it belongs to tokens[i]
      beyond its row count, and it is refused when ``weight_version`` is given.

    Every sample of every microbatch is checked before any replay is touched. The replays this fills
    (decoder and MTP on this rank) are cleared first, so a repeated call replaces rather than appends;
    slime's ``RoutingReplay.clear_all()`` after the step stays as it is. The model must match the layout
    (layers, MoE layers, top-k, experts, MTP count) and every decoder router must carry slime's
    ``routing_replay`` (the megatron patch adds it to routers built while ``ENABLE_ROUTING_REPLAY=1``).

    data_pad_size_multiplier, allgather_cp, sequence_parallel: slime's arguments of the same names
    (sequence_parallel defaults to the model config's); token_layout overrides all of them and the
    TP/CP ranks read from megatron's parallel_state.

    measure: live R3 health, read with ``health(model)`` once per training step. Counted: each decoder
    MoE router's training forwards (module in train mode) under ``ROUTING_REPLAY_STAGE=replay_forward``,
    i.e. slime's ``train_one_step`` forward_step, once per record row and layer; pad rows (slime's one
    per sample, CP/TP padding) are not. Not counted: the log-prob pass (``compute_log_prob`` runs in
    eval mode; it replays the same rows as the training forward, so counting both would count every
    row twice and a per-step read in ``train`` would hold the whole rollout's log-prob pass), the ref
    and teacher passes (``fallthrough``: nothing is replayed), and an activation recompute in the
    backward (``replay_backward``; it routes the same inputs again). MTP routers count the rows they
    route live in the same training forwards, apart. A fill without ``measure`` stops the counting.
    """
    chunks = as_chunks(model)
    binding = bind(chunks, layout)
    if token_layout is None:
        token_layout = TokenLayout.from_megatron(
            sequence_parallel, data_pad_size_multiplier, allgather_cp, config=model_config(chunks, binding.decoder)
        )
    layer_ids = [s.layer_id for s in binding.decoder]

    def prepare(samples, tokens):
        return _prepared_rows(samples, tokens, layout, token_layout, layer_ids,
                              weight_version=weight_version, allow_mixed_versions=allow_mixed_versions)

    prepared = pack_microbatches(microbatches, prepare, "fill_routing_replay", what="samples")
    if measure:
        _measure_slime_compute_topk()  # refuses (slime's function not found) before any replay is touched
    for s in binding.decoder + binding.mtp:
        s.router.routing_replay.clear()
    for rows, _, _ in prepared:
        for i, s in enumerate(binding.decoder):
            s.router.routing_replay.record(rows[i])
    binding.arm(measure, [real for _, real, _ in prepared])
    return SlimeFill(
        microbatches=len(prepared),
        rows=tuple(int(rows.shape[1]) for rows, _, _ in prepared),
        replayed_layers=tuple(layer_ids),
        live_mtp_layers=tuple(s.layer_id for s in binding.mtp),
        digests_checked=all(checked for _, _, checked in prepared),
        measured=bool(measure),
    )


def layer_rows(
    samples: Sequence[Any],
    tokens: Sequence[Any],
    layout: ModelLayout,
    token_layout: TokenLayout,
    layer_ids: Sequence[int],
    *,
    weight_version: Optional[str] = None,
    allow_mixed_versions: bool = False,
) -> Tuple[torch.Tensor, bool]:
    """One microbatch, checked, as ``[len(layer_ids), rows on this rank, topk]`` (each layer one compact
    block, the records' uint8/uint16): exactly the rows slime's preparation gives each of those layers.
    Returns the rows and whether every sample's token digest was checked."""
    rows, _, checked = _prepared_rows(
        samples, tokens, layout, token_layout, layer_ids,
        weight_version=weight_version, allow_mixed_versions=allow_mixed_versions,
    )
    return rows, checked


def _prepared_rows(
    samples: Sequence[Any],
    tokens: Sequence[Any],
    layout: ModelLayout,
    token_layout: TokenLayout,
    layer_ids: Sequence[int],
    *,
    weight_version: Optional[str] = None,
    allow_mixed_versions: bool = False,
) -> Tuple[torch.Tensor, Optional[np.ndarray], bool]:
    """``layer_rows`` and the rows' pad mask (bool per row, True for record rows; None without MoE layers)."""
    if len(samples) != len(tokens):
        raise RecordError(f"{len(samples)} samples of routing for {len(tokens)} token sequences")
    if not len(samples):
        raise RecordError("a microbatch needs at least one sample")
    moe = layout.moe_layer_ids
    unknown = [l for l in layer_ids if l not in moe]
    if unknown:
        raise ReplayError(f"layers {unknown} are not MoE layers of layout {layout.fingerprint}")
    cols = [moe.index(l) for l in layer_ids]
    every = cols == list(range(len(moe)))
    if not cols:  # a pipeline stage without MoE layers: the samples are still checked, nothing is packed
        every = False
    per_sample, checked = [], True
    for i, (sample, ids) in enumerate(zip(samples, tokens)):
        ids = sample_token_ids(ids, i)
        if isinstance(sample, RoutingRecord):
            check_record(sample, layout, ids, i, weight_version, allow_mixed_versions)
            experts = sample.experts
        else:
            experts = upstream_moe_columns(sample, ids, layout, i, weight_version)
            checked = False
        per_sample.append(experts if every else experts[:, cols])
    if not cols:
        return torch.empty((0, 0, layout.topk), dtype=torch.uint8), None, checked
    packed = pack_rows(per_sample, layout.num_experts, token_layout, pad_layers=(layer_ids, layout.num_hidden_layers))
    return torch.from_numpy(layer_major(packed.experts)), packed.real, checked


def upstream_moe_columns(
    routed: Any, ids: np.ndarray, layout: ModelLayout, sample: int = 0, weight_version: Optional[str] = None
) -> np.ndarray:
    """Upstream SGLang's ``routed_experts`` of one sample (int32 ``[T-1, num_hidden_layers, topk]``, dense
    layers zero) -> its MoE columns ``[T-1, MoE layers, topk]`` in the layout's dtype, after checking it."""
    where = f"sample {sample}"
    if weight_version is not None:
        raise RecordError(
            f"{where}: an upstream routed_experts array carries no weight version, so nothing proves it was "
            f"routed with weight version {weight_version!r}; request records (return_routing) or pass "
            f"weight_version=None"
        )
    if hasattr(routed, "detach"):
        routed = routed.detach().cpu().numpy()
    a = np.asarray(routed)
    L, k = layout.num_hidden_layers, layout.topk
    want = (int(ids.shape[0]) - 1, L, k)
    if a.ndim != 3 or tuple(a.shape[1:]) != (L, k):
        raise RecordError(
            f"{where}: routed_experts has shape {tuple(a.shape)}, expected [T-1, {L}, {k}] "
            f"(num_hidden_layers, top-k of layout {layout.fingerprint})"
        )
    if a.shape[0] != want[0]:
        raise RecordError(
            f"{where}: routed_experts has {a.shape[0]} rows, but the sample has {want[0] + 1} tokens "
            f"(expected {want[0]} rows: one per token but the last)"
        )
    if a.dtype.kind not in "iu":
        raise RecordError(f"{where}: routed_experts has dtype {a.dtype}, expected integers")
    dense = [l.id for l in layout.layers if l.role == ROLE_DENSE]
    if dense and a.shape[0]:
        hit = np.flatnonzero(_columns(a, dense).reshape(a.shape[0], -1).any(axis=1))
        if hit.size:
            row = int(hit[0])
            layer = next(l for l in dense if a[row, l].any())
            raise RecordError(
                f"{where}: routed_experts names experts at row {row} of dense layer {layer}; upstream "
                f"SGLang leaves dense layers zero, so this array was not routed by a model of this layout"
            )
    moe = _columns(a, layout.moe_layer_ids)
    # Range first on the int32 view (two reductions), then everything else on the compact copy.
    if moe.size and (int(moe.min()) < 0 or int(moe.max()) >= min(l.num_experts for l in layout.moe_layers)):
        check_expert_ids(np.ascontiguousarray(moe), layout, where)
    experts = moe.astype(layout.expert_dtype)
    check_expert_ids(experts, layout, where)
    return experts


def _columns(a: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """a[:, ids]: a view when the ids are one run (GLM's MoE layers, its first dense layers), else a copy."""
    ids = list(ids)
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return a[:, ids[0] : ids[0] + len(ids)]
    return a[:, ids]


# -- binding -----------------------------------------------------------------------------------------------

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
    if stage not in _REPLAY_STAGES or os.environ.get(ENABLE_ENV, "0") != "1":
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


# -- live R3 health ------------------------------------------------------------------------------------------

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


def _measure_slime_compute_topk() -> None:
    """Wrap slime's ``get_routing_replay_compute_topk`` (once per process) so that the ``compute_topk``
    it builds also counts, through the core's ``measured_compute_topk``, in counted forwards.

    The megatron.patch hunk imports the function from its module at every call of
    ``topk_routing_with_score_function``, so the wrap reaches every router from the next forward on;
    routers without an armed meter (MTP, other models) are not affected."""
    module, get = _slime_compute_topk_factory()
    if getattr(get, "_r3_measuring", False):
        return

    @functools.wraps(get)
    def get_routing_replay_compute_topk(old_compute_topk):
        # old_compute_topk: megatron's own compute_topk at that call, the routing without replay.
        return measured_compute_topk(get(old_compute_topk), old_compute_topk, _counted_forward)

    get_routing_replay_compute_topk._r3_measuring = True
    module.get_routing_replay_compute_topk = get_routing_replay_compute_topk


def _slime_compute_topk_factory() -> Tuple[Any, Any]:
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
    return m is not None and m.training and _replaying_forward()


def _mtp_counted(router: Any) -> bool:
    """The same test for an MTP router, read before its live stage replaces the ambient one."""
    return bool(router.training) and _replaying_forward()


def _replaying_forward() -> bool:
    return os.environ.get(ENABLE_ENV, "0") == "1" and os.environ.get(STAGE_ENV) == REPLAY_FORWARD


# -- zero-edit install: slime's --custom-megatron-init-path ------------------------------------------------

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
    ``MegatronTrainRayActor.fill_routing_replay`` (looked up on the class by ``train_actor``) this module's
    ``fill_routing_replay``: decoder MoE routers replayed by identity from slime's ``rollout_routed_experts``
    (or records, where ``rollout_data["metadata"]`` carries them under ``"r3_routing"``), MTP routers live. With
    ``SGLANG_R3_HEALTH=1`` it also wraps ``model.train_one_step`` (called by name from ``model.train``) so each
    step's counts, summed over data-parallel ranks, enter that step's ``log_dict`` as ``train/r3/...``.

    Nothing happens (returns None) without ``--use-rollout-routing-replay``, and in an actor that slime does not
    replay in (it sets ``ENABLE_ROUTING_REPLAY=1`` for the actor role only, not the critic). Idempotent.
    Raises ``SlimeInstallError`` naming every problem: slime's class, method or function missing, or a setting
    under which the replay would silently not happen or not match the layout. A user with an init function of
    their own calls ``install(args)`` from it."""
    if not getattr(args, "use_rollout_routing_replay", False):
        logger.info("R3 (slime): --use-rollout-routing-replay is off; nothing installed")
        return None
    if os.environ.get(ENABLE_ENV, "0") != "1":
        logger.info("R3 (slime): %s is not 1 in this actor (slime sets it for the actor role only); nothing "
                    "installed", ENABLE_ENV)
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
            _slime_compute_topk_factory()  # wrapped below, once nothing is refused
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
        _measure_slime_compute_topk()
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


def step_health(model: Any, args: Any = None) -> Optional[HealthCounts]:
    """This step's counts on every rank, summed over the data-parallel group with context parallel (where
    slime reduces its own step metrics) and, under sequence parallel, over tensor-parallel ranks (each routes
    its own slice of rows). None where the last fill did not measure (no collective then: all ranks agree)."""
    binding = RouterBinding.of(model)
    if binding is None or not binding.measuring:
        return None
    return _sum_over_ranks(binding.read_health(True), bool(getattr(args, "sequence_parallel", False)))


def _sum_over_ranks(counts: HealthCounts, sequence_parallel: bool) -> HealthCounts:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return counts
    from megatron.core import parallel_state as mpu

    groups = [mpu.get_data_parallel_group(with_context_parallel=True)]
    if sequence_parallel and mpu.get_tensor_model_parallel_world_size() > 1:
        groups.append(mpu.get_tensor_model_parallel_group())
    groups = [g for g in groups if dist.get_world_size(g) > 1]
    if not groups:
        return counts
    n, m = len(counts.layers), len(counts.mtp_layers)
    flat = [*counts.compared, *counts.flipped, counts.rows, counts.tokens_flipped, *counts.mtp_rows]
    for g in groups:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(g) == "nccl" else "cpu"
        t = torch.tensor(flat, dtype=torch.int64, device=device)
        dist.all_reduce(t, group=g)
        flat = t.cpu().tolist()
    return HealthCounts(
        counts.layers, tuple(flat[:n]), tuple(flat[n : 2 * n]), flat[2 * n], flat[2 * n + 1],
        counts.mtp_layers, tuple(flat[2 * n + 2 : 2 * n + 2 + m]),
    )
