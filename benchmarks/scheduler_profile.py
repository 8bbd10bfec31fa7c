"""``python -m benchmarks.scheduler_profile [--rounds N] [--pairs N]``: where the scheduler's time goes, ours vs SGLang
without R3, on the installed release (issue 51: locate 0.5.15.post1's capture overhead).

Ours (``python -m sglang_r3.launch_server``, ``return_routing: true``) and the capture-overhead baseline
(``benchmarks/plain_server.py``, same resolved flags, MTP speculation on; ``--mtp``: ours asks for the MTP section
too), each scheduler with one compute thread, one
server at a time: the quick workloads of ``benchmarks.capture_overhead`` (prefill- and decode-heavy batches of 16, the
same fresh prompts on both), prefix caches flushed before each request, while py-spy samples every process of the
server (``--subprocesses``, 1000 Hz, idle excluded). Samples inside ``Scheduler.flush_cache`` are dropped (the
capture-overhead key does not time the flush either). Per side: samples by where the scheduler was (a forward, the
batch result, request intake, the rest) and every sglang-r3 frame's inclusive samples (hooks, capture, the CPU
runtime's shims, which the baseline runs too). A sample is 1 ms of CPU; compare ours / plain per category, over
``--pairs`` restarted server pairs (one process start moves a pair by a point or two).

Needs py-spy (``pip install py-spy``; Linux: ptrace of the servers' processes, as root or with
``kernel.yama.ptrace_scope=0``). Writes ``results/scheduler_profile_<release>[_mtp].json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import httpx
import psutil

from benchmarks.capture_overhead import WORKLOADS_QUICK, distinct_prompts
from benchmarks.machine import machine
from benchmarks.run import PlainServer
from tests.support.servers import ServerProcess

HERE = Path(__file__).resolve().parent
CATEGORIES = ("forward", "batch result", "request intake", "scheduler, other", "other processes")


def _frame(f: str) -> str:
    return re.sub(r":\d+\)$", ")", f)


def _category(frames: List[str]) -> str:
    if len(frames) < 2 or "sglang::scheduler" not in frames[1]:
        return "other processes"  # the HTTP server and the detokenizer
    names = " ".join(frames)
    if "ModelRunner.forward (" in names:
        return "forward"
    if "process_batch_result" in names:
        return "batch result"
    if "recv_requests" in names or "process_input_requests" in names:
        return "request intake"
    return "scheduler, other"


def summarize(raw: str) -> Dict[str, Any]:
    """py-spy's raw (collapsed) stacks -> samples by category and sglang-r3 frames' inclusive samples."""
    by_cat: Dict[str, int] = collections.Counter()
    ours: Dict[str, int] = collections.Counter()
    flush = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        frames = [_frame(f) for f in stack.split(";")]
        if any(f.startswith("Scheduler.flush_cache ") for f in frames):
            flush += int(n)
            continue
        by_cat[_category(frames)] += int(n)
        for f in {f for f in frames if "sglang_r3/" in f and not f.startswith("process ")}:
            ours[f] += int(n)
    return {"samples": sum(by_cat.values()), "by_category": {c: by_cat.get(c, 0) for c in CATEGORIES},
            "sglang_r3_frames": dict(ours.most_common(25)), "flush_samples_dropped": flush}


def _root(url: str) -> psutil.Process:
    port = url.rsplit(":", 1)[1]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "--port" in cmd and cmd[cmd.index("--port") + 1] == port:
            return p
    raise RuntimeError(f"no server process with --port {port}")


def _run(url: str, seed: int, rounds: int, routing) -> None:
    with httpx.Client(base_url=url, timeout=900) as c:
        for k in range(rounds):
            for w, (n, chars, new) in WORKLOADS_QUICK.items():
                body = {"text": distinct_prompts(10**6 * seed + 1000 * k + len(w), n, chars),
                        "sampling_params": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}}
                if routing is not None:
                    body["return_routing"] = routing
                c.post("/flush_cache", params={"timeout": 60}).raise_for_status()
                c.post("/generate", json=body).raise_for_status()


def profile_pair(seed: int, rounds: int, out: Path, routing) -> Dict[str, Any]:
    env = {"OMP_NUM_THREADS": "1"}
    procs = {"r3": ServerProcess([], env=env).start(), "plain": PlainServer([], env=env).start()}
    try:
        for p in procs.values():
            p.wait_ready()
        for name, p in procs.items():
            _run(p.url, seed, 1, routing if name == "r3" else None)  # warm-up
        res = {}
        for name, p in procs.items():
            raw = out / f"{name}-{seed}.txt"
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(_root(p.url).pid), "--subprocesses",
                                    "--format", "raw", "--rate", "1000", "--nonblocking", "-o", str(raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            time.sleep(2)  # py-spy attached
            _run(p.url, seed + 1, rounds, routing if name == "r3" else None)
            spy.send_signal(2)
            spy.wait(timeout=120)
            res[name] = summarize(raw.read_text())
        return res
    finally:
        for p in procs.values():
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--mtp", action="store_true", help='ours asked for the MTP section too ({"mtp": true})')
    args = ap.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not on PATH: pip install py-spy")
    import importlib.metadata as md

    release = md.version("sglang")
    out = Path(tempfile.mkdtemp(prefix="scheduler-profile-"))
    routing = {"mtp": True} if args.mtp else True
    pairs = [profile_pair(10 * i + 1, args.rounds, out, routing) for i in range(args.pairs)]
    ratio = {c: [round(p["r3"]["by_category"][c] / max(p["plain"]["by_category"][c], 1), 3) for p in pairs]
             for c in CATEGORIES}
    ratio["all"] = [round(p["r3"]["samples"] / max(p["plain"]["samples"], 1), 3) for p in pairs]
    res = {"sglang": release, "torch": md.version("torch"), "machine": machine(), "rounds": args.rounds,
           "side": "main+mtp" if args.mtp else "main",
           "workloads": WORKLOADS_QUICK, "ratio_r3_over_plain_per_pair": ratio, "pairs": pairs,
           "raw_stacks": str(out)}
    path = HERE / "results" / f"scheduler_profile_{release}{'_mtp' if args.mtp else ''}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"sglang": release, "ratio_r3_over_plain_per_pair": ratio}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
