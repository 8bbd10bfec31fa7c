"""``python -m benchmarks.fleet_refs [--quick]``: records inline vs by reference on a real fleet.

Measures, on a local Ray cluster with two embedded-model engines (``--disable-speculation``) behind
SGLang's gateway:

* bytes per token that cross the gateway (= what the rollout driver receives) for the same greedy
  requests three ways: no routing, routing inline (``"return_routing": true`` at the engine that
  served the request: the gateway passes a worker's body through unchanged, tests/test_gateway.py),
  and by reference (the gateway's own response under ``--r3-default-routing ref``). By reference the
  records cross neither the gateway nor the driver: they go store -> trainer rank;
* the same, computed exactly, for a GLM-4.5-shaped record (92 layers, 160 experts, top-8), where a
  record is ~700 bytes per token raw;
* records resolved per second by one trainer rank (a Ray actor in its own process) fetching in
  batches: the engines' real records, and GLM-4.5-shaped 4096-token records put into a store actor.

Results go to ``benchmarks/results/fleet.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

import httpx
import orjson

from benchmarks.shapes import GLM45, synthetic_record
from sglang_r3.serving.fleet import Fleet, FleetConfig, RecordHandle, fetch
from sglang_r3.serving.fleet.store import RecordStore, StoreBounds, encode_record
from sglang_r3.core.record import token_digest

RESULTS = Path(__file__).parent / "results" / "fleet.json"
TIMEOUT = httpx.Timeout(300.0)


def _post(url: str, body: Dict[str, Any]) -> httpx.Response:
    r = httpx.post(url + "/generate", json=body, timeout=TIMEOUT)
    r.raise_for_status()
    return r


def _body(i: int, n: int, **extra) -> Dict[str, Any]:
    prompt = list(f"request {i}: a prompt of some length for the fleet benchmark".encode())
    return {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}, **extra}


def gateway_bytes(fleet: Fleet, requests: int, new_tokens: int) -> Dict[str, Any]:
    urls = {e["engine"]: e["url"] for e in fleet.info()}

    def one(i: int):
        ref = _post(fleet.url, _body(i, new_tokens))
        meta = ref.json()["meta_info"]
        engine = urls[meta["routing_ref"]["engine"]]
        inline = _post(engine, _body(i, new_tokens, return_routing=True))
        plain = _post(engine, _body(i, new_tokens, return_routing=False))
        tokens = meta["prompt_tokens"] + meta["completion_tokens"]
        return tokens, len(ref.content), len(inline.content), len(plain.content), meta["routing_ref"]

    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(one, range(requests)))
    fetch([r[4] for r in rows])  # release them
    tokens = sum(r[0] for r in rows)
    ref, inline, plain = (sum(r[k] for r in rows) for k in (1, 2, 3))
    return {
        "requests": requests, "new_tokens": new_tokens, "tokens": tokens,
        "body_bytes_per_token": {"none": round(plain / tokens, 2), "inline_json": round(inline / tokens, 2),
                                 "ref": round(ref / tokens, 2)},
        "routing_bytes_per_token": {"inline_json": round((inline - plain) / tokens, 2),
                                    "ref": round((ref - plain) / tokens, 2)},
        "handle_bytes_json": round((ref - plain) / requests, 1),
        "driver_record_bytes_per_token": {"inline_json": round((inline - plain) / tokens, 2), "ref": 0.0},
    }


def glm45_bytes(rows: int) -> Dict[str, Any]:
    rec = synthetic_record(GLM45, rows)
    inline = len(orjson.dumps(rec.to_wire()))
    handle = RecordHandle("r3-store-0123abcd-e0", "sglang_r3", "0123abcd-e0", 1, "8" * 32, 0, rows, "v12",
                          token_digest(range(rows + 1)))
    ref = len(orjson.dumps(handle.to_wire()))
    return {"rows": rows, "inline_json_bytes_per_token": round(inline / rows, 2),
            "ref_bytes_per_token": round(ref / rows, 4), "handle_bytes_json": ref,
            "inline_over_ref": round(inline / ref, 1)}


class Rank:
    """A trainer rank: its own process; resolves batches of handles and touches every row."""

    def resolve(self, batches: List[List[Dict[str, Any]]]) -> Dict[str, float]:
        t0, n, nbytes, check = time.perf_counter(), 0, 0, 0
        for b in batches:
            for rec in fetch(b):
                n += 1
                nbytes += rec.experts.nbytes
                check += int(rec.experts[-1, -1, -1])  # read the array (zero-copy views need a touch)
        dt = time.perf_counter() - t0
        return {"records": n, "seconds": round(dt, 4), "records_per_s": round(n / dt, 1),
                "mb_per_s": round(nbytes / dt / 1e6, 1), "record_bytes": nbytes // max(n, 1)}


def resolve_engine_records(fleet: Fleet, rank, requests: int, batch: int) -> Dict[str, Any]:
    with ThreadPoolExecutor(8) as pool:
        handles = list(pool.map(lambda i: _post(fleet.url, _body(10_000 + i, 32)).json()["meta_info"]["routing_ref"],
                                range(requests)))
    import ray

    out = ray.get(rank.resolve.remote([handles[i:i + batch] for i in range(0, len(handles), batch)]))
    return {"batch": batch, **out}


def resolve_glm45(rank, records: int, rows: int, batch: int) -> Dict[str, Any]:
    import ray

    store = ray.remote(RecordStore).options(name="r3-store-bench-glm45", namespace="sglang_r3", num_cpus=0).remote(
        "r3-store-bench-glm45", "bench-glm45", StoreBounds(max_records=records, max_bytes=4 << 30))
    inc = ray.get(store.new_incarnation.remote())
    handles = []
    for i in range(records):
        rec = synthetic_record(GLM45, rows, seed=i)
        rid = f"glm45-{i}"
        assert ray.get(store.put.remote(inc, rid, encode_record(rec)))["ok"]
        handles.append(RecordHandle("r3-store-bench-glm45", "sglang_r3", "bench-glm45", inc, rid, 0, rows).to_wire())
    try:
        out = ray.get(rank.resolve.remote([handles[i:i + batch] for i in range(0, len(handles), batch)]))
    finally:
        ray.kill(store)
    return {"rows": rows, "batch": batch, **out}


def main(argv=None) -> Dict[str, Any]:
    import ray

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    n = 32 if a.quick else 64
    from benchmarks.run import machine

    host = machine()  # load average before our own engines start
    t0 = time.time()
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    fleet = Fleet(FleetConfig(engines=2, engine_flags=["--disable-speculation", "--max-total-tokens", "8192",
                                                       "--r3-default-routing", "ref"],
                              bounds=StoreBounds(max_records=1024, max_bytes=1 << 30)))
    try:
        fleet.start()
        started = time.time() - t0
        rank = ray.remote(Rank).options(num_cpus=0).remote()
        results = {
            "fleet_start_s": round(started, 1),
            "embedded_gateway": [gateway_bytes(fleet, n, k) for k in (16, 128)],
            "glm45_wire": [glm45_bytes(r) for r in (256, 4096, 32768)],
            "resolve_engine_records": resolve_engine_records(fleet, rank, 4 * n, 32),
            "resolve_glm45_4096_rows": resolve_glm45(rank, 16 if a.quick else 48, 4096, 8),
        }
    finally:
        fleet.stop()
        ray.shutdown()
    results = {"machine": host, "quick": a.quick, "wall_s": round(time.time() - t0, 1), **results}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
