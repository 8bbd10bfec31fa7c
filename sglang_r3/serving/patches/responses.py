"""The TokenizerManager hook every output leaves through (our ``/generate``, the OpenAI endpoints,
``sglang.Engine``): the scheduler's payload never reaches a consumer as it is. A request that says what
it asked for (``response.ask``) gets it parked for its route; every other gets ``response.CONTRACT``.
"""

from __future__ import annotations

import functools
from typing import Any

from sglang_r3.serving.capture.payload import EncodedRouting
from sglang_r3.core.layout import ModelLayout
from sglang_r3.serving.patches.hooks import register
from sglang_r3.serving.patches.runtime import layout_of
from sglang_r3.serving.response import CONTRACT, PARKED, asked_by, build, meta_of

_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def served_layout(tokenizer_manager) -> ModelLayout:
    """The layout of the model this TokenizerManager serves (built once)."""
    return layout_of(tokenizer_manager.model_config)


def take_payload(tm, request: Any, out: Any) -> Any:
    meta = meta_of(out)
    if meta is None or meta.get("routed_experts") is None:
        return out
    payload = EncodedRouting(meta.pop("routed_experts"))
    if asked_by(request) is not None:
        # Its route builds what it asked for (off the event loop when long): this runs on the loop, once
        # per finished request, and many may finish in one iteration.
        meta[PARKED] = payload
    else:
        build(meta, payload, CONTRACT, served_layout(tm))
    return out


def outputs_in_their_contract(original, self, *args, **kwargs):
    # SGLang calls _stream_one_response(obj=, state=, request=); positional kept for safety.
    request = kwargs["request"] if "request" in kwargs else (args[2] if len(args) > 2 else None)

    async def gen():
        async for out in original(self, *args, **kwargs):
            yield take_payload(self, request, out)

    return gen()


@functools.cache  # once per process, whichever process kinds install it
def install_response_patches() -> None:
    register(f"{_TM}._stream_one_response", outputs_in_their_contract, "around")
