"""The response steps, one implementation each, for every way a finished request leaves SGLang.

Our ``/generate`` (``server/generate.py``), the OpenAI endpoints and the in-process ``sglang.Engine``
(``patches/responses.py``, the TokenizerManager hook) and the fleet's references (``server/refs.py``)
all turn the scheduler's payload into their contract with these:

* ``meta_of``: an output's ``meta_info`` dict, or None;
* ``attach``: what was asked for into ``meta_info`` -- upstream's int32 field (``upstream_view``, base64),
  the role-tagged record (wire form, or kept for a reference), or ``routing_error`` and neither;
* ``refuse`` / ``unavailable``: ``routing_error``, the one way a request is told it has no rows;
* ``count_served``: the served-records counters.
"""

from __future__ import annotations

import contextvars
from typing import Any, Dict, List, Optional

import numpy as np
import pybase64  # SIMD base64 (a dependency of sglang), for long records

from sglang_r3.capture.payload import CapturedRouting, RoutingUnavailable
from sglang_r3.layout import ModelLayout
from sglang_r3.metrics import metrics
from sglang_r3.record import RoutingRecord, bits_for

# Set by our /generate while it awaits SGLang's outputs: it wants the payload itself (to build the
# record it was asked for, off the event loop when long) rather than the contract every other consumer
# gets from the TokenizerManager hook.
NATIVE_ROUTING: contextvars.ContextVar = contextvars.ContextVar("sglang_r3_native_routing", default=False)


def meta_of(out: Any) -> Optional[Dict[str, Any]]:
    """The ``meta_info`` of one output, or None when it has none (not a dict, or no dict there)."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    return meta if isinstance(meta, dict) else None


def outputs(ret: Any) -> List[Any]:
    """The outputs of a response: a batch is a list, a single request one dict."""
    return ret if isinstance(ret, list) else [ret]


def upstream_view(captured: CapturedRouting, layout: ModelLayout) -> np.ndarray:
    """Upstream's ``routed_experts`` array: int32 ``[rows, num_hidden_layers, topk]``, zeros at dense
    layers (upstream's contract; the record says which layers are MoE instead)."""
    rows, _, topk = captured.experts.shape
    out = np.zeros((rows, layout.num_hidden_layers, topk), dtype=np.int32)
    out[:, list(layout.moe_layer_ids), :] = captured.experts
    return out


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


def unavailable(code: str, message: str, rows: int) -> RoutingUnavailable:
    """No rows for any of the request's ``rows`` (``code`` from ``codes.ROUTING_ERROR_CODES``)."""
    return RoutingUnavailable(code, message, missing_rows=rows, rows=rows)


def refuse(meta: Dict[str, Any], error: RoutingUnavailable) -> None:
    """``routing_error`` in place of any rows: the request learns why it has none."""
    meta["routing_error"] = error.to_meta()
    if (m := metrics()) is not None:
        m.refusals.labels(code=error.code).inc()


def count_served(form: str, nbytes: int) -> None:
    if (m := metrics()) is not None:
        m.records_served.labels(form=form).inc()
        m.record_bytes.labels(form=form).inc(nbytes)


def attach(
    meta: Dict[str, Any],
    captured: CapturedRouting,
    layout: ModelLayout,
    *,
    upstream: bool,
    record: Optional[str],
    mtp: bool = False,
    binary: bool = False,
) -> Optional[RoutingRecord]:
    """Put into ``meta`` what the request asked for: ``upstream`` -- upstream's base64 int32 field in
    ``routed_experts``; ``record`` -- ``"wire"`` (the record's wire form in ``routing``, msgpack ids
    bit-packed at ``bits_for(num_experts)`` bits when ``binary``) or ``"keep"`` (the record is returned,
    for a reference, and nothing is put). A payload without rows puts only ``routing_error``.
    Returns the record kept, else None."""
    if captured.error is not None:
        refuse(meta, captured.error)
        return None
    kept = None
    if record is not None:
        rec = record_of(captured, layout, meta, with_mtp=mtp)
        if (m := metrics()) is not None:
            m.observe_load(rec, layout.num_experts)  # per-layer expert-load gauges (bounded rows)
        if record == "keep":
            kept = rec
        else:
            meta["routing"] = rec.to_wire(binary=binary, pack_bits=bits_for(layout.num_experts) if binary else None)
            count_served("msgpack" if binary else "json", rec.experts.nbytes)
    if upstream:
        view = upstream_view(captured, layout)
        meta["routed_experts"] = pybase64.b64encode(view.tobytes()).decode("ascii")
        count_served("upstream", view.nbytes)
    return kept
