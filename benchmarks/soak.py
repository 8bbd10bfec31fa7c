"""Soak: thousands of mixed routed requests, client aborts and forced retractions; every row exact.

``python -m benchmarks.soak [--requests 2000] [--url URL]`` starts a server with a small KV pool
(so decode batches run out of KV and SGLang retracts requests) unless ``--url`` is given,
then:

1. sends every prompt of a fixed pool **alone** (greedy) and keeps its tokens and rows: the
   reference, computed by SGLang itself;
2. warms up, reads the scheduler's RSS, then fires the requests ``concurrency`` at a time,
   each with one of the routing options (main rows, main + MTP section, ``routing_start``,
   upstream's ``return_routed_experts``, msgpack, none) or as a stream the client drops
   after its first chunk;
3. checks every routed response against the reference (tokens and every row), then checks
   that nothing is held for finished requests and how much the scheduler's RSS grew.

Writes ``benchmarks/results/soak.json``. The test suite runs a reduced form
(tests/test_soak.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
import msgpack
import numpy as np

from sglang_r3.core.record import RoutingRecord

RESULTS = Path(__file__).parent / "results"
# A KV pool a few requests wide: concurrent decodes run out of slots and SGLang retracts some.
SOAK_SERVER_FLAGS = ["--max-total-tokens", "768", "--max-running-requests", "16", "--chunked-prefill-size", "256"]
# A small pool retracts only when timing makes decode outgrow it; SGLang's own test switch also runs its
# real retraction path every 10th forward, so every run retracts.
SOAK_SERVER_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "10"}
OPTIONS = ("routing", "mtp", "start", "upstream", "msgpack", "none", "abort")
TIMEOUT = httpx.Timeout(600.0)


@dataclass
class SoakResult:
    requests: int = 0
    routed_checked: int = 0
    mismatches: List[str] = field(default_factory=list)
    http_errors: List[str] = field(default_factory=list)
    routing_errors: int = 0
    aborted: int = 0
    retractions: int = 0
    by_option: Dict[str, int] = field(default_factory=dict)
    held_after: Dict[str, Any] = field(default_factory=dict)
    rss_after_warmup_mb: Optional[float] = None
    rss_end_mb: Optional[float] = None
    rss_growth_mb: Optional[float] = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.http_errors and not self.routing_errors


def prompt_pool(n: int, seed: int) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    pool = []
    for i in range(n):
        length = rng.randint(24, 120)
        ids = [rng.randint(1, 250) for _ in range(length)]
        pool.append({"input_ids": ids, "max_new_tokens": rng.choice([16, 48, 96])})
    return pool


def _body(p: Dict[str, Any], **extra) -> Dict[str, Any]:
    return {"input_ids": p["input_ids"], "sampling_params": {"max_new_tokens": p["max_new_tokens"], "temperature": 0},
            **extra}


async def references(client: httpx.AsyncClient, pool) -> List[Dict[str, Any]]:
    refs = []
    for p in pool:  # one at a time: each request alone
        r = await client.post("/generate", json=_body(p, return_routing=True))
        r.raise_for_status()
        out = r.json()
        refs.append({"output_ids": out["output_ids"], "rows": RoutingRecord.from_wire(out["meta_info"]["routing"]).experts})
    return refs


def _check(option: str, p, ref, out: Dict[str, Any], start: int, moe_layers, num_layers, res: SoakResult, tag: str):
    meta = out["meta_info"]
    res.retractions += int(meta.get("num_retractions") or 0)
    if out["output_ids"] != ref["output_ids"]:
        res.mismatches.append(f"{tag}: tokens differ from the request alone")
        return
    if option == "none":
        if "routing" in meta or "routed_experts" in meta:
            res.mismatches.append(f"{tag}: routing returned although not asked")
        return
    if "routing_error" in meta:
        res.routing_errors += 1
        res.mismatches.append(f"{tag}: routing_error {meta['routing_error']}")
        return
    if option == "upstream":
        up = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32)
        up = up.reshape(-1, num_layers, ref["rows"].shape[2])[:, list(moe_layers), :]
        got = up.astype(ref["rows"].dtype)
    else:
        rec = RoutingRecord.from_wire(meta["routing"])
        if option == "mtp" and rec.mtp is None:
            res.mismatches.append(f"{tag}: MTP section missing")
        if rec.start != start:
            res.mismatches.append(f"{tag}: start {rec.start} != {start}")
        got = rec.experts
    if not np.array_equal(got, ref["rows"][start:]):
        res.mismatches.append(f"{tag}: rows differ from the request alone")
        return
    res.routed_checked += 1


async def one(client, i: int, option: str, p, ref, rng: random.Random, layout, res: SoakResult):
    tag = f"request {i} ({option})"
    start = 0
    headers = {}
    if option == "routing":
        body = _body(p, return_routing=True)
    elif option == "mtp":
        body = _body(p, return_routing={"mtp": True})
    elif option == "start":
        start = rng.randint(0, len(p["input_ids"]))
        body = _body(p, return_routing=True, routing_start=start)
    elif option == "upstream":
        body = _body(p, return_routed_experts=True)
    elif option == "msgpack":
        body = _body(p, return_routing=True)
        headers = {"Accept": "application/msgpack"}
    elif option == "none":
        body = _body(p)
    else:  # abort: the client drops the stream after the first chunk
        async with client.stream("POST", "/generate", json=_body(p, return_routing=True, stream=True)) as r:
            async for _ in r.aiter_bytes():
                break
        res.aborted += 1
        return
    r = await client.post("/generate", json=body, headers=headers)
    if r.status_code != 200:
        res.http_errors.append(f"{tag}: HTTP {r.status_code} {r.text[:200]}")
        return
    out = msgpack.unpackb(r.content, raw=False) if option == "msgpack" else r.json()
    moe = [l["id"] for l in layout["layers"] if l["role"] == "moe"]
    _check(option, p, ref, out, start, moe, layout["num_hidden_layers"], res, tag)


def scheduler_rss_mb(port: int) -> Optional[float]:
    """RSS of the scheduler process of the server listening on ``port`` (None if not found here)."""
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            for child in psutil.Process(conn.pid).children(recursive=True):
                if child.name().startswith("sglang::scheduler"):
                    return child.memory_info().rss / 2**20
    return None


async def _settled_stats(client: httpx.AsyncClient, wait_s: float = 30.0) -> Dict[str, Any]:
    """Capture stats once the server has drained (aborted streams finish asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        stats = (await client.get("/routing/stats")).json()[0]
        held = stats.get("draft", {}).get("requests_held", 0)
        if held == 0 or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.5)


async def soak(url: str, n_requests: int, concurrency: int = 16, n_prompts: int = 48, seed: int = 0,
               warmup: int = 64) -> SoakResult:
    res = SoakResult()
    rng = random.Random(seed)
    pool = prompt_pool(n_prompts, seed)
    port = httpx.URL(url).port
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        layout = (await client.get("/routing/layout")).json()
        refs = await references(client, pool)
        sem = asyncio.Semaphore(concurrency)

        async def run(i: int, counted: bool):
            option = OPTIONS[i % len(OPTIONS)] if counted else "routing"
            k = rng.randrange(len(pool))
            async with sem:
                sink = res if counted else SoakResult()
                await one(client, i, option, pool[k], refs[k], rng, layout, sink)
            if counted:
                res.by_option[option] = res.by_option.get(option, 0) + 1

        await asyncio.gather(*(run(i, False) for i in range(warmup)))
        await _settled_stats(client)
        res.rss_after_warmup_mb = scheduler_rss_mb(port)
        t0 = time.monotonic()
        await asyncio.gather(*(run(i, True) for i in range(n_requests)))
        res.wall_s = time.monotonic() - t0
        res.requests = n_requests
        stats = await _settled_stats(client)
        res.held_after = {"draft_requests_held": stats.get("draft", {}).get("requests_held", 0),
                          "main_captures_from_draft": stats["main_captures_from_draft"]}
        res.rss_end_mb = scheduler_rss_mb(port)
    if res.rss_after_warmup_mb is not None and res.rss_end_mb is not None:
        res.rss_growth_mb = res.rss_end_mb - res.rss_after_warmup_mb
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--url", default=None, help="a running server (default: start one with a small KV pool)")
    args = ap.parse_args(argv)
    server = None
    url = args.url
    if url is None:
        from tests.support.servers import ServerProcess

        server = ServerProcess(SOAK_SERVER_FLAGS, env=SOAK_SERVER_ENV).start().wait_ready()
        url = server.url
    try:
        res = asyncio.run(soak(url, args.requests, args.concurrency))
    finally:
        if server is not None:
            server.stop()
    out = {**asdict(res), "ok": res.ok, "mismatches": res.mismatches[:20], "server_flags": SOAK_SERVER_FLAGS,
           "server_env": SOAK_SERVER_ENV}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    if not res.ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
