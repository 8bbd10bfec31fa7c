"""Turn the scheduler's routing payload into each consumer's contract, in the TokenizerManager.

Every endpoint (our ``/generate``, ``/v1/completions``, ``/v1/chat/completions``, the
in-process ``sglang.Engine``) reads outputs through
``TokenizerManager._stream_one_response``; this hook rewrites
``meta_info["routed_experts"]`` there, so no consumer ever sees our internal payload:

* our ``/generate`` (it sets ``NATIVE_ROUTING``) gets the still-encoded payload (``EncodedRouting``)
  and builds the record it was asked for (server/generate.py);
* everyone else gets upstream's base64 int32 ``[T-1, num_hidden_layers, topk]`` in
  ``routed_experts`` plus the role-tagged record (JSON form) in ``routing``;
* a request whose rows cannot be trusted gets neither, and ``routing_error`` says why.
"""

from __future__ import annotations

import functools
from typing import Any

from sglang_r3.capture.payload import EncodedRouting
from sglang_r3.layout import ModelLayout
from sglang_r3.patches.hooks import register
from sglang_r3.patches.runtime import layout_of
from sglang_r3.response import NATIVE_ROUTING, attach, meta_of

_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def served_layout(tokenizer_manager) -> ModelLayout:
    """The layout of the model this TokenizerManager serves (built once)."""
    return layout_of(tokenizer_manager.model_config)


def _to_contract(tm, out: Any) -> Any:
    meta = meta_of(out)
    if meta is None or meta.get("routed_experts") is None:
        return out
    raw = meta.pop("routed_experts")
    if NATIVE_ROUTING.get():
        # server/generate.respond_routed decodes it and builds what the request asked for (on its builder
        # thread when long): this runs on the event loop, once per finished request, and many may
        # finish in one iteration.
        meta["routed_experts"] = EncodedRouting(raw)
        return out
    attach(meta, EncodedRouting(raw).decode(), served_layout(tm), upstream=True, record="wire")
    return out


def outputs_in_their_contract(original, self, *args, **kwargs):
    async def gen():
        async for out in original(self, *args, **kwargs):
            yield _to_contract(self, out)

    return gen()


@functools.cache  # once per process, whichever process kinds install it
def install_response_patches() -> None:
    register(f"{_TM}._stream_one_response", outputs_in_their_contract, "around")
