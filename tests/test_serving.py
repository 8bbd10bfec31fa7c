"""Issue 2: a real SGLang server captures main-model MoE routing and returns role-tagged records."""

from __future__ import annotations

import base64
import io
import json

import httpx
import msgpack
import numpy as np
import pytest

from sglang_r3.dev.embedded import EMBEDDED_CONFIG
from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RoutingRecord
from tests.support.routing_http import TIMEOUT, fetch_layout, flush_cache, full_ids, greedy, ids, record_of
from tests.support.servers import assert_main_rows_equal_plain_sglang

pytestmark = pytest.mark.release  # also run on SGLang 0.5.15.post1 (.ci/release-env)

PROMPTS = ["The quick brown fox", "Routing replay keeps the policy ratio honest.", "abc"]
E = EMBEDDED_CONFIG["n_routed_experts"]
K = EMBEDDED_CONFIG["num_experts_per_tok"]


@pytest.fixture(scope="module")
def url(nospec_server):
    return nospec_server


@pytest.fixture(scope="module")
def layout(url) -> ModelLayout:
    return fetch_layout(url)


def test_layout_roles_of_embedded_model(layout):
    roles = [(l.id, l.role, l.depth) for l in layout.layers]
    assert roles == [(0, "dense", None), (1, "moe", None), (2, "moe", None), (3, "moe", None), (4, "mtp", 1)]
    assert layout.moe_layer_ids == (1, 2, 3)
    assert layout.topk == K and layout.num_experts == E
    assert layout.layer(4).num_experts == E  # GLM's NextN layer is MoE


def test_layout_is_in_openapi(url):
    spec = httpx.get(url + "/openapi.json", timeout=TIMEOUT).json()
    assert "/routing/layout" in spec["paths"]
    assert "LayoutResponse" in json.dumps(spec)
    gen = spec["paths"]["/generate"]["post"]
    assert "return_routing" in json.dumps(gen)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_rows_are_T_minus_1_and_in_range(url, layout, prompt):
    out = greedy(url, 12, input_ids=ids(prompt), return_routing=True)
    rec = record_of(out)
    T = len(ids(prompt)) + len(out["output_ids"])
    assert rec.num_tokens == T - 1
    assert rec.start == 0
    assert rec.layout == layout.fingerprint
    assert rec.layers == layout.moe_layer_ids
    assert rec.experts.dtype == np.uint8
    assert rec.experts.max() < E
    # top-k ids of one token in one layer are distinct experts
    assert all(len(set(row)) == K for row in rec.experts.reshape(-1, K).tolist())


def test_batched_requests(url):
    outs = greedy(url, 10, text=PROMPTS, return_routing=True)
    assert isinstance(outs, list) and len(outs) == len(PROMPTS)
    singles = [greedy(url, 10, text=p, return_routing=True) for p in PROMPTS]
    for prompt, batched, single in zip(PROMPTS, outs, singles):
        rb, rs = record_of(batched), record_of(single)
        assert rb.num_tokens == len(ids(prompt)) + len(batched["output_ids"]) - 1
        assert batched["output_ids"] == single["output_ids"]
        np.testing.assert_array_equal(rb.experts, rs.experts)


def test_teacher_forced_fidelity(url):
    """The rows of a generation equal the rows of recomputing the same sequence as a prompt (cache flushed)."""
    prompt = ids("Teacher forcing: ")
    gen = greedy(url, 24, input_ids=prompt, return_routing=True)
    seq = full_ids(gen, prompt)
    flush_cache(url)
    forced = greedy(url, 1, input_ids=seq, return_routing=True)
    assert forced["meta_info"]["cached_tokens"] == 0
    r_gen, r_forced = record_of(gen), record_of(forced)
    assert r_forced.num_tokens == len(seq)  # T+1 tokens -> T rows
    np.testing.assert_array_equal(r_forced.experts[: len(seq) - 1], r_gen.experts)


def test_prefix_cache_hit_returns_same_rows(url):
    prompt = ids("A prompt that will be cached, then served again from the radix cache.")
    flush_cache(url)
    first = greedy(url, 8, input_ids=prompt, return_routing=True)
    second = greedy(url, 8, input_ids=prompt, return_routing=True)
    assert second["meta_info"]["cached_tokens"] > 0
    np.testing.assert_array_equal(record_of(first).experts, record_of(second).experts)


@pytest.mark.parametrize("start", [1, 5, 13])
def test_routing_start_slices(url, start):
    prompt = ids("partial rollout prompt")
    full = greedy(url, 8, input_ids=prompt, return_routing=True)
    part = greedy(url, 8, input_ids=prompt, return_routing=True, routing_start=start)
    rf, rp = record_of(full), record_of(part)
    assert rp.start == start
    assert rp.num_tokens == rf.num_tokens - start
    np.testing.assert_array_equal(rp.experts, rf.experts[start:])


def test_routing_start_at_prompt_length_is_allowed(url):
    prompt = ids("edge")
    out = greedy(url, 4, input_ids=prompt, return_routing=True, routing_start=len(prompt))
    rec = record_of(out)
    assert rec.start == len(prompt)
    assert rec.num_tokens == len(out["output_ids"]) - 1


def test_main_rows_equal_plain_sglangs_own_capturer_on_our_launcher(nospec_server, routing_server, plain_server):
    """The oracle of main rows: plain SGLang's own capturer (tests/conftest.py's ``plain_server``: no sglang-r3,
    ``--enable-return-routed-experts``, spec off) on the same greedy requests. Our launcher (``python -m
    sglang_r3.launch_server``) spec off and with MTP speculation on (its main rows are the verify passes')."""
    for mode, ours_url in (("spec off", nospec_server), ("MTP on", routing_server)):
        for prompt in PROMPTS:
            plain = greedy(plain_server, 12, input_ids=ids(prompt), return_routed_experts=True)
            ours = greedy(ours_url, 12, input_ids=ids(prompt), return_routing=True, return_routed_experts=True)
            assert_main_rows_equal_plain_sglang(ours, plain, len(ids(prompt)), f"our launcher, {mode}: {prompt!r}")


def test_format_check_our_routed_experts_field_re_encodes_our_record_at_moe_layers(url, layout):
    """Format check: our field re-encodes our record (``sglang_r3/serving/response.py``'s ``upstream_view``), in
    upstream's form. Not an oracle: both sides are our capture (plain SGLang's is, in the test above)."""
    prompt = ids("upstream compatibility")
    out = greedy(url, 8, input_ids=prompt, return_routing=True, return_routed_experts=True)
    rec = record_of(out)
    up = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), dtype=np.int32)
    up = up.reshape(-1, layout.num_hidden_layers, K)
    assert up.shape[0] == rec.num_tokens, "format check: our field re-encodes our record"
    np.testing.assert_array_equal(up[:, list(layout.moe_layer_ids), :], rec.experts.astype(np.int32),
                                  err_msg="format check: our field re-encodes our record")
    assert not up[:, 0, :].any()  # the dense layer, as upstream returns it


def test_format_check_our_routed_experts_field_alone_keeps_upstream_shape(url, layout):
    """Format check: our field alone (slime's request) is upstream's shape, ``[T-1, num_hidden_layers, topk]``."""
    out = greedy(url, 4, input_ids=ids("slime path"), return_routed_experts=True)
    assert "routing" not in out["meta_info"]
    up = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), dtype=np.int32)
    T = len(ids("slime path")) + len(out["output_ids"])
    assert up.size == (T - 1) * layout.num_hidden_layers * K


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
def test_a_stream_carries_the_record_and_the_routed_experts_field_in_its_last_frame_only(url, layout, accept):
    prompt = ids("streamed routing")
    want = record_of(greedy(url, 6, input_ids=prompt, return_routing=True))
    body = {"input_ids": prompt, "stream": True, "return_routing": True, "return_routed_experts": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 6}}
    r = httpx.post(url + "/generate", json=body, headers={"accept": accept}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    if accept == "application/msgpack":
        frames = list(msgpack.Unpacker(io.BytesIO(r.content), raw=False))
    else:
        events = [e for e in r.content.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        frames = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    *head, last = frames
    assert head and all(not {"routing", "routed_experts", "routing_error"} & set(f["meta_info"]) for f in head)
    assert not [k for f in frames for k in f["meta_info"] if k.startswith("_")]  # nothing private leaks
    rec = RoutingRecord.from_wire(last["meta_info"]["routing"])
    np.testing.assert_array_equal(rec.experts, want.experts)
    up = np.frombuffer(base64.b64decode(last["meta_info"]["routed_experts"]), dtype=np.int32)
    up = up.reshape(-1, layout.num_hidden_layers, K)
    np.testing.assert_array_equal(up[:, list(layout.moe_layer_ids), :], rec.experts.astype(np.int32),
                                  err_msg="format check: our field re-encodes our record")


def test_no_routing_when_not_asked(url):
    out = greedy(url, 4, input_ids=ids("plain"))
    assert "routing" not in out["meta_info"] and "routed_experts" not in out["meta_info"]


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"return_routing": "yes"}, "return_routing"),
        ({"return_routing": 1}, "return_routing"),
        ({"return_routing": {"mtp": "please"}}, "return_routing"),
        ({"return_routing": {"draft": True}}, "return_routing"),
        ({"return_routing": True, "routing_start": -1}, "routing_start"),
        ({"return_routing": True, "routing_start": "3"}, "routing_start"),
        ({"return_routing": True, "routing_start": 10_000}, "routing_start"),
        ({"routing_start": 2}, "routing_start"),
    ],
)
def test_bad_routing_options_get_400_naming_the_field(url, extra, field):
    body = {"input_ids": ids("bad options"), "sampling_params": {"max_new_tokens": 2}, **extra}
    r = httpx.post(url + "/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["field"] == field
    assert field in err["message"]


def test_text_prompt_routing_start_beyond_prompt_is_400(url):
    r = httpx.post(
        url + "/generate",
        json={"text": "four", "return_routing": True, "routing_start": 5, "sampling_params": {"max_new_tokens": 2}},
        timeout=TIMEOUT,
    )
    assert r.status_code == 400 and "4 tokens" in r.json()["error"]["message"]


def test_malformed_body_is_400(url):
    r = httpx.post(url + "/generate", content=b"{not json", headers={"content-type": "application/json"}, timeout=TIMEOUT)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/generate", json=[1, 2], timeout=TIMEOUT)
    assert r.status_code == 400


def test_server_still_serves_after_bad_requests(url):
    out = greedy(url, 4, input_ids=ids("still alive"), return_routing=True)
    assert record_of(out).num_tokens == len(ids("still alive")) + 3


def test_capture_counters(url):
    stats = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()
    assert len(stats) == 1
    assert stats[0]["main_rows_written"] > 0
    assert stats[0]["main_captures_from_draft"] == 0
    assert stats[0]["unknown_layer_captures"] == 0


# meta_info["routing"] as the README publishes it.
ROUTING_FIELDS = {"layout", "start", "num_tokens", "layers", "topk", "dtype", "experts", "weight_version",
                  "tokens_digest"}


def test_the_servers_generate_is_ours_and_sglangs_other_routes_still_answer(nospec_server):
    # SGLang's own /generate ignores fields it does not know: it would generate without a record for
    # `return_routing: true`, and generate (200) for a malformed one. Ours returns the record, and a 400
    # naming the field.
    ids = [5, 17, 42, 99, 3]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    r = httpx.post(nospec_server + "/generate", json={**body, "return_routing": True}, timeout=120)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert set(meta["routing"]) == ROUTING_FIELDS and "routed_experts" not in meta
    from sglang_r3.core.record import RoutingRecord

    rec = RoutingRecord.from_wire(meta["routing"])
    assert rec.start == 0 and rec.num_tokens == len(ids) + len(r.json()["output_ids"]) - 1

    bad = httpx.post(nospec_server + "/generate", json={**body, "return_routing": "yes"}, timeout=120)
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "return_routing", bad.text
    packed = httpx.post(nospec_server + "/generate", json={**body, "return_routing": True}, timeout=120,
                        headers={"Accept": "application/msgpack"})
    assert packed.headers["content-type"].startswith("application/msgpack")

    # The routes around it are still SGLang's own.
    assert httpx.get(nospec_server + "/health_generate", timeout=120).status_code == 200
    models = httpx.get(nospec_server + "/v1/models", timeout=120)
    assert models.status_code == 200 and models.json()["data"], models.text
