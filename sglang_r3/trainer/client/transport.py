"""Wire details shared by the sync and async clients: request bodies, content types, error bodies."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import httpx
import msgpack

from sglang_r3.trainer.client.errors import RoutingClientError, RoutingServerError

MSGPACK = "application/msgpack"
JSON = "application/json"

Prompts = Union[str, Sequence[str]]
InputIds = Union[Sequence[int], Sequence[Sequence[int]]]


def accept_headers(binary: bool) -> Dict[str, str]:
    return {"Accept": MSGPACK if binary else JSON}


def normalize_inputs(prompts: Optional[Prompts], input_ids: Optional[InputIds]) -> Tuple[str, List[Any]]:
    """('text' | 'input_ids', list of one entry per sample)."""
    if (prompts is None) == (input_ids is None):
        raise ValueError("pass exactly one of prompts or input_ids")
    if prompts is not None:
        items = [prompts] if isinstance(prompts, str) else list(prompts)
        if not items or not all(isinstance(p, str) for p in items):
            raise ValueError("prompts must be a string or a non-empty list of strings")
        return "text", items
    ids = list(input_ids)
    if not ids:
        raise ValueError("input_ids must not be empty")
    if all(isinstance(x, int) for x in ids):
        return "input_ids", [[int(x) for x in ids]]
    return "input_ids", [[int(x) for x in seq] for seq in ids]


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
