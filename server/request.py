"""The request side of our /generate: routing options parsed and checked (400 naming the field), and
SGLang's own request body without them."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from sglang_r3_server.schemas import RoutingOptions
from sglang_r3_server.state import tokenizer_manager
from sglang_r3.core import settings
from sglang_r3.serving.capture.draft import MTP_WANTED_KEY


class RequestError(ValueError):
    def __init__(self, message: str, field: Optional[str] = None, status: int = 400):
        super().__init__(message)
        self.field, self.status = field, status

    def response(self) -> JSONResponse:
        body: Dict[str, Any] = {"error": {"message": str(self), "type": "invalid_request_error"}}
        if self.field:
            body["error"]["field"] = self.field
        return JSONResponse(body, status_code=self.status)


_DEFAULT_ROUTING = {"main": True, "main+mtp": {"mtp": True}, "ref": {"ref": True}}


def _default_routing() -> Any:
    """``return_routing`` for a request that does not say (the launcher's --r3-default-routing)."""
    return _DEFAULT_ROUTING.get(settings.current().default_routing or "")


def _pd_decode_engine() -> bool:
    return getattr(tokenizer_manager().server_args, "disaggregation_mode", None) == "decode"


def parse_routing_options(body: Dict[str, Any]) -> RoutingOptions:
    defaulted = False
    if "return_routing" not in body and not body.get("return_routed_experts") and (d := _default_routing()):
        body, defaulted = {**body, "return_routing": d}, True
    elif "return_routing" not in body and "return_routed_experts" not in body and _pd_decode_engine():
        # Behind sglang-router in PD mode no request can ask: the gateway forwards neither field (slime's rollout
        # sends return_routed_experts=True through it). A decode engine with no default routing answers upstream's
        # field unasked, the rows the request's sample needs; a client that asks the engine directly still decides.
        body = {**body, "return_routed_experts": True}
    try:
        opts = RoutingOptions.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        # Union members show up in loc ("return_routing", "bool"); name the request field.
        field = str(err["loc"][0]) if err["loc"] else None
        raise RequestError(f"{field}: {err['msg']} (got {err.get('input')!r})", field=field) from None
    if opts.want_ref and settings.current().store is None:
        raise RequestError("return_routing.ref needs an engine started by sglang_r3.serving.fleet (it has no record store)",
                           field="return_routing")
    if opts.routing_start is not None and not opts.want_routing:
        raise RequestError("routing_start needs return_routing", field="routing_start")
    if opts.want_mtp:
        server_args = tokenizer_manager().server_args
        if getattr(server_args, "speculative_algorithm", None) is None:
            # Asked for something it will not get: say so, rather than answer 200 without the section.
            why = (" (the server's default routing: --r3-default-routing / SGLANG_R3_DEFAULT_ROUTING main+mtp)"
                   if defaulted else "")
            raise RequestError(
                f"return_routing.mtp{why} needs a server with MTP speculation (--speculative-algorithm EAGLE or "
                "NEXTN): this one drafts nothing, so there is no MTP-draft routing to return; main rows are",
                field="return_routing",
            )
        topk = getattr(server_args, "speculative_eagle_topk", None) or 1
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
    tok = getattr(tokenizer_manager(), "tokenizer", None)
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
    def mark(one: Any) -> Dict[str, Any]:
        one = dict(one or {})
        one["custom_params"] = {**(one.get("custom_params") or {}), MTP_WANTED_KEY: True}
        return one

    if isinstance(sp, list):
        return [mark(x) for x in sp]
    return mark(sp)
