"""Capture overhead on real servers.

``pair_rounds`` + ``summarize`` (the key): ours against SGLang without R3 (benchmarks/plain_server.py),
prefill- and decode-heavy batches of distinct prompts, on each server pair; benchmarks/run.py restarts
the pair between rounds and pools them.

``measure`` (kept for comparing capture modes inside one server): the same decode requests with capture
off / main / main+mtp.

The mode is switched inside one server process with ``POST /routing/capture`` (so the pair compared
shares one process start, one model load and one KV cache). Rounds are interleaved (each round runs
every mode once, in rotated order) and the key figure is the median over rounds of
``time(mode) / time(off)`` for the same request. Every request asks for ``return_routing`` in every
mode, so response building and serialization are the same; only the capture work differs ("off"
keeps the hooks installed and returns early). Plain httpx, no torch.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence

import httpx
import psutil

PROMPTS = ["The quick brown fox", "Once upon a time", "Hello world, this is", "A B C D"]


def server_processes(url: str) -> List[psutil.Process]:
    """The server's process tree (HTTP/tokenizer, scheduler, detokenizer), found by its --port."""
    port = url.rstrip("/").rsplit(":", 1)[-1]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if ("sglang_r3.launch_server" in cmd or "benchmarks.plain_server" in cmd) and "--port" in cmd and cmd[cmd.index("--port") + 1 : cmd.index("--port") + 2] == [port]:
            return [p, *p.children(recursive=True)]
    return []


def _cpu_seconds(procs: List[psutil.Process]) -> float:
    """On-CPU time of every thread of the server's processes: /proc/<pid>/task/*/schedstat (ns), else psutil (ticks)."""
    total = 0.0
    for p in procs:
        try:
            tasks = os.listdir(f"/proc/{p.pid}/task")
            total += sum(_schedstat_ns(p.pid, t) for t in tasks) / 1e9
        except OSError:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def _schedstat_ns(pid: int, tid: str) -> int:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # a thread that ended between listdir and read


def _stats(client: httpx.Client) -> Dict[str, Any]:
    r = client.get("/routing/stats")
    r.raise_for_status()
    return r.json()[0]


def _set_mode(client: httpx.Client, mode: str) -> Dict[str, Any]:
    """Switch, then confirm from /routing/stats (the scheduler's own report) and return those stats."""
    r = client.post("/routing/capture", json={"mode": mode})
    stats = _stats(client)
    if stats.get("mode") != mode:
        raise RuntimeError(f"capture mode is {stats.get('mode')!r} after asking for {mode!r}: {r.status_code} {r.text}")
    return stats


def measure(
    url: str,
    modes: Sequence[str] = ("off", "main", "main+mtp"),
    batch: int = 1,
    max_new_tokens: int = 16,
    min_rounds: int = 3,
    max_rounds: int = 15,
    budget_s: float = 60.0,
) -> Dict[str, Any]:
    body = {
        "text": PROMPTS[:batch],
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        "return_routing": {"mtp": True},
    }
    times: Dict[str, List[float]] = {m: [] for m in modes}
    cpu: Dict[str, List[float]] = {m: [] for m in modes}
    procs = server_processes(url)
    tokens: Dict[str, int] = {}
    rows_written: Dict[str, int] = {m: 0 for m in modes}
    draft_entries: Dict[str, int] = {m: 0 for m in modes}
    t_start = time.monotonic()
    with httpx.Client(base_url=url, timeout=600) as client:
        rnd = -1  # round -1: warm-up, dropped
        while True:
            for i in range(len(modes)):
                mode = modes[(i + max(rnd, 0)) % len(modes)]
                before = _set_mode(client, mode)
                c = _cpu_seconds(procs)
                t = time.perf_counter()
                r = client.post("/generate", json=body)
                dt = time.perf_counter() - t
                dc = _cpu_seconds(procs) - c
                r.raise_for_status()
                after = _stats(client)
                if rnd < 0:
                    continue
                times[mode].append(dt)
                cpu[mode].append(dc)
                tokens[mode] = sum(o["meta_info"]["completion_tokens"] for o in r.json())
                rows_written[mode] += after["main_rows_written"] - before["main_rows_written"]
                draft_entries[mode] += (after.get("draft") or {}).get("entries", 0) - (before.get("draft") or {}).get("entries", 0)
            rnd += 1
            elapsed = time.monotonic() - t_start
            if rnd >= max_rounds or (rnd >= min_rounds and elapsed > budget_s):
                break
        _set_mode(client, "main+mtp")  # the server's default
    def per_round(series: Dict[str, List[float]], m: str) -> List[float]:
        return [t / o for t, o in zip(series[m], series["off"])]

    def ratios(series: Dict[str, List[float]]) -> Dict[str, float]:
        return {m: round(statistics.median(per_round(series, m)), 4) for m in modes if m != "off"}

    def spread(series: Dict[str, List[float]]) -> Dict[str, List[float]]:
        return {m: [round(min(per_round(series, m)), 3), round(max(per_round(series, m)), 3)] for m in modes if m != "off"}

    return {
        "rounds": rnd,
        "batch": batch,
        "max_new_tokens": max_new_tokens,
        "median_s": {m: round(statistics.median(v), 4) for m, v in times.items()},
        "tokens_per_s": {m: round(tokens[m] / statistics.median(v), 2) for m, v in times.items()},
        "ratio_vs_off": ratios(times),
        "ratio_min_max": spread(times),
        # CPU seconds of the server's own processes for the same request: the capture work without the
        # time spent waiting for a core (other tenants' load moves wall time by tens of percent here).
        "server_processes": len(procs),
        "median_cpu_s": {m: round(statistics.median(v), 4) for m, v in cpu.items()} if procs else None,
        "cpu_ratio_vs_off": ratios(cpu) if procs else None,
        "cpu_ratio_min_max": spread(cpu) if procs else None,
        # isolation check: "off" must write no rows, "main" no draft entries
        "main_rows_written": rows_written,
        "draft_entries": draft_entries,
    }


# -- against a server without R3 -----------------------------------------------------------------------------

WORKLOADS = {
    # name: (batch, prompt characters = tokens with the embedded byte tokenizer, max_new_tokens)
    "prefill_heavy": (16, 512, 4),
    "decode_heavy": (16, 24, 64),
}
WORKLOADS_QUICK = {"prefill_heavy": (16, 256, 2), "decode_heavy": (16, 16, 24)}
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
          "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def distinct_prompts(seed: int, n: int, chars: int) -> List[str]:
    """n prompts no earlier request shares a prefix with (the prefix cache never serves them)."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [f"{seed}-{i}"]
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(_WORDS))
        out.append(" ".join(words)[:chars])
    return out


def pin_server_cores(urls: Sequence[str]) -> Dict[str, Any]:
    """Each server's scheduler on core 0, its HTTP and detokenizer processes (and this client) on core 1.

    On a 2-core host the scheduler otherwise shares its core with whatever the HTTP side does at that
    moment, and the time it then loses is charged to the scheduler's own CPU time through cache and
    SMT interference; on a GPU host the scheduler does not share cores with the tokenizer either.
    Both sides are pinned alike. Returns what was done (nothing on a host with fewer than 2 cores).
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return {"pinned": False}
    sched, rest = {cores[0]}, set(cores[1:])
    for url in urls:
        for p in server_processes(url):
            target = sched if p.name() == "sglang::scheduler" else rest
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                try:
                    os.sched_setaffinity(int(tid), target)
                except OSError:
                    pass
    os.sched_setaffinity(0, rest)
    return {"pinned": True, "scheduler_cores": sorted(sched), "other_cores": sorted(rest)}


_SIDES = ("plain", "main", "main+mtp")


def pair_rounds(
    plain_url: str,
    r3_url: str,
    workloads: Dict[str, tuple] = WORKLOADS,
    min_rounds: int = 4,
    max_rounds: int = 40,
    budget_s: float = 300.0,
    pin: bool = True,
    seed: int = 0,
    sides: Optional[Dict[str, tuple]] = None,
) -> Dict[str, Any]:
    """One server pair's interleaved rounds: raw per-round samples, pooled over pairs by ``summarize``.

    pin: ``pin_server_cores`` first (for servers started with one compute thread, as run.py starts
    them; a server computing with two threads must not be squeezed onto one core).

    Interleaved rounds: each round sends every workload to each side, one side at a time (the idle
    server sleeps: --sleep-on-idle), in rotated order. Every side gets the same fresh distinct prompts,
    with its server's prefix cache flushed first (``POST /flush_cache``), so every side computes every
    token and, greedy, produces the same output ids (checked: ``same_output_ids``).
    Sides: ``plain`` (SGLang without R3, no routing asked), ``main`` (ours, ``return_routing: true``) and
    ``main+mtp`` (ours, ``return_routing: {"mtp": true}``); ours runs as shipped.
    Ratio per round and workload: server CPU seconds of ours / plain; key: median with bootstrap 95% CI.
    ``seed``: prompts of a later server pair must differ from an earlier pair's.
    ``sides``: name -> (url, return_routing or None) in place of the three above (benchmarks/noise_floor.py:
    two servers without R3); one of them is named ``plain``."""
    sides = sides or {"plain": (plain_url, None), "main": (r3_url, True), "main+mtp": (r3_url, {"mtp": True})}
    pinning = pin_server_cores([plain_url, r3_url]) if pin else {"pinned": False}
    procs = {u: server_processes(u) for u in {plain_url, r3_url}}
    cpu = {w: {s: [] for s in sides} for w in workloads}
    wall = {w: {s: [] for s in sides} for w in workloads}
    same = {w: {s: 0 for s in sides if s != "plain"} for w in workloads}
    clients = {u: httpx.Client(base_url=u, timeout=900) for u in procs}
    t_start, rnd = time.monotonic(), -1  # round -1: warm-up, dropped
    names = list(sides)
    try:
        while True:
            for w, (batch, chars, new) in workloads.items():
                prompts = distinct_prompts(1000 * (rnd + 2) + len(w) + 10**6 * seed, batch, chars)
                order = names[max(rnd, 0) % len(names):] + names[: max(rnd, 0) % len(names)]
                outputs = {}
                for side in order:
                    url, routing = sides[side]
                    body = {"text": prompts, "sampling_params": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}}
                    if routing is not None:
                        body["return_routing"] = routing
                    clients[url].post("/flush_cache", params={"timeout": 60}).raise_for_status()  # waits for idle
                    c0, t0 = _cpu_seconds(procs[url]), time.perf_counter()
                    r = clients[url].post("/generate", json=body)
                    dt, dc = time.perf_counter() - t0, _cpu_seconds(procs[url]) - c0
                    r.raise_for_status()
                    out = r.json()
                    if routing is not None:
                        assert all("routing" in o["meta_info"] for o in out), "a routed request came back without routing"
                    outputs[side] = [o["output_ids"] for o in out]
                    if rnd >= 0:
                        cpu[w][side].append(dc)
                        wall[w][side].append(dt)
                if rnd >= 0:
                    for side in same[w]:
                        same[w][side] += outputs[side] == outputs["plain"]
            rnd += 1
            if rnd >= max_rounds or (rnd >= min_rounds and time.monotonic() - t_start > budget_s):
                break
    finally:
        for c in clients.values():
            c.close()
    return {"rounds": rnd, "cores": pinning, "cpu": cpu, "wall": wall, "same": same}


def summarize(pairs: List[Dict[str, Any]], workloads: Dict[str, tuple]) -> Dict[str, Any]:
    """Ratios with bootstrap 95% intervals over the rounds of every server pair (``pair_rounds`` results),
    and each pair's own pooled ratio (``per_server_pair``): the spread between process starts. The pooled
    ratios' intervals resample server pairs first, then rounds (``stats.grouped_ratio_ci``)."""
    from benchmarks.stats import bootstrap_ci, grouped_ratio_ci, ratio_ci

    def cat(key, w, s):
        return [x for p in pairs for x in p[key][w][s]]

    rounds = sum(p["rounds"] for p in pairs)
    res: Dict[str, Any] = {"rounds": rounds, "server_pairs": len(pairs), "cores": pairs[0]["cores"],
                           "workloads": {k: dict(zip(("batch", "prompt_tokens", "max_new_tokens"), v)) for k, v in workloads.items()}}
    for w in workloads:
        res[w] = {
            "cpu_s": {s: {k: round(v, 4) for k, v in bootstrap_ci(cat("cpu", w, s)).items() if k != "n"} for s in _SIDES},
            "wall_s": {s: {k: round(v, 4) for k, v in bootstrap_ci(cat("wall", w, s)).items() if k != "n"} for s in _SIDES},
            "cpu_ratio": {s: ratio_ci(cat("cpu", w, s), cat("cpu", w, "plain")) for s in _SIDES if s != "plain"},
            "wall_ratio": {s: ratio_ci(cat("wall", w, s), cat("wall", w, "plain")) for s in _SIDES if s != "plain"},
            # rounds in which the side's output ids equalled plain SGLang's, token for token
            "same_output_ids": {s: f"{sum(p['same'][w][s] for p in pairs)}/{rounds}" for s in _SIDES if s != "plain"},
        }
    # Both workloads pooled: one ratio per (round, workload); the interval resamples server pairs, then rounds
    for s in _SIDES[1:]:
        groups = [([x for w in workloads for x in p["cpu"][w][s]], [x for w in workloads for x in p["cpu"][w]["plain"]])
                  for p in pairs]
        res[f"pooled_cpu_ratio_{s}"] = grouped_ratio_ci(groups)
        # the interval as if the rounds were independent (they are not: rounds of one pair share its offset)
        res[f"pooled_cpu_ratio_{s}_rounds_only"] = ratio_ci([x for g in groups for x in g[0]], [x for g in groups for x in g[1]])
        res[f"per_server_pair_{s}"] = [
            ratio_ci([x for w in workloads for x in p["cpu"][w][s]], [x for w in workloads for x in p["cpu"][w]["plain"]])["value"]
            for p in pairs
        ]
    return res
