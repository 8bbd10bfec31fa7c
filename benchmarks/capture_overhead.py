"""Capture overhead on a real server: the same decode requests with capture off / main / main+mtp.

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
from typing import Any, Dict, List, Sequence

import httpx
import psutil

PROMPTS = ["The quick brown fox", "Once upon a time", "Hello world, this is", "A B C D"]


def server_processes(url: str) -> List[psutil.Process]:
    """The server's process tree (HTTP/tokenizer, scheduler, detokenizer), found by its --port."""
    port = url.rstrip("/").rsplit(":", 1)[-1]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "sglang_r3.launch_server" in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1 : cmd.index("--port") + 2] == [port]:
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
    """Switch, then confirm from /routing/stats (the scheduler's own report) and return those stats.

    The confirmation does not rely on the POST's status: in this tree ``POST /routing/capture`` answers
    400 even when the scheduler applied the change (TokenizerManager.set_internal_state returns plain
    bools; routes.py looks for ``.updated`` on them).
    """
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
