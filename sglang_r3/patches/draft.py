"""Wire MTP-draft capture into SGLang 0.5.23's EAGLE v2 worker.

* The draft ModelRunner's ``forward`` runs under the capturer's draft guard
  (any main-row write from inside it raises and is counted), then files the
  staged draft routing per request.
* ``EagleDraftWorker.draft`` numbers the draft-decode forwards of a round
  (step 1..S-1); draft-extend forwards are step 0.
* ``EAGLEWorkerV2.forward_batch_generation`` resolves the round's drafts as
  accepted or rejected from the verify's ``accept_lens``.
* ``ReqToTokenPool.free_rows`` drops draft entries of a freed request slot (finished requests
  were collected before; aborted and retracted ones never are).
"""

from __future__ import annotations

import contextvars
import logging

import torch

from sglang_r3.capture.draft import MTP_WANTED_KEY, DraftCapturer
from sglang_r3.patches.runtime import capturer as _capturer

logger = logging.getLogger(__name__)

_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_POOL = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool"

# Draft-decode forward counter within the current EagleDraftWorker.draft() call.
_draft_step: contextvars.ContextVar = contextvars.ContextVar("sglang_r3_draft_step", default=None)


def attach_draft_runner(cap, runner, routers, max_tokens: int) -> None:
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
        # Only requests that asked for the MTP section (marked by server/routes.py) get entries filed.
        per_request=True,
    )
    from sglang_r3.patches.hooks import check_instance

    original_forward = runner.forward
    check_instance("sglang.srt.model_executor.model_runner.ModelRunner.forward", original_forward)

    def forward(forward_batch, *args, **kwargs):
        cap.enter_draft_forward()
        try:
            out = original_forward(forward_batch, *args, **kwargs)
        finally:
            cap.exit_draft_forward()
        _file_forward(cap.draft, forward_batch, bool(getattr(out, "can_run_graph", False)))
        return out

    runner.forward = forward
    logger.info("sglang-r3 draft capture: %d MTP router(s) at draft layer ids %s", len(routers), layer_ids)


def _file_forward(draft: DraftCapturer, fb, graph_replay: bool) -> None:
    mode = fb.forward_mode
    cap = _capturer()
    if mode.is_idle() or not (cap is not None and cap.capture_mtp) or not draft.has_staged(graph_replay):
        # Nothing routed by an MTP router (idle batch, or capture mode without MTP): skip the bookkeeping.
        draft.drop_staged()
        return
    pool = fb.req_pool_indices.tolist()
    n_tokens = int(fb.input_ids.shape[0])
    counter = _draft_step.get()
    if mode.is_decode() or (counter is not None and not mode.is_extend(include_draft_extend_v2=True)):
        per_req = n_tokens // max(len(pool), 1)  # topk rows per request in a draft-decode step
        rows = valid = [per_req] * len(pool)
        counter[0] += 1
        step = counter[0]
    else:
        lens = getattr(fb, "extend_seq_lens_cpu", None)
        rows = list(lens) if lens is not None else fb.extend_seq_lens.tolist()
        accept = getattr(fb.spec_info, "num_accept_tokens", None)
        # Draft-extend after a verify pads every request to num_draft_tokens rows; only accepted ones are real.
        valid = accept.tolist() if isinstance(accept, torch.Tensor) else rows
        step = 0
    draft.file_forward(pool, rows, valid, fb.positions, fb.input_ids, step, graph_replay=graph_replay)


def draft_around(original, self, batch, *args, **kwargs):
    token = _draft_step.set([0])
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        _draft_step.reset(token)


def forward_batch_generation_after(result, self, batch, *args, **kwargs):
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


def free_rows_after(result, self, indices, *args, **kwargs):
    # A finished request was collected before its row is freed; an aborted or retracted one never
    # is, and its draft entries must not outlive it (nor reach the row's next request).
    cap = _capturer()
    if cap is not None and cap.draft is not None and indices:
        cap.draft.forget(indices)
    return result


def alloc_after(result, self, reqs, *args, **kwargs):
    # A request gets its row here (again after a retraction): note whether it asked for the MTP section.
    cap = _capturer()
    if cap is not None and cap.draft is not None and result is not None:
        for r in reqs:
            params = getattr(r.sampling_params, "custom_params", None) or {}
            cap.draft.set_wanted(r.kv.req_pool_idx, bool(params.get(MTP_WANTED_KEY)))
    return result


def install_draft_patches() -> None:
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_r3.patches.hooks import register

    register(f"{_EAGLE}.EagleDraftWorker.draft", draft_around, HookType.AROUND)
    register(
        f"{_EAGLE}.EAGLEWorkerV2.forward_batch_generation", forward_batch_generation_after, HookType.AFTER
    )
    register(f"{_POOL}.free_rows", free_rows_after, HookType.AFTER)
    register(f"{_POOL}.alloc", alloc_after, HookType.AFTER)
