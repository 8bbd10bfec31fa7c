"""Pydantic schemas of the rollout API (they also document it on /docs)."""

from __future__ import annotations

from typing import List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from sglang_r3.core.codes import ROUTING_ERROR_CODES


class RoutingSelect(BaseModel):
    """Object form of ``return_routing``: which sections to return."""

    model_config = ConfigDict(extra="forbid")
    main: StrictBool = Field(True, description="Main-model MoE rows (target/verify forwards).")
    mtp: StrictBool = Field(False, description="Add the MTP-draft section.")
    ref: StrictBool = Field(
        False, description="Store the record in this engine's record store (fleet engines) and return only a handle "
        "in `meta_info.routing_ref`."
    )


class RoutingOptions(BaseModel):
    """Routing fields accepted on ``POST /generate`` next to SGLang's own fields."""

    model_config = ConfigDict(extra="ignore")
    return_routing: Union[StrictBool, RoutingSelect] = Field(
        False, description="`true` for main rows; `{\"mtp\": true}` to add the MTP-draft section."
    )
    routing_start: Optional[StrictInt] = Field(
        None, ge=0, description="Return rows from this token position on (partial rollouts); <= prompt length."
    )
    return_routed_experts: StrictBool = Field(
        False, description="Upstream SGLang field: base64 int32 [T-1-start, num_hidden_layers, topk] in "
        "meta_info.routed_experts (start: routing_start or routed_experts_start_len, 0 when neither is sent)."
    )
    routed_experts_start_len: Optional[StrictInt] = Field(None, ge=0, description="Upstream start for routed_experts.")

    @property
    def want_routing(self) -> bool:
        r = self.return_routing
        return bool(r) if isinstance(r, bool) else (r.main or r.mtp)

    @property
    def want_mtp(self) -> bool:
        return isinstance(self.return_routing, RoutingSelect) and self.return_routing.mtp

    @property
    def want_ref(self) -> bool:
        return isinstance(self.return_routing, RoutingSelect) and self.return_routing.ref

    @property
    def any(self) -> bool:
        return self.want_routing or self.return_routed_experts


class LayerSchema(BaseModel):
    id: int
    role: Literal["dense", "moe", "mtp"]
    depth: Optional[int] = Field(None, description="MTP depth, 1-based; null for decoder layers.")
    num_experts: int = Field(0, description="Routed experts; 0 for layers without a router.")
    topk: int = 0


class LayoutResponse(BaseModel):
    fingerprint: str = Field(
        description="Hash of the layer structure and config_digest; every routing record carries it."
    )
    config_digest: str = Field("", description="Hash of the routing-relevant values of the model's config.json.")
    architecture: str
    num_hidden_layers: int
    layers: List[LayerSchema]


class MtpSection(BaseModel):
    num_entries: int
    topk: int
    dtype: Literal["uint8", "uint16"]
    positions: str = Field(
        description="base64 int32 [n]: the position p the draft forward ran at (it reads the target's hidden state of token p)"
    )
    depth: str = Field(description="base64 uint8 [n]: MTP depth (1-based)")
    step: str = Field(description="base64 uint8 [n]: draft step within the speculation round")
    accepted: str = Field(description="base64 uint8 [n]: 1 if the drafted token was accepted")
    experts: str = Field(description="base64 [n, topk] expert ids")
    tokens: Optional[str] = Field(
        None, description="base64 int32 [n]: the token id whose embedding the draft forward routed, the sequence's token "
        "at positions + depth (p + 1 at depth 1)"
    )
    rounds: Optional[str] = Field(None, description="base64 int32 [n]: the speculation round (a server-wide counter)")


class RoutingRecordSchema(BaseModel):
    """``meta_info.routing`` of a /generate output."""

    layout: str
    start: int
    num_tokens: int
    layers: List[int] = Field(description="Main MoE layer ids, in row order. Dense layers are absent.")
    topk: int
    dtype: Literal["uint8", "uint16"]
    experts: str = Field(description="base64 of row-major [num_tokens, len(layers), topk]")
    mtp: Optional[MtpSection] = None
    weight_version: Optional[str] = Field(
        None, description="SGLang's weight version of the sample; 'mixed:v1,v2' when it spanned a weight update."
    )
    tokens_digest: Optional[str] = Field(None, description="token_digest(prompt + completion token ids).")


class RoutingErrorSchema(BaseModel):
    """``meta_info.routing_error``: present instead of ``routing`` when some rows were never captured."""

    code: Literal[ROUTING_ERROR_CODES]
    message: str
    missing_rows: int
    rows: int


class RoutingHandleSchema(BaseModel):
    """``meta_info.routing_ref``: where a fleet engine's record waits (``return_routing: {"ref": true}``)."""

    store: str
    namespace: str
    engine: str
    incarnation: int
    rid: str
    start: int
    num_tokens: int
    weight_version: Optional[str] = None
    tokens_digest: Optional[str] = None


class RoutedMetaInfo(BaseModel):
    """The routing fields of a /generate output's ``meta_info`` (next to SGLang's own); at most one is set."""

    model_config = ConfigDict(extra="allow")
    routing: Optional[RoutingRecordSchema] = None
    routing_error: Optional[RoutingErrorSchema] = None
    routing_ref: Optional[RoutingHandleSchema] = None
    routed_experts: Optional[str] = Field(
        None, description="Upstream's field when asked for: base64 int32 [T-1-start, num_hidden_layers, topk] (start: "
        "routing_start or routed_experts_start_len, 0 when neither is sent)."
    )


class RoutedOutput(BaseModel):
    """One /generate output (a list of them for a batch); SGLang's fields as SGLang returns them."""

    model_config = ConfigDict(extra="allow")
    text: Optional[str] = None
    output_ids: Optional[List[int]] = None
    meta_info: RoutedMetaInfo


class CaptureModeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["off", "main", "main+mtp"]


class CaptureStats(BaseModel):
    model_config = ConfigDict(extra="allow")
    layout: str
    main_forwards: int
    main_rows_written: int
    main_captures_from_draft: int


class ErrorBody(BaseModel):
    message: str
    type: Optional[Literal["invalid_request_error"]] = Field(
        None, description="`invalid_request_error` on sglang-r3's own refusals (a routing option, the body); absent on "
        "SGLang's own (the input guard)."
    )
    field: Optional[str] = Field(None, description="The request field to change, when one is to blame.")


class ErrorResponse(BaseModel):
    error: ErrorBody
