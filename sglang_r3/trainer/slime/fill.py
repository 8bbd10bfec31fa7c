"""The drop-in for slime's ``MegatronTrainRayActor.fill_routing_replay`` (THUDM/slime 624b824): every sample
checked, rows prepared as slime prepares them (``layer_rows``), each decoder MoE router's own ``routing_replay``
given its layer's rows. slime's own fill records rows into ``RoutingReplay.all_routing_replays`` by list
position, which MTP routers break; here routers are bound by identity (``binding.bind``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang_r3.core.layout import ROLE_DENSE, ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord
from sglang_r3.trainer.routers import pack_microbatches
from sglang_r3.trainer.discovery import as_chunks
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.model_check import model_config
from sglang_r3.trainer.packing import TokenLayout, layer_major, pack_rows
from sglang_r3.trainer.slime.binding import bind
from sglang_r3.trainer.slime.measure import measure_slime_compute_topk
from sglang_r3.trainer.validate import check_expert_ids, check_record, sample_token_ids


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
        return layer_rows(samples, tokens, layout, token_layout, layer_ids,
                          weight_version=weight_version, allow_mixed_versions=allow_mixed_versions)

    prepared = pack_microbatches(microbatches, prepare, "fill_routing_replay", what="samples")
    if measure:
        measure_slime_compute_topk()  # refuses (slime's function not found) before any replay is touched
    for s in binding.decoder + binding.mtp:
        s.router.routing_replay.clear()
    for p in prepared:
        for i, s in enumerate(binding.decoder):
            s.router.routing_replay.record(p.rows[i])
    binding.arm(measure, [p.real for p in prepared])
    return SlimeFill(
        microbatches=len(prepared),
        rows=tuple(int(p.rows.shape[1]) for p in prepared),
        replayed_layers=tuple(layer_ids),
        live_mtp_layers=tuple(s.layer_id for s in binding.mtp),
        digests_checked=all(p.checked for p in prepared),
        measured=bool(measure),
    )


class LayerRows(NamedTuple):
    """One microbatch as slime's preparation gives it to the layers asked for."""

    rows: torch.Tensor  # [layers, rows on this rank, topk]: each layer one compact block (the records' uint8/uint16)
    checked: bool  # every sample's token digest was checked (False: some sample was an upstream int32 array)
    real: Optional[np.ndarray]  # per row, True for a record row, False for a pad row; None without MoE layers


def layer_rows(
    samples: Sequence[Any],
    tokens: Sequence[Any],
    layout: ModelLayout,
    token_layout: TokenLayout,
    layer_ids: Sequence[int],
    *,
    weight_version: Optional[str] = None,
    allow_mixed_versions: bool = False,
) -> LayerRows:
    """One microbatch, checked, as ``[len(layer_ids), rows on this rank, topk]``: exactly the rows slime's
    preparation gives each of those layers (any subset of the MoE layers, in any order), with whether every
    sample's token digest was checked and the rows' pad mask."""
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
        return LayerRows(torch.empty((0, 0, layout.topk), dtype=torch.uint8), checked, None)
    packed = pack_rows(per_sample, layout.num_experts, token_layout, pad_layers=(layer_ids, layout.num_hidden_layers))
    return LayerRows(torch.from_numpy(layer_major(packed.experts)), checked, packed.real)


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
