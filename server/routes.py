"""Routes of the rollout API, mounted on SGLang's own FastAPI app.

``POST /generate`` replaces SGLang's handler with one that accepts the routing
options, validates them (400 naming the field), forwards everything else to
SGLang's TokenizerManager unchanged, and turns the captured payload into a
role-tagged record. With ``Accept: application/msgpack`` the response is
msgpack and the routing arrays are raw bytes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Dict, List, Optional, Union

import msgpack
import pybase64
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from server import refs
from server.schemas import (
    CaptureModeRequest,
    CaptureStats,
    ErrorResponse,
    LayoutResponse,
    RoutedOutput,
    RoutingOptions,
)
from sglang_r3.capture.capturer import CAPTURE_MODE_CODES
from sglang_r3.capture.transport import NATIVE_ROUTING, CapturedRouting, EncodedRouting, to_upstream_routed_experts
from sglang_r3.layout import ModelLayout
from sglang_r3.patches.metrics import metrics
from sglang_r3.patches.responses import record_of, refuse, served_layout
from sglang_r3.record import bits_for

logger = logging.getLogger(__name__)

# SGLang's own endpoint auth levels: with --admin-api-key set, admin endpoints need that key.
from sglang.srt.utils.auth import AuthLevel, auth_level  # noqa: E402

MSGPACK = "application/msgpack"
router = APIRouter()


class RequestError(ValueError):
    def __init__(self, message: str, field: Optional[str] = None, status: int = 400):
        super().__init__(message)
        self.field, self.status = field, status

    def response(self) -> JSONResponse:
        body: Dict[str, Any] = {"error": {"message": str(self), "type": "invalid_request_error"}}
        if self.field:
            body["error"]["field"] = self.field
        return JSONResponse(body, status_code=self.status)


def _state():
    from sglang.srt.entrypoints.http_server import get_global_state

    return get_global_state()


def current_layout() -> ModelLayout:
    return served_layout(_state().tokenizer_manager)


# ---------------------------------------------------------------------------
# Request side
# ---------------------------------------------------------------------------

def _default_routing() -> Any:
    value = os.environ.get("SGLANG_R3_DEFAULT_ROUTING")  # set by the launcher's --r3-default-routing
    return {"main": True, "main+mtp": {"mtp": True}, "ref": {"ref": True}}.get(value or "")


def parse_routing_options(body: Dict[str, Any]) -> RoutingOptions:
    if "return_routing" not in body and not body.get("return_routed_experts") and (d := _default_routing()):
        body = {**body, "return_routing": d}
    try:
        opts = RoutingOptions.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        # Union members show up in loc ("return_routing", "bool"); name the request field.
        field = str(err["loc"][0]) if err["loc"] else None
        raise RequestError(f"{field}: {err['msg']} (got {err.get('input')!r})", field=field) from None
    if opts.want_ref and not refs.configured():
        raise RequestError("return_routing.ref needs an engine started by sglang_r3.fleet (it has no record store)",
                           field="return_routing")
    if opts.routing_start is not None and not opts.want_routing:
        raise RequestError("routing_start needs return_routing", field="routing_start")
    if opts.want_mtp:
        topk = getattr(_state().tokenizer_manager.server_args, "speculative_eagle_topk", None) or 1
        if topk > 1:
            # Tree drafting routes sibling drafts per position; the MTP section cannot say which was kept.
            raise RequestError(
                f"return_routing.mtp is not supported with tree drafting (--speculative-eagle-topk {topk}); "
                "main rows are", field="return_routing"
            )
    if (
        opts.routing_start is not None
        and opts.routed_experts_start_len is not None
        and opts.routing_start != opts.routed_experts_start_len
    ):
        raise RequestError(
            "routing_start and routed_experts_start_len disagree; send one start", field="routing_start"
        )
    return opts


def _prompt_lengths(body: Dict[str, Any]) -> List[int]:
    ids = body.get("input_ids")
    if ids is not None:
        if ids and isinstance(ids[0], list):
            return [len(x) for x in ids]
        return [len(ids)]
    text = body.get("text")
    tok = getattr(_state().tokenizer_manager, "tokenizer", None)
    if text is None or tok is None:
        return []
    texts = text if isinstance(text, list) else [text]
    return [len(tok.encode(t)) for t in texts if isinstance(t, str)]


def rewrite_body(body: Dict[str, Any], opts: RoutingOptions) -> Dict[str, Any]:
    """SGLang's own request body: our fields removed, capture switched on when any routing is asked for."""
    body = {k: v for k, v in body.items() if k not in ("return_routing", "routing_start")}
    if not opts.any:
        return body
    start = opts.routing_start if opts.routing_start is not None else (opts.routed_experts_start_len or 0)
    if start:
        for n in _prompt_lengths(body):
            if start > n:
                raise RequestError(
                    f"routing_start={start} is beyond the prompt ({n} tokens); it must be <= the prompt length",
                    field="routing_start" if opts.routing_start is not None else "routed_experts_start_len",
                )
    body["return_routed_experts"] = True
    body["routed_experts_start_len"] = start
    if opts.want_mtp:
        # The scheduler files MTP-draft routing only for requests that ask for it; the wish reaches it in
        # sampling_params.custom_params, the per-request carrier SGLang itself uses for its own keys.
        body["sampling_params"] = _with_mtp_marker(body.get("sampling_params"), body)
    return body


def _with_mtp_marker(sp: Any, body: Dict[str, Any]) -> Any:
    from sglang_r3.capture.draft import MTP_WANTED_KEY

    def mark(one: Any) -> Dict[str, Any]:
        one = dict(one or {})
        one["custom_params"] = {**(one.get("custom_params") or {}), MTP_WANTED_KEY: True}
        return one

    if isinstance(sp, list):
        return [mark(x) for x in sp]
    return mark(sp)


# ---------------------------------------------------------------------------
# Response side
# ---------------------------------------------------------------------------

def attach_routing(out: Dict[str, Any], opts: RoutingOptions, layout: ModelLayout, binary: bool) -> Dict[str, Any]:
    meta = out.get("meta_info")
    if not isinstance(meta, dict):
        return out
    captured = meta.pop("routed_experts", None)
    if isinstance(captured, EncodedRouting) and opts.any:
        captured = captured.decode()
    if not isinstance(captured, CapturedRouting) or not opts.any:
        return out
    if captured.error is not None:
        refuse(meta, captured)  # no rows at all: `routing_error` says how many were never captured and why
        return out
    m = metrics()
    if opts.want_routing:
        record = record_of(captured, layout, meta, with_mtp=opts.want_mtp)
        if m is not None:
            m.observe_load(record, layout.num_experts)  # per-layer expert-load gauges (bounded rows)
        if opts.want_ref:  # stored and replaced by a handle in refs.settle, before the response goes out
            meta["routing_ref"] = refs.PendingRef(record)
        else:
            # msgpack: ids bit-packed at ceil(log2(num_experts)) bits ("packing" field; from_wire reads it).
            meta["routing"] = record.to_wire(binary=binary, pack_bits=bits_for(layout.num_experts) if binary else None)
            if m is not None:
                form = "msgpack" if binary else "json"
                m.records_served.labels(form=form).inc()
                m.record_bytes.labels(form=form).inc(record.experts.nbytes)
    if opts.return_routed_experts:
        upstream = to_upstream_routed_experts(captured, layout.num_hidden_layers, layout.moe_layer_ids)
        meta["routed_experts"] = pybase64.b64encode(upstream.tobytes()).decode("ascii")
        if m is not None:
            m.records_served.labels(form="upstream").inc()
            m.record_bytes.labels(form="upstream").inc(upstream.nbytes)
    return out


@lru_cache(maxsize=1)
def _generate_fields() -> frozenset:
    import dataclasses

    from sglang.srt.managers.io_struct import GenerateReqInput

    return frozenset(f.name for f in dataclasses.fields(GenerateReqInput))


def _wants_msgpack(request: Request) -> bool:
    return MSGPACK in request.headers.get("accept", "")


def _respond(content: Any, binary: bool) -> Response:
    if binary:
        return Response(msgpack.packb(content, use_bin_type=True, default=_msgpack_default), media_type=MSGPACK)
    from sglang.srt.utils.json_response import orjson_response

    return orjson_response(content)


def _stream_frame(content: Any, binary: bool) -> bytes:
    if binary:
        return msgpack.packb(content, use_bin_type=True, default=_msgpack_default)
    from sglang.srt.utils.json_response import dumps_json

    return b"data: " + dumps_json(content) + b"\n\n"


def _msgpack_default(obj):
    # numpy scalars / arrays that SGLang may leave in meta_info
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot msgpack {type(obj).__name__}")


@router.api_route(
    "/generate",
    methods=["POST", "PUT"],
    responses={200: {"model": Union[RoutedOutput, List[RoutedOutput]]}, 400: {"model": ErrorResponse}},
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "description": "SGLang's GenerateReqInput fields, plus the routing options below.",
                        "properties": RoutingOptions.model_json_schema()["properties"],
                    }
                }
            }
        }
    },
    summary="Generate (SGLang native API) with role-tagged routing records",
)
async def generate(request: Request):
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.entrypoints.http_server import _create_error_response
    from sglang.srt.managers.io_struct import GenerateReqInput

    try:
        body = await request.json()
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
        return RequestError(f"request body is not valid JSON: {type(e).__name__}: {e}"[:300]).response()
    if not isinstance(body, dict):
        return RequestError(f"request body must be a JSON object, got {type(body).__name__}").response()
    try:
        opts = parse_routing_options(body)
        body = rewrite_body(body, opts)
    except RequestError as e:
        return e.response()
    contract_error = generate_contract_error(body)
    if contract_error is not None:
        return JSONResponse({"error": {"message": contract_error}}, status_code=400)
    try:
        # Unknown fields are ignored, as SGLang's own handler does (the gateway adds `model`).
        obj = GenerateReqInput(**{k: v for k, v in body.items() if k in _generate_fields()})
    except TypeError as e:
        return RequestError(f"malformed /generate field: {e}").response()
    tm = _state().tokenizer_manager
    layout = current_layout() if opts.any else None
    binary = _wants_msgpack(request)

    if obj.stream:
        from sglang.srt.utils.json_response import dumps_json

        async def stream():
            NATIVE_ROUTING.set(layout is not None)  # this generator's own context (Starlette iterates it)
            try:
                async for out in tm.generate_request(obj, request):
                    if _carries_routing(out):  # the finishing chunk: build its record off the loop
                        yield await respond_routed(out, opts, layout, binary, serialize=_stream_frame)
                    elif binary:
                        yield msgpack.packb(out, use_bin_type=True, default=_msgpack_default)
                    else:
                        yield b"data: " + dumps_json(out) + b"\n\n"
            except ValueError as e:
                err = {"error": {"message": str(e)}}
                yield msgpack.packb(err) if binary else b"data: " + dumps_json(err) + b"\n\n"
            if not binary:
                yield b"data: [DONE]\n\n"

        return StreamingResponse(
            stream(),
            media_type=MSGPACK if binary else "text/event-stream",
            background=tm.create_abort_task(obj),
        )
    token = NATIVE_ROUTING.set(layout is not None)
    try:
        ret = await tm.generate_request(obj, request).__anext__()
    except ValueError as e:
        return _create_error_response(e)
    finally:
        NATIVE_ROUTING.reset(token)
    if layout is None:
        return _respond(ret, binary)
    return await respond_routed(ret, opts, layout, binary)


def attach_all(ret: Any, opts: RoutingOptions, layout: ModelLayout, binary: bool) -> Any:
    for item in ret if isinstance(ret, list) else [ret]:
        attach_routing(item, opts, layout, binary)
    return ret


def _carries_routing(out: Any) -> bool:
    meta = out.get("meta_info") if isinstance(out, dict) else None
    return isinstance(meta, dict) and isinstance(meta.get("routed_experts"), EncodedRouting)


async def respond_routed(ret: Any, opts: RoutingOptions, layout: ModelLayout, binary: bool, serialize=None) -> Any:
    """A finished /generate output (one or a list) with its routing -> the response (``serialize``:
    ``_stream_frame`` for the last frame of a stream).

    Decoding the payload, building the record and serializing it take milliseconds for a long request;
    when many requests finish in one loop iteration, doing that on the event loop stalls every other
    request's I/O (benchmarks/README.md, event-loop stall). ``_to_contract`` leaves the payload encoded
    on the loop's side; one builder thread does the rest and hands the GIL back after each step. Short
    records are built inline: two thread hops cost more than building them.
    """
    serialize = serialize or _respond
    if _payload_bytes(ret) < _INLINE_BUILD_BYTES:
        return serialize(await refs.settle(attach_all(ret, opts, layout, binary)), binary)
    loop = asyncio.get_running_loop()
    out = await refs.settle(await loop.run_in_executor(_builder(), _yielding, attach_all, ret, opts, layout, binary))
    return await loop.run_in_executor(_builder(), _yielding, serialize, out, binary)


# Encoded payload size (base64 characters, all outputs of the response) below which building on the
# event loop is cheaper than the thread hops (about a 130-token GLM-4.5 record).
_INLINE_BUILD_BYTES = 1 << 17


def _payload_bytes(ret: Any) -> int:
    total = 0
    for item in ret if isinstance(ret, list) else [ret]:
        meta = item.get("meta_info") if isinstance(item, dict) else None
        enc = meta.get("routed_experts") if isinstance(meta, dict) else None
        if isinstance(enc, EncodedRouting):
            raw = enc.raw
            total += len(raw) if isinstance(raw, (str, bytes, bytearray)) else int(getattr(raw, "numel", lambda: 0)())
    return total


def _yielding(fn, *args):
    try:
        return fn(*args)
    finally:
        # An executor thread takes its next job while still holding the GIL, and the loop thread,
        # back from select(), then waits for it job after job: a burst became one long stall.
        # Releasing it here lets the loop run between builds.
        time.sleep(0)


@lru_cache(maxsize=1)
def _builder() -> ThreadPoolExecutor:
    # One thread: builds hold the GIL most of the time (orjson, msgpack), so more threads add GIL
    # contention, not throughput (the loop's lateness grew with 2 or 4 threads).
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang-r3-build")


@router.get("/routing/layout", response_model=LayoutResponse, summary="The model's layers by role")
async def routing_layout():
    return current_layout().to_dict()


@router.post(
    "/routing/capture",
    responses={400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}},
    summary="Switch capture at runtime: off / main / main+mtp (admin: needs --admin-api-key's key when set)",
)
@auth_level(AuthLevel.ADMIN_OPTIONAL)
async def routing_capture(body: CaptureModeRequest):
    from sglang.srt.managers.io_struct import SetInternalStateReq

    code = {v: k for k, v in CAPTURE_MODE_CODES.items()}[body.mode]
    results = await _state().tokenizer_manager.set_internal_state(
        SetInternalStateReq(server_args={"sglang_r3_capture": code})
    )
    results = results if isinstance(results, list) else [results]
    # TokenizerManager answers plain bools (one per scheduler).
    if not all(r if isinstance(r, bool) else getattr(r, "updated", False) for r in results):
        return RequestError("the scheduler refused the capture mode change (see server log)", "mode").response()
    return {"mode": body.mode}


@router.get("/routing/stats", response_model=List[CaptureStats], summary="Capture counters per scheduler")
async def routing_stats():
    states = await _state().tokenizer_manager.get_internal_state()
    return [s["sglang_r3"] for s in states if isinstance(s, dict) and "sglang_r3" in s]
