"""``POST /generate``: SGLang's native API with role-tagged routing records.

It replaces SGLang's handler with one that accepts the routing options (``server/request.py``),
forwards everything else to SGLang's TokenizerManager unchanged, and turns each finished output's
payload into what was asked for with the response steps of ``sglang_r3.response``. With
``Accept: application/msgpack`` the response is msgpack and the routing arrays are raw bytes.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, List, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from server import refs
from server.body import too_deep
from server.request import RequestError, parse_routing_options, rewrite_body
from server.schemas import ErrorResponse, RoutedOutput, RoutingOptions
from server.state import current_layout, tokenizer_manager
from server.wire import DONE_FRAME, MSGPACK, frame, respond, wants_msgpack
from sglang_r3.capture.payload import CapturedRouting, EncodedRouting
from sglang_r3.layout import ModelLayout
from sglang_r3.patches import api
from sglang_r3.response import NATIVE_ROUTING, attach, meta_of, outputs

router = APIRouter()


def attach_routing(out: Any, opts: RoutingOptions, layout: ModelLayout, binary: bool) -> Any:
    """One finished output with what its request asked for (record, reference, upstream's field)."""
    meta = meta_of(out)
    if meta is None:
        return out
    captured = meta.pop("routed_experts", None)
    if isinstance(captured, EncodedRouting) and opts.any:
        captured = captured.decode()
    if not isinstance(captured, CapturedRouting) or not opts.any:
        return out
    record = ("keep" if opts.want_ref else "wire") if opts.want_routing else None
    kept = attach(meta, captured, layout, upstream=opts.return_routed_experts, record=record,
                  mtp=opts.want_mtp, binary=binary)
    if kept is not None:  # stored and replaced by a handle in refs.settle, before the response goes out
        meta["routing_ref"] = refs.PendingRef(kept)
    return out


def attach_all(ret: Any, opts: RoutingOptions, layout: ModelLayout, binary: bool) -> Any:
    for item in outputs(ret):
        attach_routing(item, opts, layout, binary)
    return ret


@lru_cache(maxsize=1)
def _generate_fields() -> frozenset:
    return api.generate_fields()


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
    # Nesting depth is ours to decide, before the parser: parsers' own limits differ by release (server/body.py).
    deep = too_deep(await request.body())
    if deep is not None:
        return RequestError(deep.message(), field=deep.field).response()
    try:
        body = await request.json()
    except (ValueError, RecursionError) as e:  # RecursionError: a parser whose stack is shallower still
        return RequestError(f"request body is not valid JSON: {type(e).__name__}: {e}"[:300]).response()
    if not isinstance(body, dict):
        return RequestError(f"request body must be a JSON object, got {type(body).__name__}").response()
    try:
        opts = parse_routing_options(body)
        body = rewrite_body(body, opts)
    except RequestError as e:
        return e.response()
    contract_error = api.contract_error(body)
    if contract_error is not None:
        return JSONResponse({"error": {"message": contract_error}}, status_code=400)
    try:
        # Unknown fields are ignored, as SGLang's own handler does (the gateway adds `model`).
        obj = api.generate_request({k: v for k, v in body.items() if k in _generate_fields()})
    except TypeError as e:
        return RequestError(f"malformed /generate field: {e}").response()
    tm = tokenizer_manager()
    layout = current_layout() if opts.any else None
    binary = wants_msgpack(request)

    if obj.stream:
        async def stream():
            NATIVE_ROUTING.set(layout is not None)  # this generator's own context (Starlette iterates it)
            try:
                async for out in tm.generate_request(obj, request):
                    if _carries_routing(out):  # the finishing chunk: build its record off the loop
                        yield await respond_routed(out, opts, layout, binary, serialize=frame)
                    else:
                        yield frame(out, binary)
            except ValueError as e:
                yield frame({"error": {"message": str(e)}}, binary)
            if not binary:
                yield DONE_FRAME

        return StreamingResponse(
            stream(),
            media_type=MSGPACK if binary else "text/event-stream",
            background=tm.create_abort_task(obj),
        )
    token = NATIVE_ROUTING.set(layout is not None)
    try:
        ret = await tm.generate_request(obj, request).__anext__()
    except ValueError as e:
        return api.error_response(e)
    finally:
        NATIVE_ROUTING.reset(token)
    if layout is None:
        return respond(ret, binary)
    return await respond_routed(ret, opts, layout, binary)


def _carries_routing(out: Any) -> bool:
    meta = meta_of(out)
    return meta is not None and isinstance(meta.get("routed_experts"), EncodedRouting)


async def respond_routed(ret: Any, opts: RoutingOptions, layout: ModelLayout, binary: bool, serialize=None) -> Any:
    """A finished /generate output (one or a list) with its routing -> the response (``serialize``:
    ``wire.frame`` for the last frame of a stream).

    Decoding the payload, building the record and serializing it take milliseconds for a long request;
    when many requests finish in one loop iteration, doing that on the event loop stalls every other
    request's I/O (benchmarks/README.md, event-loop stall). The TokenizerManager hook leaves the payload
    encoded on the loop's side; one builder thread does the rest and hands the GIL back after each step.
    Short records are built inline: two thread hops cost more than building them.
    """
    serialize = serialize or respond
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
    for item in outputs(ret):
        meta = meta_of(item)
        enc = meta.get("routed_experts") if meta is not None else None
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
    # contention, not throughput.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang-r3-build")
