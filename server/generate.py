"""``POST /generate``: SGLang's native API plus the routing options (``server/request.py``); each
finished output gets what its request asked for from ``response.build``, off the event loop when long.
With ``Accept: application/msgpack`` the response is msgpack: routing arrays as bytes, expert ids bit-packed
(``packing.bits`` per id; docs/api.md spells the layout out byte by byte).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, List, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from sglang_r3_server import refs
from sglang_r3_server.body import too_deep
from sglang_r3_server.request import RequestError, parse_routing_options, rewrite_body
from sglang_r3_server.schemas import ErrorResponse, RoutedOutput, RoutingOptions
from sglang_r3_server.state import current_layout, tokenizer_manager
from sglang_r3_server.wire import DONE_FRAME, MSGPACK, frame, respond, wants_msgpack
from sglang_r3.core.layout import ModelLayout
from sglang_r3.serving.adapter import api
from sglang_r3.serving.response import Asked, Parked, ask, build_all, unpark

router = APIRouter()


def asked_of(opts: RoutingOptions, binary: bool) -> Asked:
    record = ("ref" if opts.want_ref else "wire") if opts.want_routing else None
    return Asked(record=record, mtp=opts.want_mtp, upstream=opts.return_routed_experts, binary=binary)


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
    binary = wants_msgpack(request)
    asked = layout = None
    if opts.any:
        asked, layout = asked_of(opts, binary), current_layout()
        ask(request, asked)  # the TokenizerManager hook parks each payload for us (sglang_r3.serving.response)

    if obj.stream:
        async def stream():
            try:
                async for out in tm.generate_request(obj, request):
                    parked = unpark(out)
                    if parked:  # the finishing chunk: build its routing off the loop when long
                        yield await respond_routed(out, parked, asked, layout, serialize=frame)
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
    try:
        ret = await tm.generate_request(obj, request).__anext__()
    except ValueError as e:
        return api.error_response(e)
    parked = unpark(ret) if asked is not None else None
    if not parked:
        return respond(ret, binary)
    return await respond_routed(ret, parked, asked, layout)


async def respond_routed(ret: Any, parked: Parked, asked: Asked, layout: ModelLayout, serialize=respond) -> Any:
    """A finished output (one or a batch) and its ``parked`` payloads -> the response (``serialize``:
    ``wire.frame`` for the last frame of a stream).

    Decoding, building and serializing a long record take milliseconds; many requests finishing in one
    loop iteration would stall every other request's I/O (benchmarks/README.md, event-loop stall), so
    one builder thread does them and hands the GIL back after each step. Short records are built
    inline: two thread hops cost more than building them.
    """
    run = _inline if sum(p.nbytes for _, p in parked) < _INLINE_BUILD_BYTES else _on_builder
    kept = await run(build_all, parked, asked, layout)
    await refs.store(kept)  # handles in place before the body is serialized
    return await run(serialize, ret, asked.binary)


async def _inline(fn, *args):
    return fn(*args)


async def _on_builder(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(_builder(), _yielding, fn, *args)


# Encoded payload size (base64 characters, all outputs of the response) below which building on the
# event loop is cheaper than the thread hops (about a 130-token GLM-4.5 record).
_INLINE_BUILD_BYTES = 1 << 17


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
