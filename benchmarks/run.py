"""``python -m benchmarks.run [--quick]``: all sglang-r3 benchmarks in one run -> results/latest.json + a table.

Two real servers (embedded model, speculation on and off) start first, in parallel; the CPU-only
benchmarks (wire size on real model shapes, decode+bind, host memory) run while they load; then the
server benchmarks (capture overhead by runtime mode toggle, live wire bytes, live host memory).
Pass ``--spec-url``/``--nospec-url`` to use servers that are already running.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"

# key -> (goal text, predicate)
GOALS = {
    "capture_overhead_ratio": ("<= 1.03", lambda v: v <= 1.03),
    "capture_overhead_ratio_wall": ("<= 1.03", lambda v: v <= 1.03),
    "record_size_ratio_vs_upstream": (">= 5", lambda v: v >= 5),
    "record_size_vs_bound": ("<= 1.15", lambda v: v <= 1.15),
    "decode_bind_speedup_vs_slime": (">= 3", lambda v: v >= 3),
}

LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)


def machine() -> Dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    except OSError:
        commit = ""
    import numpy
    import torch

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "git_commit": commit,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def start_servers(args) -> Tuple[Dict[str, str], List[Any]]:
    from tests.servers import ServerProcess

    urls, procs = {}, []
    for name, url, flags in (("spec", args.spec_url, []), ("nospec", args.nospec_url, ["--disable-speculation"])):
        if url:
            urls[name] = url.rstrip("/")
        else:
            p = ServerProcess(flags).start()
            procs.append((name, p))
    return urls, procs


def step(log: Dict[str, float], name: str, fn, *a, **kw):
    t = time.monotonic()
    print(f"[bench] {name} ...", flush=True)
    out = fn(*a, **kw)
    log[name] = round(time.monotonic() - t, 1)
    print(f"[bench] {name} done in {log[name]} s", flush=True)
    return out


def run(args) -> Dict[str, Any]:
    from benchmarks import capture_overhead, decode_bind, host_memory, wire_size

    t0 = time.monotonic()
    res: Dict[str, Any] = {"quick": args.quick, "machine": machine()}
    timings: Dict[str, float] = {}
    urls, procs = ({}, []) if args.no_servers else start_servers(args)
    try:
        decode_bind.keep_freed_memory()
        res["wire_size"] = step(timings, "wire_size (synthetic, real shapes)", wire_size.synthetic, 4096)
        res["host_memory"] = {"shapes": step(timings, "host_memory (real shapes)", host_memory.for_shapes)}
        res["decode_bind"] = step(
            timings, "decode_bind (32k tokens, GLM-4.5)", decode_bind.run, 32768, 3 if args.quick else 7
        )
        for name, p in procs:
            step(timings, f"wait for server {name}", p.wait_ready)
            urls[name] = p.url
        if urls:
            # Both servers measured at once (each compares modes within its own process; the CPU-time
            # figure does not count waiting for a core), so a quick run gets more rounds.
            budget, batch, tokens = (60.0, 2, 16) if args.quick else (300.0, 4, 64)
            jobs = {
                "speculation_on": ("spec", ("off", "main", "main+mtp")),
                "speculation_off": ("nospec", ("off", "main")),
            }
            with ThreadPoolExecutor(2) as pool:
                futs = {
                    k: pool.submit(capture_overhead.measure, urls[srv], modes, batch, tokens, 3, 60, budget)
                    for k, (srv, modes) in jobs.items()
                    if srv in urls
                }
                cap = step(timings, "capture_overhead (both servers)", lambda: {k: f.result() for k, f in futs.items()})
            res["capture_overhead"] = cap
            live_url = urls.get("spec") or urls.get("nospec")
            res["wire_size"]["live_embedded_server"] = step(
                timings, "wire_size (live server)", wire_size.measure_live, live_url, [LONG_PROMPT, LONG_PROMPT[7:]], 8
            )
            res["host_memory"]["live"] = {n: host_memory.live(u) for n, u in urls.items()}
    finally:
        for _, p in procs:
            p.stop()

    def overhead(server: str, mode: str, clock: str) -> Optional[float]:
        c = res.get("capture_overhead", {}).get(server) or {}
        if clock == "cpu" and c.get("cpu_ratio_vs_off") is None:
            clock = "wall"  # server pids not found: wall time only
        return ((c.get("cpu_ratio_vs_off") if clock == "cpu" else c.get("ratio_vs_off")) or {}).get(mode)

    res["keys"] = {
        # server CPU seconds per request, capture on / off (see capture_overhead.py); wall time next to it
        "capture_overhead_ratio": overhead("speculation_on", "main", "cpu"),
        "capture_overhead_ratio_min_max": (res.get("capture_overhead", {}).get("speculation_on") or {}).get("cpu_ratio_min_max", {}).get("main")
        if res.get("capture_overhead", {}).get("speculation_on", {}).get("cpu_ratio_min_max") else None,
        "capture_overhead_ratio_wall": overhead("speculation_on", "main", "wall"),
        "capture_overhead_ratio_mtp": overhead("speculation_on", "main+mtp", "cpu"),
        "capture_overhead_ratio_mtp_wall": overhead("speculation_on", "main+mtp", "wall"),
        "capture_overhead_ratio_nospec": overhead("speculation_off", "main", "cpu"),
        "capture_overhead_ratio_nospec_wall": overhead("speculation_off", "main", "wall"),
        "record_size_ratio_vs_upstream": res["wire_size"]["record_size_ratio_vs_upstream"],
        "record_size_ratio_vs_upstream_json": res["wire_size"]["record_size_ratio_vs_upstream_json"],
        "record_size_vs_bound": res["wire_size"]["record_size_vs_bound"],
        "record_size_vs_bound_json": res["wire_size"]["record_size_vs_bound_json"],
        "decode_bind_speedup_vs_slime": res["decode_bind"]["decode_bind_speedup_vs_slime"],
        "decode_bind_speedup_vs_slime_msgpack": res["decode_bind"]["decode_bind_speedup_vs_slime_msgpack"],
        "host_bytes_per_slot_glm45": res["host_memory"]["shapes"]["GLM-4.5"]["main_bytes_per_slot"],
        "host_upstream_over_ours_glm45": res["host_memory"]["shapes"]["GLM-4.5"]["upstream_over_ours"],
        "mtp_bytes_per_draft_entry_glm45": res["host_memory"]["shapes"]["GLM-4.5"]["mtp"]["total_bytes_per_entry_one_entry_chunks"],
    }
    res["goals"] = {
        k: {"goal": g, "value": res["keys"][k], "met": (None if res["keys"][k] is None else bool(ok(res["keys"][k])))}
        for k, (g, ok) in GOALS.items()
    }
    res["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    res["step_seconds"] = timings
    res["total_seconds"] = round(time.monotonic() - t0, 1)
    return res


def table(res: Dict[str, Any]) -> str:
    rows = [("key", "value", "goal", "met")]
    for k, v in res["keys"].items():
        g = res["goals"].get(k)
        rows.append((k, "-" if v is None else str(v), g["goal"] if g else "", ("yes" if g["met"] else "NO") if g and g["met"] is not None else ""))
    ws = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, ws)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in ws))
    m = res["machine"]
    lines.append(f"machine: nproc={m['nproc']} cpu={m['cpu_model']!r} load={m['load_avg_at_start']}->{m.get('load_avg_at_end')} "
                 f"total {res['total_seconds']} s{' (quick)' if res['quick'] else ''}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats/rounds (about 5 minutes on 2 cores)")
    ap.add_argument("--spec-url", help="use this running server (speculation on) instead of starting one")
    ap.add_argument("--nospec-url", help="use this running server (speculation off) instead of starting one")
    ap.add_argument("--no-servers", action="store_true", help="CPU-only benchmarks; no server measurements")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(table(res))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
