"""RoutingClient / AsyncRoutingClient against a scripted HTTP transport (wire handling, errors, batching)."""

from __future__ import annotations

import asyncio
import json

import httpx
import msgpack
import numpy as np
import pytest

from sglang_r3.trainer.client import (
    AsyncRoutingClient,
    RoutingArgumentError,
    RoutingClient,
    RoutingClientError,
    RoutingServerError,
    RoutingUnavailableError,
    decode_routing,
    parse_outputs,
)
from sglang_r3.core.layout import LayerInfo, ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord, token_digest

pytestmark = pytest.mark.fast

LAYOUT = ModelLayout(
    "Glm4MoeForCausalLM",
    2,
    (LayerInfo(0, "dense"), LayerInfo(1, "moe", None, 8, 2), LayerInfo(2, "mtp", 1, 8, 2)),
)


def _record(T: int, seed: int, tokens=None, weight_version=None) -> RoutingRecord:
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.permutation(8)[:2] for _ in range(T - 1)]).reshape(T - 1, 1, 2).astype(np.uint8)
    digest = token_digest(tokens) if tokens is not None else None
    return RoutingRecord(LAYOUT.fingerprint, 0, LAYOUT.moe_layer_ids, experts, weight_version=weight_version,
                         tokens_digest=digest)


class FakeServer:
    """Answers like the routing server: one output per prompt (x n), routing rows T-1 for T = prompt + 3 outputs.

    unavailable: output index -> meta_info["routing_error"] to send instead of routing for that output.
    """

    def __init__(self, unavailable=None):
        self.requests = []
        self.unavailable = dict(unavailable or {})

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        binary = "application/msgpack" in request.headers.get("accept", "")
        if request.url.path == "/routing/layout":
            return httpx.Response(200, json=LAYOUT.to_dict())
        body = json.loads(request.content)
        if body.get("routing_start", 0) > 100:
            return httpx.Response(
                400,
                json={"error": {"message": "routing_start=101 is beyond the prompt", "type": "invalid_request_error",
                                "field": "routing_start"}},
            )
        prompts = body.get("input_ids") or [[7] * len(t) for t in body["text"]]
        n = body["sampling_params"].get("n", 1)
        outs = []
        for i, ids in enumerate(prompts):
            for j in range(n):
                out_ids = [40 + j, 41, 42]
                rec = _record(len(ids) + 3, seed=100 * i + j, tokens=list(ids) + out_ids, weight_version="5")
                meta = {"prompt_tokens": len(ids), "weight_version": "5"}
                if len(outs) in self.unavailable:
                    meta["routing_error"] = self.unavailable[len(outs)]
                else:
                    meta["routing"] = rec.to_wire(binary=binary)
                outs.append({"text": "abc", "output_ids": out_ids, "meta_info": meta})
        if binary:
            return httpx.Response(200, content=msgpack.packb(outs, use_bin_type=True),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(200, json=outs)


def _client(server, **kw) -> RoutingClient:
    return RoutingClient("http://r3", client=httpx.Client(transport=httpx.MockTransport(server)), **kw)


def test_msgpack_is_the_default_and_records_decode():
    server = FakeServer()
    results = _client(server).generate(input_ids=[[1, 2, 3], [4, 5]], sampling_params={"max_new_tokens": 3})
    req = server.requests[0]
    assert req.headers["accept"] == "application/msgpack"
    sent = json.loads(req.content)
    assert sent["return_routing"] is True and sent["input_ids"] == [[1, 2, 3], [4, 5]]
    assert [r.prompt_ids for r in results] == [[1, 2, 3], [4, 5]]
    assert results[0].tokens == [1, 2, 3, 40, 41, 42]
    for i, r in enumerate(results):
        assert r.record.num_tokens == r.num_tokens - 1
        assert np.array_equal(r.record.experts, _record(r.num_tokens, 100 * i).experts)
        assert r.weight_version == "5" and r.tokens_digest == token_digest(r.tokens)


def test_json_fallback_gives_the_same_records():
    a = _client(FakeServer()).generate(input_ids=[1, 2, 3, 4])
    server = FakeServer()
    b = _client(server, binary=False).generate(input_ids=[1, 2, 3, 4])
    assert server.requests[0].headers["accept"] == "application/json"
    assert np.array_equal(a[0].record.experts, b[0].record.experts)


def test_options_go_on_the_wire():
    server = FakeServer()
    _client(server).generate("hello", {"temperature": 0}, routing_start=1, mtp=True)
    sent = json.loads(server.requests[0].content)
    assert sent == {"text": ["hello"], "sampling_params": {"temperature": 0},
                    "return_routing": {"mtp": True}, "routing_start": 1}


def test_text_prompts_have_length_but_no_ids():
    (r,) = _client(FakeServer()).generate("hi there")
    assert r.prompt_ids is None and r.prompt_len == 8
    with pytest.raises(RoutingClientError, match="send input_ids"):
        r.tokens


def test_n_samples_per_prompt_map_back_to_their_prompt():
    results = _client(FakeServer()).generate(input_ids=[[1, 2], [3, 4, 5]], sampling_params={"n": 2})
    assert [r.prompt_ids for r in results] == [[1, 2], [1, 2], [3, 4, 5], [3, 4, 5]]
    assert [r.output_ids[0] for r in results] == [40, 41, 40, 41]


def test_layout():
    assert _client(FakeServer()).layout() == LAYOUT


def test_4xx_carries_the_servers_message_and_field():
    with pytest.raises(RoutingServerError) as e:
        _client(FakeServer()).generate(input_ids=[1, 2], routing_start=101)
    err = e.value
    assert err.status == 400 and err.is_client_error and err.field == "routing_start"
    assert err.message == "routing_start=101 is beyond the prompt"
    assert "HTTP 400" in str(err) and "routing_start=101 is beyond the prompt" in str(err)


@pytest.mark.parametrize(
    "response, message",
    [
        (httpx.Response(400, json={"object": "error", "message": "bad sampling params", "code": 400}), "bad sampling params"),
        (httpx.Response(422, json={"detail": [{"loc": ["body"], "msg": "field required"}]}), "field required"),
        (httpx.Response(503, text="upstream down"), "upstream down"),
    ],
)
def test_other_error_bodies(response, message):
    with pytest.raises(RoutingServerError, match=message) as e:
        _client(lambda req: response).generate(input_ids=[1])
    assert e.value.status == response.status_code


def test_unreachable_server():
    def refuse(req):
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(RoutingClientError, match=r"cannot reach http://r3/generate"):
        _client(refuse).generate(input_ids=[1])


def test_decode_routing_from_meta_info():
    rec = _record(5, 0)
    for binary in (False, True):
        assert np.array_equal(decode_routing({"routing": rec.to_wire(binary)}).experts, rec.experts)
    with pytest.raises(RecordError, match="no 'routing'"):
        decode_routing({"prompt_tokens": 3})


@pytest.mark.parametrize("call, message", [
    ({}, "exactly one of prompts or input_ids"),
    ({"prompts": "x", "input_ids": [1]}, "exactly one of prompts or input_ids"),
    ({"prompts": []}, "prompts must be a string or a non-empty list of strings"),
    ({"prompts": ["a", 3]}, "prompts must be a string or a non-empty list of strings"),
    ({"input_ids": []}, "input_ids must not be empty"),
    ({"input_ids": "1 2 3"}, "input_ids must be token ids, got str"),
    ({"input_ids": 7}, "input_ids must be a list of token ids, got int"),
    ({"input_ids": [[1, 2], []]}, r"input_ids\[1\] must not be empty"),
    ({"input_ids": [[1, 2], [3, "x"]]}, r"input_ids\[1\] holds 'x', not a token id"),
    ({"input_ids": [[1, 2], [3, 1.5]]}, r"input_ids\[1\] holds 1.5, not a token id"),
    ({"input_ids": [1, None]}, r"input_ids\[0\] must be a token id or a list of token ids"),
])
def test_a_malformed_call_raises_the_documented_error_and_sends_nothing(call, message):
    # docs/api.md: RoutingClientError for a malformed call; still a ValueError for callers that caught one.
    server = FakeServer()
    c = _client(server)
    with pytest.raises(RoutingArgumentError, match=message) as e:
        c.generate(**call)
    assert isinstance(e.value, RoutingClientError) and isinstance(e.value, ValueError)
    with pytest.raises(RoutingArgumentError, match=message):
        asyncio.run(_async_generate(call))
    assert server.requests == []


async def _async_generate(call):
    async with AsyncRoutingClient("http://r3", client=httpx.AsyncClient(transport=httpx.MockTransport(FakeServer()))) as c:
        return await c.generate(**call)


def test_a_malformed_batch_size_is_the_same_error():
    with pytest.raises(RoutingArgumentError, match="batch_size must be >= 1"):
        _client(FakeServer()).generate_many([[1]], batch_size=0)


def test_integer_ids_of_numpy_are_token_ids():
    server = FakeServer()
    _client(server).generate(input_ids=np.array([1, 2, 3]))
    _client(server).generate(input_ids=[np.array([4, 5], dtype=np.int32)])
    assert [json.loads(r.content)["input_ids"] for r in server.requests] == [[[1, 2, 3]], [[4, 5]]]


def test_sync_generate_many_in_batches():
    server = FakeServer()
    seqs = [[i, i + 1] for i in range(5)]
    results = _client(server).generate_many(seqs, batch_size=2)
    assert [r.prompt_ids for r in results] == seqs and len(server.requests) == 3


def test_async_generate_many_bounds_concurrency_and_keeps_order():
    inner = FakeServer()
    state = {"now": 0, "max": 0}

    async def handler(request):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return inner(request)

    async def main():
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with AsyncRoutingClient("http://r3", client=http) as c:
            seqs = [[i, i + 1, i + 2] for i in range(9)]
            results = await c.generate_many(seqs, batch_size=2, concurrency=2)
            layout = await c.layout()
        await http.aclose()
        return seqs, results, layout

    seqs, results, layout = asyncio.run(main())
    assert [r.prompt_ids for r in results] == seqs
    assert state["max"] == 2 and layout == LAYOUT
    assert all(r.record.num_tokens == r.num_tokens - 1 for r in results)


def test_async_error_propagates():
    async def main():
        http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: FakeServer()(r)))
        c = AsyncRoutingClient("http://r3", client=http)
        try:
            await c.generate_many([[1, 2]] * 3, routing_start=101, batch_size=1)
        finally:
            await http.aclose()

    with pytest.raises(RoutingServerError, match="beyond the prompt"):
        asyncio.run(main())


# --- samples without trustworthy routing ----------------------------------------------------------------

MISSING = {"code": "missing_rows", "message": "3 rows were never written by a target forward", "missing_rows": 3, "rows": 9}


@pytest.mark.parametrize("binary", [False, True])
def test_decode_routing_raises_for_a_routing_error(binary):
    meta = {"prompt_tokens": 5, "routing_error": MISSING}
    if binary:  # as the msgpack transport delivers it
        meta = msgpack.unpackb(msgpack.packb(meta, use_bin_type=True), raw=False)
    else:
        meta = json.loads(json.dumps(meta))
    with pytest.raises(RoutingUnavailableError, match=r"output 4 has no trustworthy routing \[missing_rows\] \(3 of 9 rows "
                                                      r"missing\): 3 rows were never written") as e:
        decode_routing(meta, sample=4)
    err = e.value
    assert isinstance(err, RoutingClientError)
    assert (err.sample, err.code, err.missing_rows, err.rows) == (4, "missing_rows", 3, 9)
    assert err.message == MISSING["message"]


def test_a_routing_error_wins_over_a_routing_field():
    # the server said not to trust it; a record next to the error is not used
    meta = {"routing": _record(5, 0).to_wire(), "routing_error": {"code": "capture_off", "message": "capture is off"}}
    with pytest.raises(RoutingUnavailableError, match=r"\[capture_off\]") as e:
        decode_routing(meta)
    assert e.value.sample is None and e.value.missing_rows is None and e.value.rows is None


def test_a_malformed_routing_error_still_refuses():
    with pytest.raises(RoutingUnavailableError, match=r"\[unknown\].*routing lost"):
        decode_routing({"routing_error": "routing lost"})


@pytest.mark.parametrize("binary", [True, False])
def test_generate_names_the_first_sample_without_routing_and_counts_all(binary):
    off = {"code": "capture_off", "message": "capture was switched off", "missing_rows": 4, "rows": 4}
    server = FakeServer(unavailable={1: MISSING, 3: off})
    with pytest.raises(RoutingUnavailableError, match=r"output 1 has no trustworthy routing \[missing_rows\].*"
                                                      r"2 output\(s\) of the batch have no routing: \[1, 3\]") as e:
        _client(server, binary=binary).generate(input_ids=[[1, 2], [3, 4, 5]], sampling_params={"n": 2})
    assert e.value.sample == 1 and e.value.affected == (1, 3) and e.value.code == "missing_rows"


def test_parse_outputs_without_routing_ignores_routing_errors():
    body = [{"output_ids": [9], "meta_info": {"prompt_tokens": 2, "routing_error": MISSING, "weight_version": "w"}}]
    (r,) = parse_outputs(body, [[1, 2]], 1, with_routing=False)
    assert r.record is None and r.weight_version == "w"


def test_weight_version_from_the_record_when_meta_info_has_none():
    rec = _record(4, 0, tokens=[1, 2, 3, 9], weight_version="r7")
    (r,) = parse_outputs([{"output_ids": [9], "meta_info": {"prompt_tokens": 3, "routing": rec.to_wire(True)}}], [[1, 2, 3]], 1)
    assert r.weight_version == "r7" and r.tokens_digest == token_digest(r.tokens)
