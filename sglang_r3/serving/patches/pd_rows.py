"""Issue 54 experiment (``SGLANG_R3_ALLOW_PD_EXPERIMENT=1`` only): the prompt's rows travel with its KV.

The capturer's host rows ``[num_slots, n_moe, topk]`` and ``written`` flags ``[num_slots]`` are indexed by KV slot,
like the KV pages. Both engines append them to the KV transfer's state components right after SGLang's
``disaggregation.utils.setup_state_kv_args`` (called by ``PrefillBootstrapQueue._init_kv_manager`` and
``DecodePreallocQueue._init_kv_manager`` before the KV manager registers every ptr with the transfer engine), so
Mooncake registers them and, on the request's last chunk, writes the prefill engine's rows of the request's KV pages
into the decode engine's rows of its KV pages (``MooncakeKVManager.maybe_send_extra``, page-indexed generic path).

Carrier: ``StateType.BLOCK_SCALE``, whose payload on both sides is the request's full KV page ids
(``_full_kv_pages_payload``) and which Mooncake sends on the generic page-indexed path. A carrier for the
experiment, not a design: an MXFP8 KV pool has its own BLOCK_SCALE component (refused here), and a served version
needs its own state type (SGLang's enum and payload tables are closed). Layer ids make the layout flat (one region
per entry; plain MHA would otherwise split the entries into K and V halves).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

ROW_LAYER_IDS = [1_000_000, 1_000_001]  # pair the two entries on both peers (unsigned on the wire); not model layers


def _with_rows(original):
    @functools.wraps(original)
    def setup_state_kv_args(kv_args, token_to_kv_pool, *args, **kwargs):
        original(kv_args, token_to_kv_pool, *args, **kwargs)
        from sglang.srt.disaggregation.base.conn import StateType
        from sglang.srt.disaggregation.utils import append_state_component
        from sglang.srt.state_capturer.routed_experts import get_global_experts_capturer

        from sglang_r3.serving.capture.capturer import RoutingCapturer

        cap = get_global_experts_capturer()
        if not isinstance(cap, RoutingCapturer):
            raise RuntimeError("sglang-r3 PD experiment: no sglang-r3 capturer when the KV transfer is set up")
        if StateType.BLOCK_SCALE in kv_args.state_types:
            raise RuntimeError("sglang-r3 PD experiment: the KV pool has block scales of its own (BLOCK_SCALE)")
        page = token_to_kv_pool.page_size
        row = cap.host[0].numel() * cap.host.element_size()
        append_state_component(
            kv_args, StateType.BLOCK_SCALE,
            [cap.host.data_ptr(), cap.written.data_ptr()],
            [cap.host.numel() * cap.host.element_size(), cap.written.numel() * cap.written.element_size()],
            [row * page, cap.written.element_size() * page],
            layer_ids=list(ROW_LAYER_IDS),
        )
        logger.info("sglang-r3 PD experiment: capture rows registered with the KV transfer (%d B per slot)",
                    row + cap.written.element_size())

    return setup_state_kv_args


def _drop_drafts_of_freed_decode_request(self, req, *args, **kwargs):
    from sglang_r3.serving.patches import release
    from sglang_r3.serving.patches.runtime import capturer

    cap = capturer()
    if cap is not None and cap.draft is not None and release.req_pool_idx(req) is not None:
        cap.draft.forget([release.req_pool_idx(req)])
    return None


def install() -> None:
    from sglang.srt.disaggregation import decode, prefill

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_r3.serving.patches.draft import start_rows_without_drafts

    # A decode engine's request rows come from DecodeReqToTokenPool (not a ReqToTokenPool): the MTP opt-in of a
    # row (patches/draft.py's hooks on ReqToTokenPool.alloc / free_rows) is noted on it too. (Not in the
    # manifest: registered with SGLang's HookRegistry directly, for the experiment.)
    HookRegistry.register("sglang.srt.disaggregation.decode.DecodeReqToTokenPool.alloc", start_rows_without_drafts,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.disaggregation.decode.DecodeReqToTokenPool.free",
                          _drop_drafts_of_freed_decode_request, HookType.BEFORE)

    for module in (prefill, decode):
        if not getattr(module.setup_state_kv_args, "_r3_rows", False):
            module.setup_state_kv_args = _with_rows(module.setup_state_kv_args)
            module.setup_state_kv_args._r3_rows = True
