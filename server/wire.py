"""How a /generate body and stream frame are serialized: JSON as SGLang writes its own (orjson through
SGLang), or msgpack (arrays as bytes, expert ids bit-packed: docs/api.md) when the client sends
``Accept: application/msgpack``."""

from __future__ import annotations

from typing import Any

import msgpack
from fastapi import Request
from fastapi.responses import Response

from sglang_r3.serving.adapter import api

MSGPACK = "application/msgpack"
DONE_FRAME = b"data: [DONE]\n\n"  # the last frame of a JSON (server-sent events) stream


def wants_msgpack(request: Request) -> bool:
    return MSGPACK in request.headers.get("accept", "")


def respond(content: Any, binary: bool) -> Response:
    """A whole (non-streamed) response."""
    if binary:
        return Response(_pack(content), media_type=MSGPACK)
    return api.json_response(content)


def frame(content: Any, binary: bool) -> bytes:
    """One frame of a stream: a msgpack object, or a server-sent event."""
    if binary:
        return _pack(content)
    return b"data: " + api.dumps_json(content) + b"\n\n"


def _pack(content: Any) -> bytes:
    return msgpack.packb(content, use_bin_type=True, default=_msgpack_default)


def _msgpack_default(obj):
    # numpy scalars / arrays that SGLang may leave in meta_info
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot msgpack {type(obj).__name__}")
