"""Test stand-in for slime's R3 replay: slime is not on PyPI, so its semantics are re-implemented here.

Written (not copied) from the public source of THUDM/slime at commit 624b824 (2026-08-21):

* ``slime/utils/routing_replay.py``: ``RoutingReplay`` (class-wide ``all_routing_replays`` in registration
  order, ``record`` keeping a compact host copy, ``pop_forward`` / ``pop_backward`` with their own cursors,
  ``clear*``, ``assert_all_consumed``), ``register_routing_replay`` (one replay per router plus a
  forward-pre-hook that makes it current), ``get_routing_replay_compute_topk`` (``ROUTING_REPLAY_STAGE``:
  ``fallthrough`` routes live, ``record`` routes live and records, ``replay_forward`` / ``replay_backward``
  pop and gather) and the ordered top-k capture it calls through.
* ``docker/patch/latest/megatron.patch``, its two R3 hunks: in ``megatron/core/transformer/moe/moe_utils.py``
  ``topk_routing_with_score_function`` wraps its ``compute_topk`` with ``get_routing_replay_compute_topk``;
  in ``megatron/core/transformer/moe/router.py`` ``TopKRouter.__init__`` ends with
  ``register_routing_replay(self)``. ``install()`` applies both to the installed megatron-core: the first as
  a source patch of the real function (the hunk's two lines, verbatim), the second by running them after
  the real ``__init__`` (the hunk adds them as its last statement, which ``install`` checks).
* ``slime/backends/megatron_utils/cp_utils.py``: ``_pad_routed_experts``, ``slice_with_cp``,
  ``prepare_routed_experts_for_routing_replay``.
* ``slime/backends/megatron_utils/actor.py``: ``fill_routing_replay`` (the positional loop) and the
  ``ROUTING_REPLAY_STAGE`` sequence of ``train_actor``; ``model.py``: the stage switch in
  ``train_one_step``'s ``forward_step`` and the per-head MTP loss logging of ``train``.

Deviations, all forced by running without a GPU or without slime: host copies are pinned only when CUDA
is available (``pin_memory`` needs a driver), ``accelerator.current_device()`` is the CPU then, and the
module answers to ``slime.utils.routing_replay`` only while installed (so the hunk's own import line runs).
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import types
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.nn.functional as F

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"


def _current_device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


# -- slime/utils/routing_replay.py ------------------------------------------------------------------------

ROUTING_REPLAY = None  # the replay of the router whose forward is running (set by the pre-forward hook)
ORDERED_TOPK_CAPTURE_ROUTER = None  # only set by slime's DeepEP alignment bridge; None on the R3 path


def set_routing_replay(replay) -> None:
    global ROUTING_REPLAY
    ROUTING_REPLAY = replay


def _capture_ordered_topk(top_indices) -> None:
    if ORDERED_TOPK_CAPTURE_ROUTER is not None:
        ORDERED_TOPK_CAPTURE_ROUTER._slime_ordered_topk_indices = top_indices


def _compute_topk_for_current_router(old_compute_topk, scores, topk, num_groups=None, group_topk=None):
    if ORDERED_TOPK_CAPTURE_ROUTER is not None and not group_topk:
        return torch.topk(scores, k=topk, dim=1, sorted=False)
    return old_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)


class RoutingReplay:
    all_routing_replays: List["RoutingReplay"] = []
    lazy_resources: List[Any] = []

    def __init__(self):
        self.forward_index = 0
        self.backward_index = 0
        self.top_indices_list: List[Any] = []
        RoutingReplay.all_routing_replays.append(self)

    def record(self, top_indices) -> None:
        if hasattr(top_indices, "materialize_for_routing_replay"):
            self.top_indices_list.append(top_indices)
            return
        if top_indices.device.type == "cpu" and top_indices.is_pinned() and top_indices.is_contiguous():
            self.top_indices_list.append(top_indices)
            return
        # A compact host copy, so a layer's strided view does not keep the whole batch array alive.
        buf = torch.empty_like(top_indices, device="cpu", pin_memory=torch.cuda.is_available())
        buf.copy_(top_indices)
        self.top_indices_list.append(buf)

    @staticmethod
    def assert_all_consumed() -> None:
        errors = []
        for i, replay in enumerate(RoutingReplay.all_routing_replays):
            n = len(replay.top_indices_list)
            if replay.forward_index != n or replay.backward_index != n:
                errors.append(
                    f"router={i}: forward={replay.forward_index}, backward={replay.backward_index}, recorded={n}"
                )
        if errors:
            raise RuntimeError("R3 routing replay was not consumed exactly once: " + "; ".join(errors[:16]))

    def _pop(self, index: int, stage: str):
        top_indices = self.top_indices_list[index]
        if hasattr(top_indices, "materialize_for_routing_replay"):
            return top_indices.materialize_for_routing_replay(stage)
        return top_indices.to(_current_device(), dtype=torch.int32, non_blocking=top_indices.is_pinned())

    def pop_forward(self):
        out = self._pop(self.forward_index, "forward")
        self.forward_index += 1
        return out

    def pop_backward(self):
        out = self._pop(self.backward_index, "backward")
        self.backward_index += 1
        return out

    def clear(self) -> None:
        self.forward_index = 0
        self.backward_index = 0
        self.top_indices_list = []

    def clear_forward(self) -> None:
        self.forward_index = 0

    @staticmethod
    def clear_all() -> None:
        for replay in RoutingReplay.all_routing_replays:
            replay.clear()
        for resource in RoutingReplay.lazy_resources:
            resource.close()
        RoutingReplay.lazy_resources = []

    @staticmethod
    def clear_all_forward() -> None:
        for replay in RoutingReplay.all_routing_replays:
            replay.clear_forward()


def get_routing_replay_compute_topk(old_compute_topk):
    def compute_topk(scores, topk, num_groups=None, group_topk=None):
        if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            stage = os.environ["ROUTING_REPLAY_STAGE"]
            if stage in ("fallthrough", "record"):
                probs, top_indices = _compute_topk_for_current_router(
                    old_compute_topk, scores, topk, num_groups=num_groups, group_topk=group_topk
                )
                if stage == "record":
                    ROUTING_REPLAY.record(top_indices)
            elif stage in ("replay_forward", "replay_backward"):
                if stage == "replay_forward":
                    top_indices = ROUTING_REPLAY.pop_forward()
                else:
                    top_indices = ROUTING_REPLAY.pop_backward()
                assert top_indices.shape[0] == scores.shape[0] and top_indices.shape[1] == topk, (
                    f"top_indices shape {top_indices.shape} does not match scores shape {scores.shape} and topk {topk}"
                )
                probs = scores.gather(1, top_indices)
            # slime has no else branch: any other stage leaves probs unbound (UnboundLocalError).
        else:
            probs, top_indices = _compute_topk_for_current_router(
                old_compute_topk, scores, topk, num_groups=num_groups, group_topk=group_topk
            )
        _capture_ordered_topk(top_indices)
        return probs, top_indices

    return compute_topk


def register_routing_replay(module) -> None:
    if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
        module.routing_replay = RoutingReplay()

        def pre_forward_hook(*args, **kwargs):
            set_routing_replay(module.routing_replay)

        module.register_forward_pre_hook(pre_forward_hook)


# -- docker/patch/latest/megatron.patch: the two R3 hunks, applied to the installed megatron-core ---------

_TOPK_HUNK_CONTEXT = "scores, topk, num_groups, group_topk, _compute_topk\n            )\n\n"
_TOPK_HUNK_ANCHOR = '    if score_function == "softmax":\n'
_TOPK_HUNK = (
    "    from slime.utils.routing_replay import get_routing_replay_compute_topk\n"
    "    compute_topk = get_routing_replay_compute_topk(compute_topk)\n\n"
)
_ROUTER_HUNK_CONTEXT = "            self.router_replay = RouterReplay()\n"

ORIGINAL_TOPK_ROUTING: Callable = None  # megatron's own topk_routing_with_score_function (the oracle's)


def _patched_topk_routing(moe_utils) -> Callable:
    fn = moe_utils.topk_routing_with_score_function
    lines, first = inspect.getsourcelines(fn)
    src = "".join(lines)
    at = src.index(_TOPK_HUNK_ANCHOR)
    if src.count(_TOPK_HUNK_ANCHOR) != 1 or not src[:at].endswith(_TOPK_HUNK_CONTEXT):
        raise RuntimeError("megatron.patch moe_utils hunk does not apply to this megatron-core")
    tree = ast.parse(src[:at] + _TOPK_HUNK + src[at:])
    ast.increment_lineno(tree, first - 1)
    ns: Dict[str, Any] = {}
    exec(compile(tree, inspect.getsourcefile(fn), "exec"), moe_utils.__dict__, ns)
    return ns[fn.__name__]


def install() -> Callable[[], None]:
    """Answer to ``slime.utils.routing_replay`` and apply both R3 hunks; returns the undo.

    Routers built while ``ENABLE_ROUTING_REPLAY=1`` is set get their ``routing_replay`` (as in slime's
    training actors, whose environment slime sets from ``--use-routing-replay``)."""
    global ORIGINAL_TOPK_ROUTING
    from megatron.core.transformer.moe import moe_utils, router

    names = ("slime", "slime.utils", "slime.utils.routing_replay")
    saved_modules = {n: sys.modules.get(n) for n in names}
    pkg, utils = types.ModuleType("slime"), types.ModuleType("slime.utils")
    pkg.__path__, utils.__path__ = [], []
    pkg.utils, utils.routing_replay = utils, sys.modules[__name__]
    sys.modules.update({"slime": pkg, "slime.utils": utils, "slime.utils.routing_replay": sys.modules[__name__]})

    ORIGINAL_TOPK_ROUTING = moe_utils.topk_routing_with_score_function
    patched = _patched_topk_routing(moe_utils)
    moe_utils.topk_routing_with_score_function = patched
    router.topk_routing_with_score_function = patched  # router.py imported the name

    init = router.TopKRouter.__init__
    if not inspect.getsource(init).endswith(_ROUTER_HUNK_CONTEXT):
        raise RuntimeError("megatron.patch router hunk does not apply: TopKRouter.__init__ ends differently")

    def patched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        from slime.utils.routing_replay import register_routing_replay

        register_routing_replay(self)

    router.TopKRouter.__init__ = patched_init

    def undo() -> None:
        moe_utils.topk_routing_with_score_function = ORIGINAL_TOPK_ROUTING
        router.topk_routing_with_score_function = ORIGINAL_TOPK_ROUTING
        router.TopKRouter.__init__ = init
        for n, m in saved_modules.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m

    return undo


# -- slime/backends/megatron_utils/cp_utils.py -------------------------------------------------------------

def _pad_routed_experts(experts: torch.Tensor, pad: int, num_experts: int) -> torch.Tensor:
    if pad == 0:
        return experts
    _, num_layers, topk = experts.shape
    fill = torch.arange(pad * num_layers * topk, device=experts.device, dtype=experts.dtype)
    return torch.cat([experts, (fill % num_experts).reshape(pad, num_layers, topk)], dim=0)


def slice_with_cp(tokens: torch.Tensor, pad_value) -> torch.Tensor:
    from megatron.core import parallel_state as mpu

    cp_rank, cp_size = mpu.get_context_parallel_rank(), mpu.get_context_parallel_world_size()
    if cp_size == 1:
        return tokens
    chunk = (len(tokens) + 2 * cp_size - 1) // (2 * cp_size)
    pad = 2 * cp_size * chunk - len(tokens)
    if callable(pad_value):
        tokens = pad_value(tokens, pad)
    else:
        tokens = F.pad(tokens, (0, 0) * (tokens.dim() - 1) + (0, pad), value=pad_value)
    first = tokens[chunk * cp_rank : chunk * (cp_rank + 1)]
    second = tokens[chunk * (2 * cp_size - cp_rank - 1) : chunk * (2 * cp_size - cp_rank)]
    return torch.cat([first, second])


def prepare_routed_experts_for_routing_replay(
    rollout_routed_experts: Sequence[torch.Tensor],
    tokens: Sequence[torch.Tensor],
    *,
    num_experts: int,
    data_pad_size_multiplier: int = 1,
    sequence_parallel: bool = False,
    allgather_cp: bool = False,
) -> torch.Tensor:
    from megatron.core import parallel_state as mpu

    assert len(rollout_routed_experts) == len(tokens)
    for experts, ids in zip(rollout_routed_experts, tokens):
        assert experts.shape[0] == ids.shape[0] - 1, f"{experts.shape}, {ids.shape}"
    padded = [_pad_routed_experts(e, 1, num_experts) for e in rollout_routed_experts]
    pad_size = mpu.get_tensor_model_parallel_world_size() * data_pad_size_multiplier
    if allgather_cp:
        x = torch.cat(padded, dim=0)
        cp_size, cp_rank = mpu.get_context_parallel_world_size(), mpu.get_context_parallel_rank()
        whole = cp_size * pad_size
        x = _pad_routed_experts(x, (whole - x.size(0) % whole) % whole, num_experts)
        x = x.chunk(cp_size, dim=0)[cp_rank]
    else:
        x = torch.cat([slice_with_cp(e, lambda t, p: _pad_routed_experts(t, p, num_experts)) for e in padded], dim=0)
        x = _pad_routed_experts(x, (pad_size - x.size(0) % pad_size) % pad_size, num_experts)
    if sequence_parallel:
        tp_rank, tp_size = mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size()
        assert x.size(0) % tp_size == 0
        per = x.size(0) // tp_size
        x = x[per * tp_rank : per * (tp_rank + 1)]
    return x


# -- slime/backends/megatron_utils/actor.py fill_routing_replay: the positional loop ---------------------

def slime_positional_fill(model_chunks: Sequence[Any], microbatches: Sequence[tuple], num_experts: int) -> None:
    """microbatches[m] = (rollout_routed_experts, tokens): upstream int32 [T-1, num_layers, topk] per sample.

    Records each MoE layer's column into ``RoutingReplay.all_routing_replays`` by list position and ends
    with slime's ``assert routing_replay_offset == len(RoutingReplay.all_routing_replays)``."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    for routed, tokens in microbatches:
        x = prepare_routed_experts_for_routing_replay(routed, tokens, num_experts=num_experts)
        offset_in_list = 0
        for vp_stage, chunk in enumerate(model_chunks):
            config = getattr(chunk, "module", chunk).config
            n = get_num_layers_to_build(config, vp_stage=vp_stage)
            first = get_transformer_layer_offset(config, vp_stage=vp_stage)
            for layer_id in range(first, first + n):
                freq = config.moe_layer_freq
                if isinstance(freq, int):
                    if layer_id % freq != 0:
                        continue
                elif isinstance(freq, list):
                    assert len(freq) == config.num_layers
                    if freq[layer_id] == 0:
                        continue
                RoutingReplay.all_routing_replays[offset_in_list].record(x[:, layer_id])
                offset_in_list += 1
        assert offset_in_list == len(RoutingReplay.all_routing_replays)


# -- model.py train: per-head MTP loss logging -----------------------------------------------------------

def slime_mtp_log(num_microbatches: int, role_tag: str = "") -> Dict[str, float]:
    """The ``train/mtp_{i}_loss`` and ``train/mtp_loss`` entries slime logs after a step (tracker cleaned)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    values = tracker["values"]
    if tracker.get("reduce_group") is not None:
        torch.distributed.all_reduce(values, group=tracker.get("reduce_group"))
    if tracker.get("avg_group") is not None:
        torch.distributed.all_reduce(values, group=tracker["avg_group"], op=torch.distributed.ReduceOp.AVG)
    mtp_losses = tracker["values"] * (1 / num_microbatches)
    MTPLossLoggingHelper.clean_loss_in_tracker()
    log = {f"train/{role_tag}mtp_{i + 1}_loss": mtp_losses[i].item() for i in range(mtp_losses.shape[0])}
    log[f"train/{role_tag}mtp_loss"] = mtp_losses.sum().item()
    return log
