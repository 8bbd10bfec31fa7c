"""``/routing/*``: the served layout, the capture switch (admin) and the capture counters."""

from __future__ import annotations

from typing import List

from fastapi import APIRouter

from sglang_r3_server.request import RequestError
from sglang_r3_server.schemas import CaptureModeRequest, CaptureStats, ErrorResponse, LayoutResponse
from sglang_r3_server.state import current_layout, tokenizer_manager
from sglang_r3.serving.capture.capturer import CAPTURE_MODE_CODES
from sglang_r3.serving.adapter import api

router = APIRouter()


@router.get("/routing/layout", response_model=LayoutResponse, summary="The model's layers by role")
async def routing_layout():
    return current_layout().to_dict()


@router.post(
    "/routing/capture",
    responses={400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}},
    summary="Switch capture at runtime: off / main / main+mtp (admin: needs --admin-api-key's key when set)",
)
@api.admin_optional
async def routing_capture(body: CaptureModeRequest):
    code = {v: k for k, v in CAPTURE_MODE_CODES.items()}[body.mode]
    results = await tokenizer_manager().set_internal_state(api.capture_mode_request(code))
    results = results if isinstance(results, list) else [results]
    # TokenizerManager answers plain bools (one per scheduler).
    if not all(r if isinstance(r, bool) else getattr(r, "updated", False) for r in results):
        return RequestError("the scheduler refused the capture mode change (see server log)", "mode").response()
    return {"mode": body.mode}


@router.get("/routing/stats", response_model=List[CaptureStats], summary="Capture counters per scheduler")
async def routing_stats():
    states = await tokenizer_manager().get_internal_state()
    return [s["sglang_r3"] for s in states if isinstance(s, dict) and "sglang_r3" in s]
