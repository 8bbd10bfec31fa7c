"""A row is captured or it is missing, never invented; every endpoint keeps its contract.

The oracle is SGLang itself: the same greedy request's rows from a fresh forward (cache
flushed), upstream's own ``/v1`` plumbing, and SGLang's admin-key and metrics machinery.
"""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import pytest

from sglang_r3.trainer.client import RoutingClient, RoutingUnavailableError
from sglang_r3.dev.embedded import EMBEDDED_CONFIG
from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import token_digest
from tests.conftest import ADMIN_KEY
from tests.support.routing_http import TIMEOUT, fetch_layout, flush_cache, greedy, ids, record_of

pytestmark = pytest.mark.release  # also run on SGLang 0.5.15.post1 (.ci/release-env)

K = EMBEDDED_CONFIG["num_experts_per_tok"]


def set_capture(url: str, mode: str, key: str = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/routing/capture", json={"mode": mode}, headers=headers, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def url(nospec_server):
    return nospec_server


@pytest.fixture(scope="module")
def layout(url) -> ModelLayout:
    return fetch_layout(url)


def upstream_rows(b64: str, layout: ModelLayout) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.int32).reshape(-1, layout.num_hidden_layers, K)


def test_capture_off_gives_routing_error_and_no_rows_then_recovers_after_a_flush(url):
    prompt = ids("capture switched off mid-run")
    flush_cache(url)
    baseline = record_of(greedy(url, 6, input_ids=prompt, return_routing=True))
    flush_cache(url)
    try:
        assert set_capture(url, "off").status_code == 200
        out = greedy(url, 6, input_ids=prompt, return_routing=True, return_routed_experts=True)
        meta = out["meta_info"]
        assert "routing" not in meta and "routed_experts" not in meta
        err = meta["routing_error"]
        T = len(prompt) + len(out["output_ids"])
        assert err["code"] == "capture_off" and err["missing_rows"] == err["rows"] == T - 1
        assert f"{T - 1} of {T - 1} rows" in err["message"]
        with RoutingClient(url) as client, pytest.raises(RoutingUnavailableError) as info:
            client.generate(input_ids=[prompt], sampling_params={"max_new_tokens": 6, "temperature": 0})
        assert info.value.code == "capture_off"

        assert set_capture(url, "main+mtp").status_code == 200
        # The prompt's KV is still cached from forwards that captured nothing: those rows stay missing.
        out = greedy(url, 6, input_ids=prompt, return_routing=True)
        err = out["meta_info"]["routing_error"]
        assert err["code"] == "missing_rows" and 0 < err["missing_rows"] < err["rows"]
        assert "routing" not in out["meta_info"]
    finally:
        set_capture(url, "main+mtp")
        flush_cache(url)
    again = record_of(greedy(url, 6, input_ids=prompt, return_routing=True))
    np.testing.assert_array_equal(again.experts, baseline.experts)


def test_records_carry_the_weight_version_and_the_samples_token_digest(url):
    prompt = ids("identity")
    out = greedy(url, 5, input_ids=prompt, return_routing=True)
    rec = record_of(out)
    assert rec.weight_version == out["meta_info"]["weight_version"]
    assert rec.tokens_digest == token_digest(prompt + out["output_ids"])


def _held(url: str) -> int:
    return sum(s["requests_held"] for s in httpx.get(url + "/routing/stats", timeout=TIMEOUT).json())


def test_a_request_that_spans_a_weight_update_is_marked_mixed_and_the_trainer_refuses_it(url, layout):
    # slime's partial rollouts: generation paused in place, new weights loaded under a new version, generation
    # resumed. The request routed its first tokens under the old weights and the rest under the new ones:
    # 0.5.23 says so in its weight_versions spans, 0.5.15 only by the updates its TokenizerManager applied
    # while the request ran (adapter/outputs.py). Either way the record must not pass as one version.
    import threading
    import time

    from sglang_r3.core.record import RecordError
    from sglang_r3.trainer import check_records

    info = httpx.get(url + "/get_model_info", timeout=TIMEOUT).json()
    before = greedy(url, 1, input_ids=ids("version before"))["meta_info"]["weight_version"]
    prompt = ids("a long rollout that a weight update interrupts")
    out = {}
    t = threading.Thread(target=lambda: out.update(greedy(
        url, 400, input_ids=prompt, return_routing=True, sampling_params={"ignore_eos": True})))
    t.start()
    try:
        while t.is_alive() and not _held(url):  # until the scheduler holds it (the update must land inside it)
            time.sleep(0.05)
        assert t.is_alive(), "the request finished before the scheduler was seen holding it"
        httpx.post(url + "/pause_generation", json={"mode": "in_place"}, timeout=TIMEOUT).raise_for_status()
        assert _held(url) == 1, "the request finished before generation was paused"
        # The request keeps its KV through the update (pause "in_place"): the cache cannot be flushed under it.
        r = httpx.post(url + "/update_weights_from_disk", timeout=TIMEOUT,
                       json={"model_path": info["model_path"], "weight_version": "v2-span", "flush_cache": False})
        assert r.status_code == 200 and r.json()["success"], r.text
    finally:
        httpx.post(url + "/continue_generation", json={}, timeout=TIMEOUT).raise_for_status()
        t.join(timeout=600)
    try:
        rec = record_of(out)
        assert rec.weight_version == f"mixed:{before},v2-span", rec.weight_version
        tokens = prompt + out["output_ids"]
        with pytest.raises(RecordError, match="several weight versions"):
            check_records([rec], [tokens], layout)
        with pytest.raises(RecordError, match="trainer holds weight version 'v2-span'"):
            check_records([rec], [tokens], layout, weight_version="v2-span")
        after = greedy(url, 2, input_ids=ids("after the update"), return_routing=True)
        assert record_of(after).weight_version == "v2-span"  # a request wholly under the new weights is not mixed
    finally:
        httpx.post(url + "/update_weights_from_disk", timeout=TIMEOUT,
                   json={"model_path": info["model_path"], "weight_version": before}).raise_for_status()


def test_v1_completions_keep_upstreams_int32_routed_experts(url, layout):
    prompt = ids("openai completions")
    ref = greedy(url, 6, input_ids=prompt, return_routing=True, return_routed_experts=True)
    r = httpx.post(
        url + "/v1/completions",
        json={"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0, "return_routed_experts": True},
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    sglext = body.get("sglext") or body["choices"][0].get("sglext")
    got = upstream_rows(sglext["routed_experts"], layout)
    want = upstream_rows(ref["meta_info"]["routed_experts"], layout)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:, list(layout.moe_layer_ids), :], record_of(ref).experts.astype(np.int32))


def test_v1_chat_completions_keep_upstreams_int32_routed_experts(url, layout):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "return_routed_experts": True, "return_prompt_token_ids": True, "return_token_ids": True}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    sglext = out.get("sglext") or choice.get("sglext")
    rows = upstream_rows(sglext["routed_experts"], layout)
    # The chat template's rendering of the prompt, sent to /generate as ids, routes the same way.
    prompt = choice["prompt_token_ids"]
    ref = greedy(url, 4, input_ids=prompt, return_routed_experts=True)
    if "response_token_ids" in choice:  # 0.5.15's chat completions have no return_token_ids
        assert ref["output_ids"] == choice["response_token_ids"]
    np.testing.assert_array_equal(rows, upstream_rows(ref["meta_info"]["routed_experts"], layout))
    assert rows.shape[0] == len(prompt) + len(ref["output_ids"]) - 1


def test_staging_buffer_is_never_replaced_by_a_prefill_three_times_the_old_size(url):
    before = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()[0]
    prompts = [[(i * 7 + j) % 250 + 1 for i in range(3072)] for j in range(4)]  # 12,288 prompt tokens at once
    outs = greedy(url, 2, input_ids=prompts, return_routing=True)
    for p, out in zip(prompts, outs):
        assert record_of(out).num_tokens == len(p) + len(out["output_ids"]) - 1
    after = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()[0]
    assert after["staging_ptr"] == before["staging_ptr"]
    assert after["staging_tokens"] == before["staging_tokens"] >= 4096
    flush_cache(url)


def test_capture_counters_are_on_prometheus_metrics(url):
    greedy(url, 3, input_ids=ids("metrics"), return_routing=True)
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text

    def value(name, labels=""):
        m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.M)
        assert m, f"{name}{labels} not on /metrics"
        return float(m.group(1))

    assert value("sglang_r3:rows_captured_total") > 0
    assert value("sglang_r3:records_served_total", '{form="json"}') >= 1
    assert value("sglang_r3:record_bytes_total", '{form="json"}') > 0


def test_capture_switch_needs_the_admin_key_when_the_server_has_one(tree_server):
    assert set_capture(tree_server, "main+mtp").status_code == 401
    assert set_capture(tree_server, "main+mtp", key="wrong").status_code == 401
    r = set_capture(tree_server, "main+mtp", key=ADMIN_KEY)
    assert r.status_code == 200, r.text


def test_mtp_section_under_tree_drafting_is_refused_naming_the_flag(tree_server):
    r = httpx.post(tree_server + "/generate", json={"input_ids": ids("tree"), "return_routing": {"mtp": True},
                                                    "sampling_params": {"max_new_tokens": 2}}, timeout=TIMEOUT)
    assert r.status_code == 400
    assert r.json()["error"]["field"] == "return_routing"
    assert "--speculative-eagle-topk" in r.json()["error"]["message"]
