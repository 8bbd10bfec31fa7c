"""MTP-draft capture wired into SGLang 0.5.23's EAGLE v2 workers: draft forwards run under the draft guard and
file their routing; draft-decode forwards are numbered; the verify's ``accept_lens`` resolve the round's
drafts; a freed request row drops its entries. Multi-layer MTP (one draft runner per depth, draft-extend
only) files each runner as its depth and resolves drafts at the next verify.
"""

from __future__ import annotations

import contextvars
import logging

import torch

from sglang_r3.serving.capture.draft import MTP_WANTED_KEY, DraftCapturer
from sglang_r3.seam import release
from sglang_r3.seam.hooks import check_instance, register
from sglang_r3.serving.adapter.runtime import capturer as _capturer

logger = logging.getLogger(__name__)

_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_ML_EAGLE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
_REQ_TO_TOKEN_POOL = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool"

# Draft-decode forward counter within the current EagleDraftWorker.draft() call.
_draft_step: contextvars.ContextVar = contextvars.ContextVar("sglang_r3_draft_step", default=None)


def attach_draft_runner(cap, runner, routers, max_tokens: int) -> None:
    if getattr(runner, "draft_model_idx", None) is not None:  # multi-layer EAGLE: one runner per depth
        _attach_multi_layer_runner(cap, runner, routers, int(runner.draft_model_idx), max_tokens)
        return
    layer_ids = sorted({m.layer_id for m in routers})
    depth_of_layer = {lid: d + 1 for d, lid in enumerate(layer_ids)}
    if len(layer_ids) > max(1, cap.layout.num_mtp_layers):
        raise RuntimeError(
            f"sglang-r3: draft model has routers at {len(layer_ids)} layer ids {layer_ids} but the layout "
            f"declares {cap.layout.num_mtp_layers} MTP layer(s)"
        )
    cap.draft = DraftCapturer(
        {id(m.topk_config): depth_of_layer[m.layer_id] for m in routers},
        topk=cap.topk,
        dtype=cap.dtype,
        max_tokens=max_tokens,
        device=cap.device,
        # Only requests that asked for the MTP section (marked by server/request.py) get entries filed.
        per_request=True,
    )
    _guard_draft_forward(cap, runner, _file_forward)
    logger.info("sglang-r3 draft capture: %d MTP router(s) at draft layer ids %s", len(routers), layer_ids)


def _guard_draft_forward(cap, runner, file_forward) -> None:
    """The draft runner's forward, on this one live runner: inside the draft guard (a main write from it
    raises), then its staged routing filed by ``file_forward``."""
    original_forward = runner.forward
    check_instance("sglang.srt.model_executor.model_runner.ModelRunner.forward", original_forward)

    def forward(forward_batch, *args, **kwargs):
        cap.enter_draft_forward()
        try:
            out = original_forward(forward_batch, *args, **kwargs)
        finally:
            cap.exit_draft_forward()
        file_forward(cap.draft, forward_batch, bool(getattr(out, "can_run_graph", False)))
        return out

    runner.forward = forward


def _attach_multi_layer_runner(cap, runner, routers, idx: int, max_tokens: int) -> None:
    depth = idx + 1
    mtp = cap.layout.mtp_layers
    if depth > len(mtp):
        raise RuntimeError(
            f"sglang-r3: multi-layer EAGLE draft runner {idx} runs MTP depth {depth}, but the layout declares "
            f"{len(mtp)} MTP layer(s)"
        )
    if bool(routers) != mtp[depth - 1].has_router:
        raise RuntimeError(
            f"sglang-r3: multi-layer EAGLE draft runner {idx} has {len(routers)} MoE router(s), but the layout "
            f"says MTP layer {mtp[depth - 1].id} (depth {depth}) is {'MoE' if mtp[depth - 1].has_router else 'dense'}"
        )
    if idx == 0 or cap.draft is None:
        if idx != 0 or cap.draft is not None:
            raise RuntimeError(f"sglang-r3: multi-layer EAGLE draft runners attached out of order (runner {idx})")
        cap.draft = DraftCapturer(
            {},
            topk=cap.topk,
            dtype=cap.dtype,
            max_tokens=max_tokens,
            device=cap.device,
            per_request=True,
            num_depths=len(mtp),
            chain=True,
        )
    cap.draft.add_routers({id(m.topk_config): depth for m in routers})
    _guard_draft_forward(cap, runner, _file_chain_forward)
    logger.info("sglang-r3 draft capture: multi-layer MTP depth %d, %d router(s)", depth, len(routers))


def _file_chain_forward(draft: DraftCapturer, fb, graph_replay: bool) -> None:
    mode = fb.forward_mode
    cap = _capturer()
    if mode.is_idle() or not (cap is not None and cap.capture_mtp) or not draft.has_staged(graph_replay):
        draft.drop_staged()
        return
    if getattr(fb.spec_info, "num_front_tokens", 0):
        # The boundary-KV window (SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX) puts front rows before the verified
        # window; refused at start-up (refusals/startup.py), so this is never reached.
        raise RuntimeError("sglang-r3: multi-layer MTP draft-extend with boundary-KV front rows is not captured")
    bs = fb.batch_size  # DP-attention padding appends dummy requests (pool index 0) after the real ones
    pool = fb.req_pool_indices.tolist()[:bs]
    lens = getattr(fb, "extend_seq_lens_cpu", None)
    rows = (list(lens) if lens is not None else fb.extend_seq_lens.tolist())[:bs]
    accept = getattr(fb.spec_info, "num_accept_tokens", None)
    # After a verify every request has num_draft_tokens rows; its accepted tokens (bonus included) are
    # the verified window. After a prefill the whole chunk is.
    valid = accept.tolist()[:bs] if isinstance(accept, torch.Tensor) else rows
    draft.file_forward(pool, rows, valid, fb.positions, fb.input_ids, 0, graph_replay=graph_replay)


def resolve_multi_layer_drafts(original, self, batch, *args, **kwargs):
    cap = _capturer()
    draft = cap.draft if cap is not None else None
    if draft is None or not draft.chain:
        return original(self, batch, *args, **kwargs)
    if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
        # A prefill (chunk): drafts filed by an earlier chunk of these requests were never verified.
        if draft.has_pending():
            draft.drop_pending(batch.req_pool_indices.tolist())
        return original(self, batch, *args, **kwargs)
    # This call's verify resolves the drafts filed before it; its own draft-extend files the next round's.
    held = draft.take_pending()
    result = original(self, batch, *args, **kwargs)
    accept = getattr(result, "accept_lens", None)
    if held and accept is not None:
        # accept_lens counts the bonus token the target adds after the accepted drafts.
        draft.resolve_round(batch.req_pool_indices.tolist(), (accept.to("cpu") - 1).tolist(), pending=held)
    else:
        draft.round += 1  # nothing of an earlier round to resolve (no request asked for the MTP section)
    return result


def _file_forward(draft: DraftCapturer, fb, graph_replay: bool) -> None:
    mode = fb.forward_mode
    cap = _capturer()
    if mode.is_idle() or not (cap is not None and cap.capture_mtp) or not draft.has_staged(graph_replay):
        # Nothing routed by an MTP router (idle batch, or capture mode without MTP): skip the bookkeeping.
        draft.drop_staged()
        return
    # DP-attention padding appends dummy requests (pool index 0) and tokens after the real ones; the
    # batch size and positions are restored after the forward, input ids are not.
    bs = fb.batch_size
    pool = fb.req_pool_indices.tolist()[:bs]
    n_tokens = int(fb.positions.shape[0])
    counter = _draft_step.get()
    if mode.is_decode() or (counter is not None and not mode.is_extend(include_draft_extend_v2=True)):
        per_req = n_tokens // max(len(pool), 1)  # topk rows per request in a draft-decode step
        rows = valid = [per_req] * len(pool)
        counter[0] += 1
        step = counter[0]
    else:
        lens = getattr(fb, "extend_seq_lens_cpu", None)
        rows = (list(lens) if lens is not None else fb.extend_seq_lens.tolist())[:bs]
        accept = getattr(fb.spec_info, "num_accept_tokens", None)
        # Draft-extend after a verify pads every request to num_draft_tokens rows; only accepted ones are real.
        valid = accept.tolist()[:bs] if isinstance(accept, torch.Tensor) else rows
        step = 0
    draft.file_forward(pool, rows, valid, fb.positions, fb.input_ids, step, graph_replay=graph_replay)


def guard_and_number_draft_steps(original, self, batch, *args, **kwargs):
    token = _draft_step.set([0])
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        _draft_step.reset(token)


def resolve_drafts_with_accept_lens(result, self, batch, *args, **kwargs):
    cap = _capturer()
    accept = getattr(result, "accept_lens", None)
    if cap is None or cap.draft is None or accept is None or batch.forward_mode.is_extend():
        return result
    if not cap.draft.has_pending():
        # Nothing drafted this round was filed (MTP capture off): no reason to read accept_lens on the
        # host, which would wait for the verify inside the overlap scheduler's forward step.
        return result
    # accept_lens counts the bonus token the target adds after the accepted drafts.
    cap.draft.resolve_round(batch.req_pool_indices.tolist(), (accept.to("cpu") - 1).tolist())
    return result


def drop_drafts_of_freed_rows(result, self, indices, *args, **kwargs):
    # A finished request was collected before its row is freed; an aborted or retracted one never
    # is, and its draft entries must not outlive it (nor reach the row's next request).
    cap = _capturer()
    if cap is not None and cap.draft is not None and indices:
        cap.draft.forget(indices)
    return result


def drop_drafts_of_freed_request(self, req, *args, **kwargs):
    # 0.5.15: ReqToTokenPool.free(req) clears req.req_pool_idx, so its row is read before.
    cap = _capturer()
    if cap is not None and cap.draft is not None and req.req_pool_idx is not None:
        cap.draft.forget([req.req_pool_idx])
    return None


def start_rows_without_drafts(result, self, reqs, *args, **kwargs):
    # A request gets its row here (again after a retraction): note whether it asked for the MTP section.
    cap = _capturer()
    if cap is not None and cap.draft is not None and result is not None:
        for r in reqs:
            params = getattr(r.sampling_params, "custom_params", None) or {}
            cap.draft.start_row(release.req_pool_idx(r), r.rid, bool(params.get(MTP_WANTED_KEY)))
    return result


def install_draft_patches() -> None:  # called once, by install_capture_patches
    register(f"{_EAGLE}.EagleDraftWorker.draft", guard_and_number_draft_steps, "around")
    register(f"{_EAGLE}.EAGLEWorkerV2.forward_batch_generation", resolve_drafts_with_accept_lens, "after")
    register(f"{_ML_EAGLE}.MultiLayerEagleWorkerV2.forward_batch_generation", resolve_multi_layer_drafts, "around")
    if release.req_pool_frees_rows():
        register(f"{_REQ_TO_TOKEN_POOL}.free_rows", drop_drafts_of_freed_rows, "after")
    else:
        register(f"{_REQ_TO_TOKEN_POOL}.free", drop_drafts_of_freed_request, "before")
    register(f"{_REQ_TO_TOKEN_POOL}.alloc", start_rows_without_drafts, "after")
