"""The TokenizerManager hook every output leaves through (our ``/generate``, the OpenAI endpoints,
``sglang.Engine``): the scheduler's payload never reaches a consumer as it is. A request that says what
it asked for (``response.ask``) gets it parked for its route; every other gets ``response.CONTRACT``.
"""

from __future__ import annotations

import functools
from typing import Any

from sglang_r3.serving.capture.payload import EncodedRouting
from sglang_r3.core.layout import ModelLayout
from sglang_r3.seam import release
from sglang_r3.seam.hooks import register
from sglang_r3.serving.adapter.runtime import layout_of
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


def _around(request_at: int):
    """The hook on the generator every output leaves through; its ``request`` is keyword or the positional
    argument at ``request_at`` after self (0.5.23: ``_stream_one_response(obj, state, request)``, 2; 0.5.15:
    ``_wait_one_response(obj, request)``, 1)."""
    def outputs_in_their_contract(original, self, *args, **kwargs):
        request = kwargs["request"] if "request" in kwargs else (args[request_at] if len(args) > request_at else None)
        spans = WeightSpans(self) if release.outputs_stamp_one_weight_version() else None

        async def gen():
            async for out in original(self, *args, **kwargs):
                if spans is not None:
                    spans.mark(out)
                yield take_payload(self, request, out)

        return gen()

    return outputs_in_their_contract


class WeightSpans:
    """0.5.15 stamps each output with the weight version current when it leaves (no ``weight_versions`` spans,
    which 0.5.23 keeps per segment): a request that spanned a weight update, which only a paused engine lets
    happen, is told apart here by the updates the TokenizerManager applied while it ran. Its finished output
    gets the versions it spanned as 0.5.23 would write them, so its record says ``mixed:`` and the trainer
    refuses it."""

    def __init__(self, tm):
        self.tm = tm
        self.start = _updates_of(tm)
        self.first = str(tm.server_args.weight_version)

    def mark(self, out) -> None:
        meta = meta_of(out)
        if meta is None or meta.get("routed_experts") is None or meta.get("weight_versions"):
            return
        log = getattr(self.tm, _UPDATES, [])
        if len(log) == self.start:
            return
        versions = [self.first] + [v for v in log[self.start:]]
        if len(set(versions)) == 1:  # updated, but under the same version name: still other weights
            versions = [f"{v}@update{i}" for i, v in enumerate(versions)]
        meta["weight_versions"] = [{"version": v} for v in versions]


_UPDATES = "_sglang_r3_weight_updates"  # on the TokenizerManager: the version after each applied update


def _updates_of(tm) -> int:
    return len(getattr(tm, _UPDATES, ()))


def note_weight_update(result, self, *args, **kwargs):
    """After a TokenizerManager weight update (0.5.15): (success, message, ...) -> the version now served."""
    ok = bool(result[0]) if isinstance(result, tuple) and result else bool(getattr(result, "success", False))
    if ok:
        if not hasattr(self, _UPDATES):
            setattr(self, _UPDATES, [])
        getattr(self, _UPDATES).append(str(self.server_args.weight_version))
    return result


def stamp_weight_version(result, self, *args, **kwargs):
    """After a PD engine's TokenizerManager builds a request for its scheduler (0.5.15.post1, whose scheduler holds
    only the start-up ``--weight-version``): the version it serves now rides in the request's ``custom_params``
    (which SGLang hands to the scheduler's request as they are), for pd_rows.py to send or compare."""
    params = getattr(result, "sampling_params", None)
    if self.server_args.disaggregation_mode != "null" and params is not None:
        if params.custom_params is None or isinstance(params.custom_params, dict):
            params.custom_params = {**(params.custom_params or {}),
                                    release.WEIGHT_VERSION_STAMP: str(self.server_args.weight_version)}
    return result


def _after_async(hook):
    """An AFTER hook for a coroutine method: SGLang's registry calls AFTER hooks with the coroutine itself."""
    def around(original, self, *args, **kwargs):
        async def run():
            return hook(await original(self, *args, **kwargs), self, *args, **kwargs)

        return run()

    return around


@functools.cache  # once per process, whichever process kinds install it
def install_response_patches() -> None:
    target, request_at = release.response_target()
    register(target, _around(request_at), "around")
    if release.outputs_stamp_one_weight_version():
        for method in _WEIGHT_UPDATES_0_5_15:
            register(f"{_TM}.{method}", _after_async(note_weight_update), "around")
    if (stamp := release.weight_version_stamp_target()) is not None:
        register(stamp, stamp_weight_version, "after")


# The TokenizerManager methods that apply new weights in 0.5.15 (each returns (success, message, ...)).
_WEIGHT_UPDATES_0_5_15 = ("update_weights_from_disk", "update_weights_from_distributed", "update_weights_from_tensor",
                          "update_weights_from_ipc")
