"""Wire details shared by the sync and async clients: request bodies, content types, error bodies."""

from __future__ import annotations

import json
import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import httpx
import msgpack

from sglang_r3.trainer.client.errors import RoutingArgumentError, RoutingClientError, RoutingServerError

MSGPACK = "application/msgpack"
JSON = "application/json"

Prompts = Union[str, Sequence[str]]
InputIds = Union[Sequence[int], Sequence[Sequence[int]]]


def accept_headers(binary: bool) -> Dict[str, str]:
    return {"Accept": MSGPACK if binary else JSON}


def normalize_inputs(prompts: Optional[Prompts], input_ids: Optional[InputIds]) -> Tuple[str, List[Any]]:
    """('text' | 'input_ids', list of one entry per sample); RoutingArgumentError naming what is malformed."""
    if (prompts is None) == (input_ids is None):
        raise RoutingArgumentError("pass exactly one of prompts or input_ids")
    if prompts is not None:
        items = [prompts] if isinstance(prompts, str) else list(prompts)
        if not items or not all(isinstance(p, str) for p in items):
            raise RoutingArgumentError("prompts must be a string or a non-empty list of strings")
        return "text", items
    if isinstance(input_ids, (str, bytes)):
        raise RoutingArgumentError(f"input_ids must be token ids, got {type(input_ids).__name__}")
    try:
        ids = list(input_ids)
    except TypeError:
        raise RoutingArgumentError(f"input_ids must be a list of token ids, got {type(input_ids).__name__}") from None
    if not ids:
        raise RoutingArgumentError("input_ids must not be empty")
    if all(_is_id(x) for x in ids):
        return "input_ids", [[int(x) for x in ids]]
    out = []
    for i, seq in enumerate(ids):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise RoutingArgumentError(f"input_ids[{i}] must be a token id or a list of token ids, got {seq!r:.60}")
        seq = list(seq)
        if not seq:
            raise RoutingArgumentError(f"input_ids[{i}] must not be empty")
        if not all(_is_id(x) for x in seq):
            bad = next(x for x in seq if not _is_id(x))
            raise RoutingArgumentError(f"input_ids[{i}] holds {bad!r:.60}, not a token id")
        out.append([int(x) for x in seq])
    return "input_ids", out


def _is_id(x: Any) -> bool:
    """An integer token id (numpy and torch integer scalars included; bool is not one)."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    try:
        operator.index(x)
    except TypeError:
        return False
    return getattr(x, "ndim", 0) == 0


def generate_body(
    kind: str,
    items: List[Any],
    sampling_params: Optional[Dict[str, Any]],
    routing_start: Optional[int],
    mtp: bool,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = dict(extra or {})
    # Always a batch, so the server always answers with a list.
    body[kind] = items
    body["sampling_params"] = dict(sampling_params or {})
    body["return_routing"] = {"mtp": True} if mtp else True
    if routing_start is not None:
        body["routing_start"] = int(routing_start)
    return body


def error_details(resp: httpx.Response) -> Tuple[str, Optional[str], Any]:
    """(message, field, parsed body) from our {"error": {...}}, SGLang's {"message": ...} or FastAPI's {"detail": ...}."""
    body: Any
    try:
        body = decode_body(resp)
    except Exception:  # an error page that is neither JSON nor msgpack
        body = resp.text
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"]), err.get("field"), body
        if isinstance(err, str):
            return err, None, body
        for key in ("message", "detail"):
            if body.get(key):
                detail = body[key]
                return (detail if isinstance(detail, str) else json.dumps(detail)), None, body
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return (text.strip() or resp.reason_phrase or "no message"), None, body


def decode_body(resp: httpx.Response) -> Any:
    ctype = resp.headers.get("content-type", "")
    if MSGPACK in ctype:
        return msgpack.unpackb(resp.content, raw=False)
    return resp.json()


def read_response(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        message, field, body = error_details(resp)
        raise RoutingServerError(resp.status_code, message, field=field, body=body, url=str(resp.request.url))
    try:
        return decode_body(resp)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise RoutingClientError(f"cannot decode the answer of {resp.request.url}: {e}") from e


def unreachable(url: str, e: Exception) -> RoutingClientError:
    return RoutingClientError(f"cannot reach {url}: {type(e).__name__}: {e}")
