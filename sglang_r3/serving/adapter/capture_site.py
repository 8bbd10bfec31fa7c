"""Our capturer in SGLang 0.5.23 in place of upstream's (whose host buffer needs cudaHostRegister): the target
runner gets a ``RoutingCapturer``, draft runners their routers checked and attached to the MTP capturer, the
single capture site routes main and draft routers apart, request finish gathers rows into the payload, and
the counters reach ``/routing/stats``.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from sglang_r3.serving.capture import CaptureViolation, RoutingCapturer, encode_payload
from sglang_r3.serving.capture.capturer import CAPTURE_MODE_CODES
from sglang_r3.serving.capture.payload import PayloadBytes, RoutingUnavailable
from sglang_r3.serving.metrics import metrics
from sglang_r3.seam import release
from sglang_r3.serving.adapter import served_layout
from sglang_r3.serving.adapter.dp_rows import local_rows_fn
from sglang_r3.serving.adapter.gemma4_vision import image_attention_refusal
from sglang_r3.seam.hooks import register
from sglang_r3.serving.adapter.runtime import capturer as _capturer, layout_of
from sglang_r3.core import settings
from sglang_r3.core.record import token_digest

logger = logging.getLogger(__name__)

_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_TOPK_MOD = "sglang.srt.layers.moe.topk"
_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
_STATE_CONTROLLER = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
_SCHED = "sglang.srt.managers.scheduler.Scheduler"


def _router_layer_ids(model) -> list:
    return sorted(set(served_layout.router_layers(model).values()))


def install_our_capturer(original, self, *args, **kwargs):
    from sglang.srt.state_capturer.routed_experts import set_global_experts_capturer

    if not release.capture_requested(self):
        return original(self, *args, **kwargs)
    from sglang_r3.seam.hooks import verify_applied

    verify_applied()  # the scheduler's hooks all bound (seam/hooks.py), or this scheduler does not start
    if self.is_draft_worker:
        _init_draft_runner(self)
        return None
    layout = layout_of(self.model_config)
    _refuse_routers_that_skip_capture(self.model)
    live = _router_layer_ids(self.model)
    _number_unnumbered_routers(self.model)
    if live != list(layout.moe_layer_ids):
        raise RuntimeError(
            f"sglang-r3: {layout.architecture}: the layout built from the config says main MoE layers are "
            f"{list(layout.moe_layer_ids)}, but the loaded model has routers at layers {live}; refusing to capture "
            "mislabelled routing"
        )
    # Per router: the experts and top-k SGLang built are the layout's (adapter/served_layout.py).
    served_layout.check_main(self.model, layout)
    num_slots = release.kv_slot_capacity(self)
    cap = RoutingCapturer(layout, num_slots=num_slots, max_batch_tokens=max_forward_tokens(self), device=self.device)
    global _local_rows
    _local_rows = local_rows_fn(cap.max_tokens, layout.topk, self.device)
    set_global_experts_capturer(cap)
    _follow_kv_moves(cap, self.token_to_kv_pool)
    logger.info("sglang-r3 capture: %s, %d KV slots", layout.summary(), num_slots)
    return None


def _refuse_routers_that_skip_capture(model) -> None:
    """Fused runners that route inside their kernel (TRITON_KERNEL / BYPASSED outputs) never call the
    capture site. Eager forwards would be caught per forward (their rows invalidated), but a replayed
    CUDA graph cannot be: refuse at start-up, naming the backend flag."""
    from sglang.srt.layers.moe.topk import TopK, TopKOutputFormat

    layer_of = served_layout.router_layers(model)
    bad = sorted({
        (layer_of[id(m)], m.topk_config.output_format.name)
        for m in model.modules()
        if isinstance(m, TopK)
        and m.topk_config.allow_routed_experts_capture
        and m.topk_config.output_format not in (None, TopKOutputFormat.STANDARD)
    })
    if release.topk_format_decided_per_forward():
        # 0.5.15: a router without an output format picks it per forward from the MoE runner backend.
        from sglang.srt.layers.moe.utils import get_moe_runner_backend

        backend = get_moe_runner_backend()
        if any(getattr(backend, f"is_{name}")() for name in _IN_KERNEL_BACKENDS_0_5_15):
            bad += sorted({(layer_of[id(m)], f"decided per forward by --moe-runner-backend {backend.value}")
                           for m in model.modules() if isinstance(m, TopK) and m.topk_config.output_format is None
                           and m.topk_config.allow_routed_experts_capture})
    if bad:
        raise RuntimeError(
            f"sglang-r3: MoE routers {bad} (layer id, top-k output format) route inside a fused kernel and "
            "skip the routing capture site; choose another --moe-runner-backend"
        )


def max_forward_tokens(runner) -> int:
    """The most tokens one target forward can route, from the server's limits.

    The staging buffer is sized from this once: CUDA graphs keep writing into the
    storage they were recorded with, so it can never be replaced by a bigger one.
    """
    limits = release.forward_limits()
    per_req = (limits.speculative_num_draft_tokens or 1) if limits.speculative_algorithm else 1
    chunked = limits.chunked_prefill_size
    # Without chunked prefill the first request of a prefill batch may be as long as the context.
    prefill = chunked if chunked and chunked > 0 else runner.model_config.context_len
    # Under DP attention a rank's rows are its window of the gathered batch: its own tokens (MAX_LEN
    # padding pads to the longest rank, which is bounded the same way), rounded up to a multiple of the
    # attention-TP width (ForwardBatch.prepare_mlp_sync_batch).
    from sglang.srt.runtime_context import get_parallel

    return int(max(
        prefill,
        limits.max_prefill_tokens or 0,
        (runner.max_running_requests or 1) * per_req,
        limits.cutedsl_moe_max_num_tokens,
    )) + get_parallel().attn_tp_size - 1


def _follow_kv_moves(cap: RoutingCapturer, kv_pool) -> None:
    """Rows are keyed by KV slot, so a KV move (EAGLE tree drafting keeps accepted tokens' KV at
    new slots, ``move_accept_tokens_to_target_kvcache``) must move the rows with it."""
    from sglang_r3.seam.hooks import check_instance

    original = kv_pool.move_kv_cache
    check_instance("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.move_kv_cache", original)

    def move_kv_cache(tgt_loc, src_loc, *args, **kwargs):
        out = original(tgt_loc, src_loc, *args, **kwargs)
        cap.move_rows(src_loc, tgt_loc)
        return out

    kv_pool.move_kv_cache = move_kv_cache


def _init_draft_runner(runner) -> None:
    from sglang.srt.layers.moe.topk import TopK

    cap = _capturer()
    routers = [m for m in runner.model.modules() if isinstance(m, TopK)]
    leaking = [m.layer_id for m in routers if m.topk_config.allow_routed_experts_capture]
    if leaking:
        raise CaptureViolation(
            f"sglang-r3: draft model routers at layer ids {leaking} are allowed to write main routing rows; "
            "refusing to start (draft routing must never overwrite target rows)"
        )
    if cap is None:
        return
    # The draft model's routers are the layout's MTP layers: none where those are dense, their experts and
    # top-k where they route (adapter/served_layout.py).
    served_layout.check_draft(served_layout.routers_of(runner.model), cap.layout)
    from sglang_r3.serving.adapter import draft_site as draft_patch

    draft_patch.attach_draft_runner(cap, runner, routers, max_tokens=cap.max_tokens)


# 0.5.15's TopK.forward picks TRITON_KERNEL or BYPASSED (in-kernel routing) for these runner backends.
_IN_KERNEL_BACKENDS_0_5_15 = ("triton_kernels", "experimental_sgl_trtllm", "flashinfer_trtllm", "flashinfer_mxfp4")

# This rank's rows of a router's top-k under DP attention / DeepEP (adapter/dp_rows.py); None: the
# router's batch is this scheduler's own.
_local_rows = None

# id(topk_config) -> layer, for the main routers SGLang built without a layer id (0.5.15: its capture site
# then gets layer_id=None); filled once at start-up (served_layout.router_layers).
_unnumbered: dict = {}


def _number_unnumbered_routers(model) -> None:
    from sglang.srt.layers.moe.topk import TopK

    layer_of = served_layout.router_layers(model)
    _unnumbered.update({id(m.topk_config): layer_of[id(m)] for m in model.modules()
                        if isinstance(m, TopK) and m.layer_id is None})


def route_topk_to_capturers(topk_config, layer_id, topk_ids) -> None:
    cap = _capturer()
    if cap is None:
        from sglang.srt.state_capturer.routed_experts import get_global_experts_capturer

        if topk_config.allow_routed_experts_capture and (up := get_global_experts_capturer()) is not None:
            up.capture(layer_id=layer_id, topk_indices=topk_ids)
        return
    if topk_config.allow_routed_experts_capture:
        if layer_id is None and (layer_id := _unnumbered.get(id(topk_config))) is None:
            return  # a router start-up did not see: its column stays unseen, the forward's rows are invalidated
        if _local_rows is not None and (topk_ids := _local_rows(topk_ids)) is None:
            cap.stats.extra["foreign_layouts"] = cap.stats.extra.get("foreign_layouts", 0) + 1
            return  # its column stays unseen: the forward's rows are invalidated, not misfiled
        cap.capture(layer_id, topk_ids)
    elif cap.draft is not None and cap.capture_mtp:
        if _local_rows is not None and (topk_ids := _local_rows(topk_ids)) is None:
            cap.stats.extra["foreign_layouts"] = cap.stats.extra.get("foreign_layouts", 0) + 1
            cap.draft.refuse_forward()  # the forward files nothing: draft.forwards_refused in /routing/stats
            return
        cap.draft.capture(topk_config, topk_ids)


def collect_request_rows(original, self, req):
    cap = _capturer()
    if cap is None or not req.return_routed_experts:
        return original(self, req)
    tokens = list(req.origin_input_ids) + list(req.output_ids_through_stop)
    seqlen = len(tokens)
    start = min(req.routed_experts_start_len, max(seqlen - 1, 0))
    row = release.req_pool_idx(req)
    slots = self.req_to_token_pool.req_to_token[row][start : max(seqlen - 1, 0)]
    rows, missing = cap.rows_for_slots(slots)
    # PD decode engine: why the prompt's MTP entries did not arrive from the prefill engine (pd_rows.py), if so.
    not_carried = cap.draft.not_carried(row) if cap.draft is not None and cap.draft.wants(row) else None
    mtp = cap.draft.collect(row, seqlen, tokens) if cap.draft is not None else None
    error = None
    if missing:
        # Never hand out a row no target forward wrote: the request gets no rows and says why.
        code = "capture_off" if not cap.capture_main else "missing_rows"
        why = (
            "routing capture is switched off (POST /routing/capture)"
            if code == "capture_off"
            else "their KV was computed by a forward that did not capture routing"
        )
        error = RoutingUnavailable(code, f"{missing} of {rows.shape[0]} rows were never captured: {why}",
                                   missing, int(rows.shape[0]))
        cap.stats.extra["requests_refused"] = cap.stats.extra.get("requests_refused", 0) + 1
        rows = rows[:0]
    elif why := image_attention_refusal(cap.layout.architecture, settings.current().cpu, req):
        error = RoutingUnavailable("image_attention", why, int(rows.shape[0]), int(rows.shape[0]))
        cap.stats.extra["requests_refused"] = cap.stats.extra.get("requests_refused", 0) + 1
        rows = rows[:0]
    elif not_carried:
        # PD: the prompt's draft-extend ran on the prefill engine and its entries did not arrive. Never a short MTP
        # section.
        error = RoutingUnavailable(
            "mtp_drafted_on_prefill", f"the MTP section was asked for on a PD decode engine, but {not_carried}; "
            "ask the prefill engine for the MTP section too (the same body to both engines), or for main rows only",
            int(rows.shape[0]), int(rows.shape[0]))
        cap.stats.extra["requests_refused"] = cap.stats.extra.get("requests_refused", 0) + 1
        rows, mtp = rows[:0], None
    rows = rows.numpy()
    if rows.dtype == np.int16:
        rows = rows.view(np.uint16)
    payload = encode_payload(start, rows, mtp, tokens_digest=token_digest(tokens), error=error,
                             prefill_weight_version=getattr(req, release.PREFILL_VERSION_ATTR, None))
    req.routed_experts = PayloadBytes(payload)
    _export_counters(cap)
    return None


_exported = {"rows_captured": 0, "rows_invalidated": 0}


def _export_counters(cap: RoutingCapturer) -> None:
    """Hand the capturer's plain counters to Prometheus at request finish, not on the forward path."""
    m = metrics()
    if m is None:
        return
    for name, now in (("rows_captured", cap.stats.main_rows_written), ("rows_invalidated", cap.stats.rows_invalidated)):
        if now > _exported[name]:
            getattr(m, name).inc(now - _exported[name])
            _exported[name] = now


def add_capture_stats(result, self, *args, **kwargs):
    """After SGLang's get_internal_state (0.5.23: the controller's, ``self.scheduler``; 0.5.15: the Scheduler's)."""
    cap = _capturer()
    if cap is not None:
        state = result.internal_state
        from sglang.srt.runtime_context import get_parallel

        state["sglang_r3"] = {
            "layout": cap.layout.fingerprint,
            # Which scheduler answered: under DP attention /routing/stats lists one entry per DP rank, in no
            # fixed order.
            "dp_rank": int(get_parallel().attn_dp_rank),
            "mode": cap.mode,
            "host_bytes_per_slot": cap.host_bytes_per_slot(),
            "staging_tokens": int(cap.max_tokens),
            "staging_ptr": cap.staging_ptr(),
            **cap.stats.as_dict(),
            **({"draft": cap.draft.stats()} if cap.draft is not None else {}),
            # Read live by the scheduler loop (control requests are served between batches, and
            # while generation is paused), unlike /v1/loads' snapshot, which is only republished
            # after a batch: what a client needs to know its request is inside this engine now.
            "requests_held": _requests_held(self.scheduler if release.has_internal_state_controller() else self),
        }
    return result


def _requests_held(scheduler) -> int:
    # The running batch still lists the requests its last step finished until the next schedule.
    running = getattr(scheduler, "running_batch", None)
    held = sum(1 for r in running.reqs if not r.finished()) if running is not None else 0
    return held + len(getattr(scheduler, "waiting_queue", ()))


KNOB = "sglang_r3_capture"


def _knob_problem(value):
    if _capturer() is None:
        return "sglang-r3 capture is not active in this scheduler"
    if value not in CAPTURE_MODE_CODES:
        return f"{KNOB} must be one of {CAPTURE_MODE_CODES}, got {value!r}"
    return None


def _set_knob(value) -> None:
    _capturer().set_mode(CAPTURE_MODE_CODES[int(value)])


def add_capture_mode_knob(handlers, self, *args, **kwargs):
    """0.5.23: add the ``sglang_r3_capture`` knob to SGLang's /set_internal_state handlers."""
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected, _UpdateHandler

    def validate(key, value):
        why = _knob_problem(value)
        if why is not None:
            raise UpdateRejected(why)

    handlers[KNOB] = _UpdateHandler(validate, lambda key, value: _set_knob(value))
    return handlers


def take_capture_mode_knob(original, self, recv_req, *args, **kwargs):
    """0.5.15: Scheduler.set_internal_state allows three hard-coded keys; ours is taken out first and set here,
    all or nothing with the rest (a refused value applies nothing, as SGLang's own refusals)."""
    if KNOB not in (recv_req.server_args or {}):
        return original(self, recv_req, *args, **kwargs)
    rest = dict(recv_req.server_args)
    value = rest.pop(KNOB)
    why = _knob_problem(value)
    if why is not None:
        logger.warning("sglang-r3: /set_internal_state refused: %s", why)
        return _set_internal_state_output(False)
    if not rest:  # the original would reset speculative accept counters for an empty update
        _set_knob(value)
        return _set_internal_state_output(True)
    recv_req.server_args = rest
    out = original(self, recv_req, *args, **kwargs)
    if out.updated:
        _set_knob(value)
    return out


def _set_internal_state_output(updated: bool):
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    return SetInternalStateReqOutput(updated=updated, server_args={})  # the TokenizerManager reads .updated only


@functools.cache  # once per process, whichever process kinds install it
def install_capture_patches() -> None:
    register(f"{_MR}.init_routed_experts_capturer", install_our_capturer, "around")
    register(f"{_TOPK_MOD}.capture_routed_experts_if_allowed", route_topk_to_capturers, "replace")
    register(f"{_BRP}._maybe_collect_routed_experts", collect_request_rows, "around")
    if not release.has_internal_state_controller():  # the Scheduler's own methods
        register(f"{_SCHED}.get_internal_state", add_capture_stats, "after")
        register(f"{_SCHED}.set_internal_state", take_capture_mode_knob, "around")
    else:
        register(f"{_STATE_CONTROLLER}.get_internal_state", add_capture_stats, "after")
        register(f"{_STATE_CONTROLLER}._update_handlers", add_capture_mode_knob, "after")

    from sglang_r3.serving.adapter.draft_site import install_draft_patches

    install_draft_patches()
    # PD disaggregation: the prompt's rows travel with its KV (adapter/pd_rows.py)
    from sglang_r3.serving.adapter.pd_rows import install_pd_patches

    install_pd_patches()
    # A model fix, beside capture because it acts where the scheduler builds the model (adapter/gemma4_vision.py)
    from sglang_r3.serving.adapter.gemma4_vision import install_gemma4_vision_patch

    install_gemma4_vision_patch()
