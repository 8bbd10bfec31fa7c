"""The HTTP-process side of a routed /generate, called in process: where each step runs, and what it builds.

The event loop of SGLang's HTTP process serves every request; a burst of long records finishing together
must not be decoded, built and serialized on it. These tests pin where that work runs (the loop only
hands the still-encoded payload on; long records are built on the builder thread), and that the body
equals the record built directly from the rows the scheduler sent.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading

import numpy as np
import pybase64
import pytest

from server import routes
from server.schemas import RoutingOptions
from sglang_r3.capture.transport import NATIVE_ROUTING, EncodedRouting, PayloadBytes, encode_payload
from sglang_r3.layout import LayerInfo, ModelLayout
from sglang_r3.patches import responses
from sglang_r3.record import RoutingRecord, token_digest

# GLM-4.5's routed part: 89 MoE layers after 3 dense ones, 160 experts, top-8.
LAYOUT = ModelLayout("Glm4MoeForCausalLM", 92, tuple(
    LayerInfo(i, "dense") if i < 3 else LayerInfo(i, "moe", None, 160, 8) for i in range(92)))


def _finished_output(rows: int, seed: int):
    """A finished output as SGLang's detokenizer hands it to the TokenizerManager: the scheduler's payload,
    base64-encoded (DetokenizerManager._b64_encode_per_request)."""
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((rows, 89, 160)), axis=-1)[..., :8].astype(np.uint8)
    tokens = rng.integers(0, 1000, rows + 1)
    payload = encode_payload(0, experts, None, tokens_digest=token_digest(tokens))
    out = {"text": "", "output_ids": [], "meta_info": {"id": f"r{seed}", "weight_version": "default",
                                                       "routed_experts": pybase64.b64encode(payload).decode()}}
    return out, experts


def _through_hook(out):
    token = NATIVE_ROUTING.set(True)
    try:
        return responses._to_contract(None, out)
    finally:
        NATIVE_ROUTING.reset(token)


def test_the_tokenizer_manager_hook_hands_our_route_the_payload_still_encoded():
    out, _ = _finished_output(8, 0)
    raw = out["meta_info"]["routed_experts"]
    meta = _through_hook(out)["meta_info"]
    assert isinstance(meta["routed_experts"], EncodedRouting) and meta["routed_experts"].raw is raw


@pytest.mark.parametrize("rows,off_loop", [(4095, True), (16, False)])
def test_long_records_are_built_off_the_event_loop_and_equal_the_scheduler_rows(monkeypatch, rows, off_loop):
    built_on = []
    original = routes.attach_routing

    def spy(*args, **kwargs):
        built_on.append(threading.current_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(routes, "attach_routing", spy)
    outs = [_finished_output(rows, seed) for seed in range(3)]
    opts = RoutingOptions.model_validate({"return_routing": True})

    async def serve():
        loop_thread = threading.current_thread()
        bodies = await asyncio.gather(*(routes.respond_routed(_through_hook(o), opts, LAYOUT, False) for o, _ in outs))
        return loop_thread, bodies

    loop_thread, bodies = asyncio.run(serve())
    assert len(built_on) == 3
    assert all((t is not loop_thread) == off_loop for t in built_on)
    for resp, (_, experts) in zip(bodies, outs):
        rec = RoutingRecord.from_wire(json.loads(resp.body)["meta_info"]["routing"])
        assert rec.layers == LAYOUT.moe_layer_ids and np.array_equal(rec.experts, experts)


def test_the_payload_crosses_to_sglangs_detokenizer_as_bytes_it_encodes_unchanged():
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager

    _, experts = _finished_output(5, 7)
    payload = encode_payload(0, experts, None, tokens_digest="ab" * 16)
    item = pickle.loads(pickle.dumps(PayloadBytes(payload), protocol=pickle.HIGHEST_PROTOCOL))  # the ZMQ hop
    assert not hasattr(item, "storage")  # not a tensor: no tensor pickling on the way
    [b64] = DetokenizerManager._b64_encode_per_request([item])
    assert pybase64.b64decode(b64) == payload


def test_our_routes_take_the_place_of_sglangs_generate_in_its_app():
    # Starlette matches routes in order: /generate stays where SGLang put its own (early), not after all of
    # SGLang's routes, and every other SGLang route keeps its order.
    from sglang.srt.entrypoints import http_server

    from sglang_r3.patches.http import install_http_routes

    paths = [getattr(r, "path", None) for r in http_server.app.router.routes]
    ours = {r.path for r in routes.router.routes}
    install_http_routes()
    after = http_server.app.router.routes
    after_paths = [getattr(r, "path", None) for r in after]
    assert after_paths.count("/generate") == 1
    assert after[after_paths.index("/generate")].endpoint is routes.generate
    assert after_paths.index("/generate") == paths.index("/generate")
    assert [p for p in after_paths if p not in ours] == [p for p in paths if p not in ours]
    install_http_routes()  # a second install replaces ours in place
    assert [getattr(r, "path", None) for r in http_server.app.router.routes] == after_paths
