"""``python -m benchmarks.release_overhead [--quick] [--pairs N]``: capture overhead on the installed SGLang release.

The key figure of ``benchmarks.run`` (server CPU time, ours vs SGLang without R3, same resolved flags, MTP
speculation on, prefill- and decode-heavy batches, pooled over restarted server pairs) and nothing else, so it
runs in any environment of a served release: the README's (0.5.23) and slime's image's (0.5.15.post1,
``.ci/release-env``). Writes ``results/capture_overhead_<release>.json``; the table in benchmarks/README.md
puts the releases side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Dict

from benchmarks.machine import machine
from benchmarks.run import capture_overhead_pairs, start_servers, step

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quick workloads (benchmarks.run --quick's)")
    ap.add_argument("--pairs", type=int, default=None, help="server pairs (default: 6 quick, 10 full)")
    args = ap.parse_args()
    args.r3_url = args.plain_url = None
    import importlib.metadata as md

    release = md.version("sglang")
    timings: Dict[str, float] = {}
    res: Dict[str, Any] = {"sglang": release, "torch": md.version("torch"), "quick": args.quick,
                           "machine": machine()}
    t0 = time.monotonic()
    urls, procs = start_servers(args)
    try:
        for name, p in procs:
            step(timings, f"wait for server {name}", p.wait_ready)
            urls[name] = p.url
        res["capture_overhead"], procs = capture_overhead_pairs(
            args, urls, procs, lambda name, fn, *a, **kw: step(timings, name, fn, *a, **kw), n_pairs=args.pairs)
    finally:
        for _, p in procs:
            p.stop()
    res["seconds"] = round(time.monotonic() - t0, 1)
    cap = res["capture_overhead"]
    res["keys"] = {s: cap[f"pooled_cpu_ratio_{s}"] for s in ("main", "main+mtp")}
    out = HERE / "results" / f"capture_overhead_{release}.json"
    out.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(json.dumps(res["keys"], indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
