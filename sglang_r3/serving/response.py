"""What a finished request's routing becomes in its response, built in one pass for every endpoint.

The TokenizerManager hook (``adapter/outputs.py``) takes the scheduler's payload out of ``meta_info``;
``build`` decodes it once and writes what the request asked for (``Asked``): the record's wire form,
upstream's ``routed_experts``, or ``routing_error``; a record asked for by reference is returned for
the fleet's store (``server/refs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pybase64  # SIMD base64 (a dependency of sglang), for long records

from sglang_r3.serving.capture.payload import CapturedRouting, EncodedRouting, RoutingUnavailable
from sglang_r3.core.layout import ModelLayout
from sglang_r3.serving.metrics import metrics
from sglang_r3.core.record import RoutingRecord, bits_for

# meta_info key of a payload the hook leaves for its route to build (never serialized).
PARKED = "_sglang_r3_payload"
# Attribute of an HTTP request's ``state``: what that request asked for (set by our /generate).
_ASKED = "sglang_r3_asked"


@dataclass(frozen=True)
class Asked:
    """What one request's response carries: ``record`` ``"wire"`` (in ``routing``; msgpack-packed when
    ``binary``) or ``"ref"`` (returned for the store), ``mtp`` its MTP section, ``upstream``
    upstream's base64 int32 ``routed_experts``."""

    record: Optional[str] = None
    mtp: bool = False
    upstream: bool = False
    binary: bool = False


# What every endpoint other than our /generate returns (OpenAI endpoints, ``sglang.Engine``).
CONTRACT = Asked(record="wire", upstream=True)


def ask(request: Any, asked: Asked) -> None:
    """Send ``asked`` with the HTTP request: SGLang hands the same request object to the hook, which
    then parks the payload for the route instead of building the contract on the event loop."""
    setattr(request.state, _ASKED, asked)


def asked_by(request: Any) -> Optional[Asked]:
    state = getattr(request, "state", None)  # None: sglang.Engine
    return getattr(state, _ASKED, None) if state is not None else None


def meta_of(out: Any) -> Optional[Dict[str, Any]]:
    """The ``meta_info`` of one output, or None when it has none (not a dict, or no dict there)."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    return meta if isinstance(meta, dict) else None


def unpark(ret: Any) -> List[Tuple[Dict[str, Any], EncodedRouting]]:
    """Each output's ``meta_info`` with the payload parked in it (taken out), for a single output or a batch."""
    parked = []
    for out in ret if isinstance(ret, list) else (ret,):
        meta = meta_of(out)
        if meta is not None and PARKED in meta:
            parked.append((meta, meta.pop(PARKED)))
    return parked


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


def build(meta: Dict[str, Any], payload: EncodedRouting, asked: Asked, layout: ModelLayout) -> Optional[RoutingRecord]:
    """The one pass: decode ``payload`` and write into ``meta`` what ``asked`` says -- ``routing`` (the
    record's wire form) and/or ``routed_experts`` (upstream's field), or ``routing_error`` alone when the
    payload has no rows. Returns the record when it was asked for by reference (the caller stores it)."""
    captured = payload.decode()
    if captured.error is not None:
        refuse(meta, captured.error)
        return None
    if captured.prefill_weight_version is not None:
        # PD (0.5.15.post1): the prompt and the first output token came from the prefill engine's other weights.
        spans = meta.get("weight_versions") or [{"version": meta.get("weight_version")}]
        meta["weight_versions"] = [{"version": captured.prefill_weight_version}, *spans]
    kept = None
    if asked.record is not None:
        rec = record_of(captured, layout, meta, with_mtp=asked.mtp)
        if (m := metrics()) is not None:
            m.observe_load(rec, layout.num_experts)  # per-layer expert-load gauges (bounded rows)
        if asked.record == "ref":
            kept = rec
        else:
            binary = asked.binary
            meta["routing"] = rec.to_wire(binary=binary, pack_bits=bits_for(layout.num_experts) if binary else None)
            count_served("msgpack" if binary else "json", rec.experts.nbytes)
    if asked.upstream:
        view = upstream_view(captured, layout)
        meta["routed_experts"] = pybase64.b64encode(view.tobytes()).decode("ascii")
        count_served("upstream", view.nbytes)
    return kept


Parked = List[Tuple[Dict[str, Any], EncodedRouting]]  # what ``unpark`` takes out of a response


def build_all(parked: Parked, asked: Asked, layout: ModelLayout) -> List[Tuple[Dict[str, Any], RoutingRecord]]:
    """``build`` for each parked output; the records kept for the store, with their ``meta_info``."""
    kept = []
    for meta, payload in parked:
        rec = build(meta, payload, asked, layout)
        if rec is not None:
            kept.append((meta, rec))
    return kept
