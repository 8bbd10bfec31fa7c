"""The fleet on a real local Ray cluster: two real CPU engines, their record stores, SGLang's real gateway.

Every engine runs with ``--r3-default-routing ref`` (the gateway drops per-request routing options), so
each /generate through the gateway answers with a handle, and the record waits in that engine's store
until a trainer rank fetches it.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import httpx
import msgpack
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from sglang_r3.dev.embedded.model import ensure_embedded_model  # noqa: E402
from sglang_r3.serving.fleet import Fleet, FleetConfig, RecordHandle, RecordUnavailableError, fetch  # noqa: E402
from sglang_r3.serving.fleet.store import RecordStore, StoreBounds, encode_record  # noqa: E402
from sglang_r3.core.record import RoutingRecord, token_digest  # noqa: E402
from sglang_r3.trainer.validate import check_record  # noqa: E402
from sglang_r3.core.record import RecordError  # noqa: E402

pytestmark = pytest.mark.server

MAX_RECORDS = 160  # per engine: 500 cheap requests over two engines overflow it
TIMEOUT = httpx.Timeout(300.0)


@pytest.fixture(scope="module")
def fleet():
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    f = Fleet(FleetConfig(
        engines=2,
        engine_flags=["--disable-speculation", "--max-total-tokens", "4096", "--r3-default-routing", "ref"],
        bounds=StoreBounds(max_records=MAX_RECORDS, max_bytes=1 << 20, ttl_s=600),
        health_interval_s=1.0,
    ))
    try:
        f.start()
        yield f
    finally:
        f.stop()
        ray.shutdown()


def body(prompt: List[int], n: int = 8, **extra) -> Dict[str, Any]:
    return {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}, **extra}


def post(url: str, b: Dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/generate", json=b, timeout=TIMEOUT)


def prompt(i: int) -> List[int]:
    return list(f"sample {i}: the quick brown fox".encode())


def engine_url(fleet: Fleet, engine_id: str) -> str:
    return fleet.info()[fleet.engine_index(engine_id)]["url"]


@ray.remote(num_cpus=0)
def trainer_rank(handles):
    """A trainer rank: another process, connected to the cluster, resolving handles from the stores."""
    return fetch(handles)


# -- the store's own rules, on the real class ------------------------------------------------------

def _record(rows: int, version: str = "v1") -> RoutingRecord:
    experts = np.arange(rows * 3 * 4, dtype=np.uint8).reshape(rows, 3, 4) % 16
    return RoutingRecord("fp", 0, (1, 2, 3), experts, weight_version=version, tokens_digest=token_digest(range(rows + 1)))


def _handle(store: RecordStore, inc: int, rid: str, rec: RoutingRecord) -> Dict[str, Any]:
    return RecordHandle(store.name, "ns", store.engine, inc, rid, rec.start, rec.num_tokens, rec.weight_version,
                        rec.tokens_digest).to_wire()


def test_store_refuses_a_record_when_full_by_count_or_bytes_and_frees_on_fetch():
    s = RecordStore("st", "e0", StoreBounds(max_records=2, max_bytes=200, ttl_s=600))
    inc = s.new_incarnation()
    rec = _record(5)  # 60 bytes
    assert s.put(inc, "a", encode_record(rec))["ok"] and s.put(inc, "b", encode_record(rec))["ok"]
    full = s.put(inc, "c", encode_record(rec))
    assert full["code"] == "store_full" and "2 records" in full["message"]
    got = s.take([_handle(s, inc, "a", rec)])["records"][0]
    np.testing.assert_array_equal(got.experts, rec.experts)
    big = _record(12)  # 144 bytes: fits the count, not the bytes (60 + 144 > 200)
    assert s.put(inc, "d", encode_record(big))["code"] == "store_full"
    st = s.get_stats()
    assert (st["records"], st["bytes"], st["refused_full"], st["fetched"]) == (1, 60, 2, 1)
    again = s.take([_handle(s, inc, "a", rec)])["errors"][0]
    assert again[1] == "released" and "already fetched" in again[2]


def test_store_expires_unfetched_records_after_its_ttl():
    s = RecordStore("st", "e0", StoreBounds(ttl_s=0.2))
    inc = s.new_incarnation()
    rec = _record(3)
    s.put(inc, "a", encode_record(rec))
    time.sleep(0.3)
    (_, code, msg), = s.take([_handle(s, inc, "a", rec)])["errors"]
    assert code == "released" and "expired" in msg
    assert s.get_stats()["records"] == 0 and s.get_stats()["expired"] == 1


def test_store_ends_an_incarnation_and_refuses_its_handles_and_late_puts():
    s = RecordStore("st", "e0")
    one = s.new_incarnation()
    rec = _record(3)
    s.put(one, "a", encode_record(rec))
    two = s.new_incarnation("process exited with -9")
    (_, code, msg), = s.take([_handle(s, one, "a", rec)])["errors"]
    assert code == "engine_restarted" and "process exited with -9" in msg
    assert s.put(one, "late", encode_record(rec))["code"] == "engine_restarted"
    assert s.put(two, "b", encode_record(rec))["ok"]


def test_store_answers_only_handles_that_name_it_and_match_the_record():
    s = RecordStore("st", "e0")
    inc = s.new_incarnation()
    rec = _record(3)
    s.put(inc, "a", encode_record(rec))
    other = {**_handle(s, inc, "a", rec), "engine": "e1", "store": "st-e1"}
    assert s.take([other])["errors"][0][1] == "wrong_store"
    lying = {**_handle(s, inc, "a", rec), "num_tokens": 4}
    assert s.take([lying])["errors"][0][1] == "mismatch"
    assert s.get_stats()["records"] == 1  # nothing released by a failed take


# -- the fleet ----------------------------------------------------------------------------------------

def test_records_by_reference_through_the_gateway_equal_each_engines_inline_records(fleet):
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: post(fleet.url, body(prompt(i))), range(64)))
    assert all(r.status_code == 200 for r in outs), [r.text for r in outs if r.status_code != 200][:3]
    metas = [r.json()["meta_info"] for r in outs]
    assert not any("routing" in m or "routed_experts" in m for m in metas)  # only the handle crossed the gateway
    handles = [RecordHandle.from_wire(m) for m in metas]
    assert {h.engine for h in handles} == set(fleet.engine_ids)
    assert all(len(msgpack.packb(h.to_wire())) < 300 for h in handles)

    records = ray.get(trainer_rank.remote([h.to_wire() for h in handles]))  # resolved in another process

    def inline(i_h):
        i, h = i_h
        return post(engine_url(fleet, h.engine), body(prompt(i), return_routing=True)).json()

    with ThreadPoolExecutor(8) as pool:
        direct = list(pool.map(inline, enumerate(handles)))
    for i, (h, rec, d, out) in enumerate(zip(handles, records, direct, outs)):
        want = RoutingRecord.from_wire(d["meta_info"]["routing"])
        assert out.json()["output_ids"] == d["output_ids"], i
        assert (rec.layout, rec.start, rec.layers, rec.tokens_digest, rec.weight_version) == \
               (want.layout, want.start, want.layers, want.tokens_digest, want.weight_version), i
        np.testing.assert_array_equal(rec.experts, want.experts, err_msg=f"request {i} on {h.engine}")
        check_record(rec, _layout(fleet), prompt(i) + d["output_ids"])

    with pytest.raises(RecordUnavailableError, match="already fetched"):
        fetch(handles[:1])  # released once fetched


def test_a_direct_request_asks_for_a_handle_and_keeps_upstreams_field_and_msgpack(fleet):
    url = fleet.info()[0]["url"]
    r = httpx.post(url + "/generate", timeout=TIMEOUT, headers={"accept": "application/msgpack"},
                   json=body(prompt(900), 4, return_routing={"ref": True}, return_routed_experts=True))
    meta = msgpack.unpackb(r.content, raw=False)["meta_info"]
    assert "routing" not in meta and meta["routed_experts"]  # upstream's field is still served inline
    rec = fetch([meta["routing_ref"]])[0]
    assert rec.num_tokens == len(prompt(900)) + 4 - 1 and meta["routing_ref"]["engine"] == fleet.engine_ids[0]


def test_an_engine_without_a_record_store_refuses_a_request_for_a_handle_naming_the_field(monkeypatch):
    from sglang_r3_server.request import RequestError, parse_routing_options
    from sglang_r3.core import settings

    monkeypatch.setattr(settings, "current", lambda: settings.Settings())  # no record store set
    with pytest.raises(RequestError, match="record store") as e:
        parse_routing_options({"return_routing": {"ref": True}})
    assert e.value.field == "return_routing" and e.value.status == 400


def test_a_handle_never_resolves_from_another_engines_store(fleet):
    h = RecordHandle.from_wire(post(fleet.url, body(prompt(1000), 2)).json()["meta_info"])
    other = fleet.engine_ids[1 - fleet.engine_index(h.engine)]
    forged = {**h.to_wire(), "store": f"r3-store-{other}"}
    with pytest.raises(RecordUnavailableError) as e:
        fetch([forged])
    assert e.value.code == "wrong_store" and other in str(e.value)
    assert fetch([h])[0].tokens_digest == h.tokens_digest  # the real one is still there


def test_store_memory_stays_bounded_across_500_requests_and_says_when_full(fleet):
    before = {s["engine"]: s for s in fleet.store_stats()}

    def one(i):
        return post(fleet.url, body(prompt(2000 + i), 1 + i % 2)).json()["meta_info"]

    with ThreadPoolExecutor(16) as pool:
        metas = list(pool.map(one, range(500)))
    refused = [m["routing_error"] for m in metas if "routing_error" in m]
    handles = [m["routing_ref"] for m in metas if "routing_ref" in m]
    assert len(refused) + len(handles) == 500 and refused and handles
    assert {r["code"] for r in refused} == {"store_full"} and "is full" in refused[0]["message"]
    stats = fleet.store_stats()
    for s in stats:
        assert s["peak_records"] <= MAX_RECORDS and s["records"] <= MAX_RECORDS and s["bytes"] <= 1 << 20
    assert sum(s["refused_full"] - before[s["engine"]]["refused_full"] for s in stats) == len(refused)
    for i in range(0, len(handles), 64):
        fetch(handles[i:i + 64])
    after = {s["engine"]: s for s in fleet.store_stats()}
    for eid, s in after.items():
        assert s["records"] == before[eid]["records"]  # everything this test stored was released
    assert post(fleet.url, body(prompt(1), 1)).json()["meta_info"].get("routing_ref")  # room again


def test_update_weights_bumps_the_version_that_new_records_carry(fleet):
    fleet.update_weights(str(ensure_embedded_model()), "v2")
    metas = [post(fleet.url, body(prompt(3000 + i), 4)).json()["meta_info"] for i in range(4)]
    handles = [RecordHandle.from_wire(m) for m in metas]
    assert {h.engine for h in handles} == set(fleet.engine_ids)
    assert all(m["weight_version"] == "v2" and h.weight_version == "v2" for m, h in zip(metas, handles))
    records = fetch(handles)
    assert {r.weight_version for r in records} == {"v2"}
    out = post(fleet.url, body(prompt(3000), 4)).json()
    with pytest.raises(RecordError, match="weight"):  # a trainer still on the old weights refuses it
        check_record(fetch([out])[0], _layout(fleet), prompt(3000) + out["output_ids"], weight_version="default")


def _requests_held(url: str) -> int:
    """Requests the engine's scheduler holds now (its running batch and waiting queue), read live."""
    stats = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()
    return sum(s["requests_held"] for s in stats)


def _wait_held(url: str, threads: List[threading.Thread]) -> int:
    """Poll until the scheduler holds a request, or every client has its answer (then 0)."""
    while any(t.is_alive() for t in threads):
        held = _requests_held(url)
        if held:
            return held
    return 0


def test_a_killed_engine_fails_its_in_flight_requests_comes_back_and_its_old_handles_fail_clearly(fleet):
    victim = 0
    eid = fleet.engine_ids[victim]
    old = post(engine_url(fleet, eid), body(prompt(4000), 2)).json()["meta_info"]["routing_ref"]
    results: List[Any] = [None] * 16

    def long_request(i):
        try:
            r = post(fleet.url, body(prompt(5000 + i), 400))
            results[i] = (r.status_code, r.text)
        except httpx.HTTPError as e:
            results[i] = (None, repr(e))

    threads = [threading.Thread(target=long_request, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    # Kill only once the victim's own scheduler holds requests, and hold them there: generation is
    # paused in place (the requests stay in its running batch and cannot finish), and the count is
    # read again under the pause. Nothing here depends on how fast the machine decodes.
    victim_url = engine_url(fleet, eid)
    held = _wait_held(victim_url, threads)
    assert held > 0, "every request finished before the victim's scheduler was seen holding one"
    httpx.post(victim_url + "/pause_generation", json={"mode": "in_place"}, timeout=TIMEOUT).raise_for_status()
    held = _requests_held(victim_url)
    assert held > 0, "the victim's requests finished before generation was paused"
    dead = fleet.kill_engine(victim)
    for t in threads:
        t.join(timeout=300)
    failed = [r for r in results if r[0] != 200]
    served = [r for r in results if r[0] == 200]
    assert failed and served, results
    dead_url = fleet.info()[victim]["url"]
    for status, text in failed:  # the gateway names the worker it lost; no body with a handle
        assert status == 500 and "error sending request" in text and dead_url in text, (status, text)
    finished = [json.loads(t)["meta_info"]["routing_ref"] for _, t in served]
    assert {h["engine"] for h in finished} == {fleet.engine_ids[1]}
    assert len(fetch(finished)) == len(finished)

    with pytest.raises(RecordUnavailableError) as e:
        fetch([old])
    assert e.value.code == "engine_restarted" and eid in str(e.value) and "died" in str(e.value)

    info = fleet.wait_engine(victim, dead + 1, timeout_s=400)
    assert info["incarnation"] == dead + 1 and info["restarts"] == 1
    fresh = post(info["url"], body(prompt(4000), 2)).json()["meta_info"]
    h = RecordHandle.from_wire(fresh)
    assert (h.engine, h.incarnation, h.weight_version) == (eid, dead + 1, "v2")  # the update survived the restart
    assert fetch([h])[0].num_tokens == len(prompt(4000)) + 1
    with pytest.raises(RecordUnavailableError, match="died"):
        fetch([old])  # still refused; never resolved against the new incarnation

    deadline = time.monotonic() + 60  # the gateway's health checks take the engine back
    while time.monotonic() < deadline:
        m = post(fleet.url, body(prompt(6000), 1)).json()["meta_info"]
        if m["routing_ref"]["engine"] == eid:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the gateway never sent a request to the restarted engine")


def test_handles_and_fetch_import_on_the_trainer_side_without_sglang():
    from tests.support.blocked_imports import SERVER_ONLY, ok, run

    # A trainer image has ray (its job runs on it) but no SGLang: fetch and handles must import there.
    blocked = tuple(m for m in SERVER_ONLY if m != "ray") + ("torch", "megatron")
    out = ok(run("""
from sglang_r3.serving.fleet import RecordHandle, fetch
h = RecordHandle.from_wire({"meta_info": {"routing_ref": {"store": "s", "namespace": "n", "engine": "e",
                           "incarnation": 1, "rid": "r", "start": 0, "num_tokens": 3}}})
assert h.num_tokens == 3 and callable(fetch)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)))
""", blocked))
    assert json.loads(out.splitlines()[-1]) == []


_LAYOUT = {}


def _layout(fleet):
    if "l" not in _LAYOUT:
        from sglang_r3.core.layout import ModelLayout

        url = fleet.info()[0]["url"]
        _LAYOUT["l"] = ModelLayout.from_dict(httpx.get(url + "/routing/layout", timeout=30).json())
    return _LAYOUT["l"]
