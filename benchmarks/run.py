"""``python -m benchmarks.run [--quick]``: all sglang-r3 benchmarks in one run -> results/latest.json + a table.

Two real servers with MTP speculation start first, in parallel: ours and SGLang without R3
(benchmarks/plain_server.py). Once both are up (and idle: --sleep-on-idle), the in-process benchmarks run
(host memory, capture hot path, wire size, decode+bind vs slime, response building); then capture
overhead (the two servers measured one at a time, interleaved), live wire bytes and live host memory. The soak's RSS growth is read
from results/soak.json (``python -m benchmarks.soak`` writes it). Pass ``--r3-url``/``--plain-url`` to use
servers that are already running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from benchmarks.machine import machine
from tests.support.servers import ServerProcess

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"

# key -> (goal text, predicate)
GOALS = {
    "mtp_bytes_per_draft_entry": ("<= 64", lambda v: v <= 64),
    "capture_us_per_forward_worst_ratio": ("<= 1 (ours / upstream, every size)", lambda v: v <= 1.0),
    "decode_bind_speedup_vs_slime": (">= 3", lambda v: v >= 3),
    "decode_bind_speedup_vs_slime_msgpack": (">= 5", lambda v: v >= 5),
    "slime_fill_speedup": (">= 3", lambda v: v >= 3),
    "record_size_vs_fixed_width_bound": ("<= 1.02", lambda v: v <= 1.02),
    "response_build_ms_per_1k_tokens": ("<= 2", lambda v: v <= 2),
    "event_loop_stall_p99_ms": ("<= 50", lambda v: v <= 50),
    "capture_overhead_ratio": ("<= 1.03", lambda v: v <= 1.03),
    "capture_overhead_ci_halfwidth": ("<= 0.02", lambda v: v <= 0.02),
    "soak_rss_growth_mb": ("<= 5", lambda v: v <= 5),
    "r3_health_overhead_ratio": ("<= 1.03", lambda v: v <= 1.03),
}

LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)


class PlainServer(ServerProcess):
    """``python -m benchmarks.plain_server``: SGLang without R3, started like our server."""

    def start(self):
        cmd = [sys.executable, "-m", "benchmarks.plain_server", "--port", str(self.port), *self.args]
        self.spawn(cmd, f"sglang-plain-{self.port}-", self.env)
        return self


def start_servers(args) -> Tuple[Dict[str, str], List[Any]]:
    """Ours (``python -m sglang_r3.launch_server``) and the baseline without R3 (``python -m
    benchmarks.plain_server``, same resolved flags), both with MTP speculation. They load together; they are
    measured one at a time (the idle one sleeps: --sleep-on-idle)."""
    from sglang_r3.dev.cpu import has_gpu

    # On a CPU host each scheduler computes with one thread, which capture_overhead.pin_server_cores
    # puts on a core of its own (the HTTP side gets the other); both servers alike. Two compute
    # threads on 2 cores would share them with the HTTP side and charge its work to the scheduler.
    env = {} if has_gpu() else {"OMP_NUM_THREADS": "1"}
    urls, procs = {}, []
    for name, url, cls in (("r3", args.r3_url, ServerProcess), ("plain", args.plain_url, PlainServer)):
        if url:
            urls[name] = url.rstrip("/")
        else:
            procs.append((name, cls([], env=dict(env)).start()))
    return urls, procs


def capture_overhead_pairs(args, urls: Dict[str, str], procs: List[Any], timed, n_pairs: Optional[int] = None):
    """(capture_overhead.summarize over server pairs, the servers running now). Servers this run started are
    measured as several pairs, restarted in between: one pair's ratio moves by a point or two from one process
    start to the next (SGLang against itself too), more than its rounds' own interval shows. Process starts,
    not rounds, narrow the interval."""
    from benchmarks import capture_overhead
    from sglang_r3.dev.cpu import has_gpu

    wl = capture_overhead.WORKLOADS_QUICK if args.quick else capture_overhead.WORKLOADS
    if n_pairs is None:
        n_pairs = (6 if args.quick else 10) if len(procs) == 2 else 1
    pin = len(procs) == 2 and not has_gpu()  # only CPU servers this run started (one compute thread each)
    pairs = []
    for i in range(n_pairs):
        if i:
            for _, p in procs:
                p.stop()
            # pin_server_cores put this process on one core; servers started from it would inherit that
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
            _, procs = start_servers(args)
            for name, p in procs:
                timed(f"restart server {name} (pair {i + 1})", p.wait_ready)
                urls[name] = p.url
        pairs.append(timed(
            f"capture_overhead pair {i + 1}/{n_pairs} (ours vs SGLang without R3, interleaved)",
            capture_overhead.pair_rounds, urls["plain"], urls["r3"], wl, min_rounds=4,
            max_rounds=(8 if args.quick else 12) if n_pairs > 1 else 40,
            budget_s=(150.0 if args.quick else 900.0) / n_pairs, pin=pin, seed=i,
        ))
    return capture_overhead.summarize(pairs, wl), procs


def step(log: Dict[str, float], name: str, fn, *a, **kw):
    t = time.monotonic()
    print(f"[bench] {name} ...", flush=True)
    out = fn(*a, **kw)
    log[name] = round(time.monotonic() - t, 1)
    print(f"[bench] {name} done in {log[name]} s", flush=True)
    return out


def run(args) -> Dict[str, Any]:
    from benchmarks import capture_path, decode_bind, host_memory, response_build, slime_fill, wire_size

    t0 = time.monotonic()
    res: Dict[str, Any] = {"quick": args.quick, "machine": machine()}
    timings: Dict[str, float] = {}
    load: Dict[str, List[float]] = {}

    def timed(name, fn, *a, **kw):
        load[name] = [round(x, 2) for x in os.getloadavg()]
        return step(timings, name, fn, *a, **kw)

    urls, procs = ({}, []) if args.no_servers else start_servers(args)
    try:
        decode_bind.keep_freed_memory()
        # Servers first: their start-up takes both cores for a minute, and the in-process parts below
        # must not share them with it (the idle servers sleep: --sleep-on-idle).
        for name, p in procs:
            timed(f"wait for server {name}", p.wait_ready)
            urls[name] = p.url
        res["host_memory"] = {"shapes": timed("host_memory (real shapes)", host_memory.for_shapes)}
        res["capture_path"] = timed("capture_path (GLM-4.5, 1/32/256/8192 tokens)", capture_path.measure,
                                    repeats=9 if args.quick else 30)
        res["wire_size"] = timed("wire_size (synthetic, real shapes)", wire_size.synthetic, 4096)
        res["decode_bind"] = timed("decode_bind (64 mixed + one 32k sample; GLM-4.5, Qwen3-30B-A3B)", decode_bind.run,
                                   repeats=3 if args.quick else 9)
        res["slime_fill"] = timed("slime_fill (64 mixed + one 32k sample into slime's replays; GLM-4.5, Qwen3-30B-A3B)",
                                  slime_fill.run_isolated, repeats=3 if args.quick else 9)
        res["response_build"] = timed("response_build (32k record; 64 x 4k stall)", response_build.run, quick=args.quick)
        from benchmarks import r3_health  # megatron-core in-process: the trainer's step, live R3 health on / off

        res["r3_health"] = timed("r3_health (replayed train step, measure on / off)", r3_health.measure,
                                 rounds=40 if args.quick else 100)
        if "r3" in urls and "plain" in urls:
            res["capture_overhead"], procs = capture_overhead_pairs(args, urls, procs, timed)
        if "r3" in urls:
            res["wire_size"]["live_embedded_server"] = timed(
                "wire_size (live server)", wire_size.measure_live, urls["r3"], [LONG_PROMPT, LONG_PROMPT[7:]], 8
            )
            res["host_memory"]["live"] = host_memory.live(urls["r3"])
    finally:
        for _, p in procs:
            p.stop()
    soak_path = HERE / "results" / "soak.json"
    res["soak"] = json.loads(soak_path.read_text()) if soak_path.exists() else None

    glm_mtp = res["host_memory"]["shapes"]["GLM-4.5"]["mtp"]
    cap = res.get("capture_overhead") or {}
    pooled = cap.get("pooled_cpu_ratio_main") or {}
    ws = res["wire_size"]
    rb = res["response_build"]
    db = res["decode_bind"]
    cp = res["capture_path"]
    res["keys"] = {
        "mtp_bytes_per_draft_entry": glm_mtp["total_bytes_per_entry"],
        "capture_us_per_forward": {n: v["ours_us"]["value"] for n, v in cp["sizes"].items()},
        "capture_us_per_forward_upstream": {n: v["upstream_us"]["value"] for n, v in cp["sizes"].items()},
        "capture_us_per_forward_worst_ratio": cp["worst_ours_over_upstream"],
        "decode_bind_speedup_vs_slime": db["decode_bind_speedup_vs_slime"],
        "decode_bind_speedup_vs_slime_msgpack": db["decode_bind_speedup_vs_slime_msgpack"],
        "decode_bind_speedup_vs_slime_filler_int64": db["decode_bind_speedup_vs_slime_filler_int64"],
        "slime_fill_speedup": res["slime_fill"]["slime_fill_speedup"],
        "slime_fill_speedup_msgpack": res["slime_fill"]["slime_fill_speedup_msgpack"],
        "slime_fill_speedup_upstream_arrays": res["slime_fill"]["slime_fill_speedup_upstream_arrays"],
        "record_size_ratio_vs_upstream": ws["record_size_ratio_vs_upstream"],
        "record_size_ratio_same_transport": ws["record_size_ratio_same_transport"],
        "record_size_vs_fixed_width_bound": max(ws["record_size_vs_fixed_width_bound"].values()),
        "record_size_vs_fixed_width_bound_per_shape": ws["record_size_vs_fixed_width_bound"],
        "record_size_vs_ordered_topk_bound": ws["record_size_vs_bound"],
        "response_build_ms_per_1k_tokens": rb["response_build_ms_per_1k_tokens"],
        "response_build_ms_per_1k_tokens_msgpack": rb["response_build_ms_per_1k_tokens_msgpack"],
        "response_build_ms_per_1k_tokens_upstream": rb["response_build_ms_per_1k_tokens_upstream"],
        "event_loop_stall_p99_ms": rb["event_loop_stall_p99_ms"],
        "event_loop_stall_p99_ms_upstream": rb["event_loop_stall_p99_ms_upstream"],
        "capture_overhead_ratio": pooled.get("value"),
        "capture_overhead_ci": [pooled.get("lo"), pooled.get("hi")] if pooled else None,
        "capture_overhead_ci_halfwidth": round((pooled["hi"] - pooled["lo"]) / 2, 4) if pooled else None,
        "capture_overhead_ratio_per_server_pair": cap.get("per_server_pair_main"),
        "capture_overhead_ratio_mtp": (cap.get("pooled_cpu_ratio_main+mtp") or {}).get("value"),
        "capture_overhead_ratio_prefill_heavy": ((cap.get("prefill_heavy") or {}).get("cpu_ratio") or {}).get("main"),
        "capture_overhead_ratio_decode_heavy": ((cap.get("decode_heavy") or {}).get("cpu_ratio") or {}).get("main"),
        "soak_rss_growth_mb": round(res["soak"]["rss_growth_mb"], 2) if res["soak"] else None,
        "r3_health_overhead_ratio": res["r3_health"]["r3_health_overhead_ratio"]["value"],
        "r3_health_overhead_ci": [res["r3_health"]["r3_health_overhead_ratio"][b] for b in ("lo", "hi")],
    }
    res["goals"] = {
        k: {"goal": g, "value": res["keys"][k], "met": (None if res["keys"][k] is None else bool(ok(res["keys"][k])))}
        for k, (g, ok) in GOALS.items()
    }
    res["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    res["load_avg_per_step"] = load
    res["step_seconds"] = timings
    res["total_seconds"] = round(time.monotonic() - t0, 1)
    return res


def table(res: Dict[str, Any]) -> str:
    rows = [("key", "value", "goal", "met")]
    for k, v in res["keys"].items():
        g = res["goals"].get(k)
        rows.append((k, "-" if v is None else json.dumps(v), g["goal"] if g else "", ("yes" if g["met"] else "NO") if g and g["met"] is not None else ""))
    ws = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, ws)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in ws))
    m = res["machine"]
    lines.append(f"machine: nproc={m['nproc']} cpu={m['cpu_model']!r} load={m['load_avg_at_start']}->{m.get('load_avg_at_end')} "
                 f"total {res['total_seconds']} s{' (quick)' if res['quick'] else ''}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats/rounds (about 8 minutes on 2 cores)")
    ap.add_argument("--r3-url", help="use this running sglang-r3 server (MTP speculation on) instead of starting one")
    ap.add_argument("--plain-url", help="use this running `python -m benchmarks.plain_server` instead of starting one")
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
