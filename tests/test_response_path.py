"""The HTTP-process side of a routed /generate, in process: what it builds, and that the event loop keeps
serving while it builds (that the server's /generate is ours: tests/test_serving.py).

The event loop of SGLang's HTTP process serves every request; a long record's response (decode, build,
serialize) must not hold it. The responsiveness test observes that as an order of events on a real event
loop: a long response whose last build step cannot finish until another request has been answered on the
same loop. Bodies are checked against the rows the scheduler sent.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import types

import msgpack
import numpy as np
import pybase64
import pytest

from sglang_r3_server.generate import asked_of, respond_routed
from sglang_r3_server.schemas import RoutingOptions
from sglang_r3_server.wire import respond
from sglang_r3.serving.capture.payload import PayloadBytes, encode_payload
from sglang_r3.core.layout import LayerInfo, ModelLayout
from sglang_r3.serving.adapter.outputs import take_payload
from sglang_r3.core.record import RoutingRecord, token_digest
from sglang_r3.serving.response import PARKED, ask, unpark

pytestmark = pytest.mark.sglang

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


class _Request:
    """What the hook reads of an HTTP request: its ``state``, where our /generate put what it asked for."""

    def __init__(self):
        self.state = types.SimpleNamespace()


def _routed(out, asked, serialize=respond):
    """The output through the TokenizerManager hook (the payload parked, still encoded, since the request
    says what it asked for), then our /generate's response for it."""
    request = _Request()
    ask(request, asked)
    out = take_payload(None, request, out)
    return respond_routed(out, unpark(out), asked, LAYOUT, serialize=serialize)


def _record(resp) -> RoutingRecord:
    return RoutingRecord.from_wire(json.loads(resp.body)["meta_info"]["routing"])


# Bounds a wait that only a blocked event loop would exhaust: the test then fails (order shows it) instead of
# hanging. Nothing is measured against it.
_BLOCKED_LOOP_GUARD_S = 120


def test_the_event_loop_answers_another_request_while_a_long_records_response_is_being_built():
    long_out, long_experts = _finished_output(4095, 1)  # a 4k-token GLM-4.5 record: 2.9 MB of rows
    short_out, short_experts = _finished_output(2, 2)
    asked = asked_of(RoutingOptions.model_validate({"return_routing": True}), binary=False)
    order = []

    async def serve():
        loop = asyncio.get_running_loop()
        long_building = asyncio.Event()
        short_answered = threading.Event()

        def serialize_long(out, binary):
            # The long response's last build step: it cannot finish before another request was answered. Were
            # it running on the event loop, the loop could answer nothing until it returned.
            order.append("long response: being built")
            loop.call_soon_threadsafe(long_building.set)
            short_answered.wait(_BLOCKED_LOOP_GUARD_S)
            order.append("long response: built")
            return respond(out, binary)

        async def short_request():
            await long_building.wait()
            resp = await _routed(short_out, asked)
            order.append("short response: answered")
            short_answered.set()
            return resp

        long_resp = _routed(long_out, asked, serialize=serialize_long)
        return await asyncio.gather(long_resp, short_request())

    long_resp, short_resp = asyncio.run(serve())
    assert order == ["long response: being built", "short response: answered", "long response: built"]
    for resp, experts in ((long_resp, long_experts), (short_resp, short_experts)):
        rec = _record(resp)
        assert rec.layers == LAYOUT.moe_layer_ids and np.array_equal(rec.experts, experts)


def test_responses_finishing_together_each_carry_their_own_scheduler_rows():
    outs = [_finished_output(rows, seed) for seed, rows in enumerate((4095, 16, 4095, 1))]
    asked = asked_of(RoutingOptions.model_validate({"return_routing": True}), binary=False)

    async def serve():
        return await asyncio.gather(*(_routed(o, asked) for o, _ in outs))

    for resp, (_, experts) in zip(asyncio.run(serve()), outs):
        rec = _record(resp)
        assert rec.layers == LAYOUT.moe_layer_ids and np.array_equal(rec.experts, experts)


def test_the_payload_crosses_to_sglangs_detokenizer_as_bytes_it_encodes_unchanged():
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager

    _, experts = _finished_output(5, 7)
    payload = encode_payload(0, experts, None, tokens_digest="ab" * 16)
    item = pickle.loads(pickle.dumps(PayloadBytes(payload), protocol=pickle.HIGHEST_PROTOCOL))  # the ZMQ hop
    assert not hasattr(item, "storage")  # not a tensor: no tensor pickling on the way
    [b64] = DetokenizerManager._b64_encode_per_request([item])
    assert pybase64.b64decode(b64) == payload


def test_a_request_that_did_not_say_gets_sglangs_contract_from_the_hook_itself(monkeypatch):
    # The OpenAI endpoints' HTTP request (no state of ours) and sglang.Engine's (none): upstream's int32
    # routed_experts and the record's JSON wire form, built where the output leaves the TokenizerManager.
    import sglang_r3.serving.adapter.outputs as hook

    monkeypatch.setattr(hook, "served_layout", lambda tm: LAYOUT)
    for request in (None, _Request()):
        out, experts = _finished_output(6, 3)
        meta = hook.take_payload(None, request, out)["meta_info"]
        assert PARKED not in meta
        assert np.array_equal(RoutingRecord.from_wire(meta["routing"]).experts, experts)
        up = np.frombuffer(pybase64.b64decode(meta["routed_experts"]), dtype=np.int32).reshape(6, 92, 8)
        assert np.array_equal(up[:, 3:], experts) and not up[:, :3].any()


def test_a_record_asked_by_reference_goes_to_the_store_once_and_the_body_carries_only_its_handle(monkeypatch):
    from sglang_r3_server import refs
    from sglang_r3.core.settings import StoreSettings

    cfg = StoreSettings(store="r3-store-e0", namespace="ns", engine="e0", incarnation=3, ray_address="auto")
    stored = []

    async def put(c, rid, rec):
        stored.append((rid, rec))
        return {"ok": True}

    monkeypatch.setattr(refs, "config", lambda: cfg)
    monkeypatch.setattr(refs, "_put", put)
    opts = RoutingOptions.model_validate({"return_routing": {"ref": True}, "return_routed_experts": True})
    out, experts = _finished_output(5, 4)
    meta = msgpack.unpackb(asyncio.run(_routed(out, asked_of(opts, binary=True))).body, raw=False)["meta_info"]
    [(rid, rec)] = stored
    assert rid == "r4" and np.array_equal(rec.experts, experts)
    assert "routing" not in meta and PARKED not in meta and meta["routed_experts"]
    assert meta["routing_ref"] == {"store": "r3-store-e0", "namespace": "ns", "engine": "e0", "incarnation": 3,
                                   "rid": "r4", "start": 0, "num_tokens": 5, "weight_version": "default",
                                   "tokens_digest": rec.tokens_digest}
