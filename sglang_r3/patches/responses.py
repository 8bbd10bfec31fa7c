"""Turn the scheduler's routing payload into each consumer's contract, in the TokenizerManager.

Every endpoint (our ``/generate``, ``/v1/completions``, ``/v1/chat/completions``, the
in-process ``sglang.Engine``) reads outputs through
``TokenizerManager._stream_one_response``; this hook rewrites
``meta_info["routed_experts"]`` there, so no consumer ever sees our internal payload:

* our ``/generate`` (it sets ``NATIVE_ROUTING``) gets the still-encoded payload (``EncodedRouting``)
  and builds the record it was asked for (server/routes.py);
* everyone else gets upstream's base64 int32 ``[T-1, num_hidden_layers, topk]`` in
  ``routed_experts`` plus the role-tagged record (JSON form) in ``routing``;
* a request whose rows cannot be trusted gets neither, and ``routing_error`` says why.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import pybase64

from sglang_r3.capture.transport import (
    NATIVE_ROUTING,
    CapturedRouting,
    EncodedRouting,
    to_upstream_routed_experts,
)
from sglang_r3.layout import ModelLayout
from sglang_r3.patches.metrics import metrics
from sglang_r3.patches.runtime import layout_of
from sglang_r3.record import RoutingRecord

logger = logging.getLogger(__name__)

_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def served_layout(tokenizer_manager) -> ModelLayout:
    """The layout of the model this TokenizerManager serves (built once)."""
    return layout_of(tokenizer_manager.model_config)


def weight_version_of(meta: Dict[str, Any]) -> Optional[str]:
    """SGLang's weight version of the whole sample; several segments under different weights
    are named together so that no single version a trainer holds can match them."""
    spans = meta.get("weight_versions")
    if spans:
        versions = list(dict.fromkeys(str(s["version"]) for s in spans))
        if len(versions) > 1:
            return "mixed:" + ",".join(versions)
    v = meta.get("weight_version")
    return None if v is None else str(v)


def record_of(captured: CapturedRouting, layout: ModelLayout, meta: Dict[str, Any], with_mtp: bool) -> RoutingRecord:
    return RoutingRecord(
        layout=layout.fingerprint,
        start=captured.start,
        layers=layout.moe_layer_ids,
        experts=captured.experts,
        mtp=captured.mtp if with_mtp else None,
        weight_version=weight_version_of(meta),
        tokens_digest=captured.tokens_digest,
    )


def refuse(meta: Dict[str, Any], captured: CapturedRouting) -> None:
    meta["routing_error"] = captured.error.to_meta()
    if (m := metrics()) is not None:
        m.refusals.labels(code=captured.error.code).inc()


def _to_contract(tm, out: Any) -> Any:
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if not isinstance(meta, dict) or meta.get("routed_experts") is None:
        return out
    raw = meta.pop("routed_experts")
    if NATIVE_ROUTING.get():
        # server/routes.respond_routed decodes it and builds what the request asked for (on its builder
        # thread when long): this runs on the event loop, once per finished request, and many may
        # finish in one iteration.
        meta["routed_experts"] = EncodedRouting(raw)
        return out
    captured = EncodedRouting(raw).decode()
    if captured.error is not None:
        refuse(meta, captured)
        return out
    layout = served_layout(tm)
    upstream = to_upstream_routed_experts(captured, layout.num_hidden_layers, layout.moe_layer_ids)
    meta["routed_experts"] = pybase64.b64encode(upstream.tobytes()).decode("ascii")
    meta["routing"] = record_of(captured, layout, meta, with_mtp=False).to_wire(binary=False)
    if (m := metrics()) is not None:
        m.records_served.labels(form="upstream").inc()
        m.record_bytes.labels(form="upstream").inc(upstream.nbytes)
    return out


def stream_one_response(original, self, *args, **kwargs):
    async def gen():
        async for out in original(self, *args, **kwargs):
            yield _to_contract(self, out)

    return gen()


_done = False


def install_response_patches() -> None:
    global _done
    if _done:
        return
    _done = True
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_r3.patches.hooks import register

    register(f"{_TM}._stream_one_response", stream_one_response, HookType.AROUND)
