"""PD disaggregation (issue 54): the prompt's rows travel with its KV, from the prefill engine to the decode engine.

The capturer's host rows ``[num_slots, n_moe, topk]`` and ``written`` flags ``[num_slots]`` are indexed by KV slot,
like the KV pages. Both engines append them to the KV transfer's state components right after SGLang's
``disaggregation.utils.setup_state_kv_args`` (``PrefillBootstrapQueue._init_kv_manager`` and
``DecodePreallocQueue._init_kv_manager`` call it before the KV manager registers every buffer with the transfer
engine), so Mooncake registers them and, with the request's last chunk, writes the prefill engine's rows and marks of
the request's KV pages into the decode engine's rows and marks of its KV pages (``MooncakeKVManager.maybe_send_extra``,
the page-indexed generic state path). The decode engine's record then holds the rows the prefill engine's target
forward wrote: the marks travel with them, so a slot the prefill engine did not capture stays unmarked on the decode
engine (``missing_rows``), never zeros.

Carrier: ``StateType.BLOCK_SCALE``, whose payload on both sides is the request's full KV page ids
(``_full_kv_pages_payload``) and which every page-indexed transfer path sends as it sends KV. SGLang's state types are
a closed enum with closed payload tables, so the rows ride as a component of the one type whose payload is exactly the
request's KV pages and which a KV pool uses only for MXFP8 block scales: ``--kv-cache-dtype mxfp8`` is refused at
start-up (startup_checks.py), and a pool that has block scales all the same stops the transfer's set-up here. The
layer ids make the layout flat (one region per buffer; plain MHA would otherwise split the entries into K and V
halves) and pair the two buffers on both peers. SGLang's KV layout digest (``utils.kv_layout_digest``: state types and
item sizes) differs for a peer without our rows or with another row size, which SGLang refuses per transfer.

The decode engine's request rows come from ``DecodeReqToTokenPool``, not a ``ReqToTokenPool``: the MTP opt-in of a row
(patches/draft.py's hooks on ``ReqToTokenPool.alloc`` / ``free_rows``) is noted on it too.
"""

from __future__ import annotations

import logging

from sglang_r3.serving.patches import release
from sglang_r3.serving.patches.hooks import register
from sglang_r3.serving.patches.runtime import capturer as _capturer

logger = logging.getLogger(__name__)

ROW_LAYER_IDS = [1_000_000, 1_000_001]  # pair the two entries on both peers (unsigned on the wire); not model layers

_PREFILL = "sglang.srt.disaggregation.prefill"
_DECODE = "sglang.srt.disaggregation.decode"


class RowsCarrierTaken(RuntimeError):
    """The KV pool already sends a block-scale component: the rows' carrier is taken."""


def append_capture_rows(result, kv_args, token_to_kv_pool, *args, **kwargs):
    """After ``setup_state_kv_args`` (prefill and decode engine alike): the capture rows and their marks become one
    more state component of the KV transfer, one item per KV page."""
    from sglang.srt.disaggregation.base.conn import StateType
    from sglang.srt.disaggregation.utils import append_state_component

    cap = _capturer()
    if cap is None:
        raise RuntimeError("sglang-r3: PD disaggregation with no sglang-r3 capturer in this scheduler when its KV "
                           "transfer is set up: the prompt's rows could not travel with its KV")
    if any(list(ids) == ROW_LAYER_IDS for ids in kv_args.state_layer_ids):
        # Both targets name one function (prefill.py and decode.py import it from utils.py): SGLang's registry may
        # run this hook twice for one call.
        return result
    if StateType.BLOCK_SCALE in kv_args.state_types:
        raise RowsCarrierTaken(
            "sglang-r3: this KV pool sends per-block scales (an MXFP8 KV cache, --kv-cache-dtype mxfp8) as the KV "
            "transfer's block_scale component, the one the prompt's routing rows travel in under PD "
            "disaggregation; serve PD with another --kv-cache-dtype")
    page = int(token_to_kv_pool.page_size)
    row = cap.host[0].numel() * cap.host.element_size()
    mark = cap.written.element_size()
    append_state_component(
        kv_args, StateType.BLOCK_SCALE,
        [cap.host.data_ptr(), cap.written.data_ptr()],
        [cap.host.numel() * cap.host.element_size(), cap.written.numel() * mark],
        [row * page, mark * page],
        layer_ids=list(ROW_LAYER_IDS),
    )
    logger.info("sglang-r3 PD: the capture rows travel with the KV transfer (%d B per KV slot)", row + mark)
    return result


def drop_drafts_of_freed_decode_request(self, req, *args, **kwargs):
    cap = _capturer()
    if cap is not None and cap.draft is not None and release.req_pool_idx(req) is not None:
        cap.draft.forget([release.req_pool_idx(req)])
    return None


def install_pd_patches() -> None:  # called once, by install_capture_patches (0.5.23)
    from sglang_r3.serving.patches.draft import start_rows_without_drafts

    register(f"{_PREFILL}.setup_state_kv_args", append_capture_rows, "after")
    register(f"{_DECODE}.setup_state_kv_args", append_capture_rows, "after")
    register(f"{_DECODE}.DecodeReqToTokenPool.alloc", start_rows_without_drafts, "after")
    register(f"{_DECODE}.DecodeReqToTokenPool.free", drop_drafts_of_freed_decode_request, "before")
