"""``python -m benchmarks.noise_floor [--pairs N] [--quick]``: SGLang against itself, the noise floor of
``capture_overhead_ratio``.

Two servers without R3 (``benchmarks/plain_server.py``, the capture-overhead baseline), measured exactly as
``capture_overhead.pair_rounds`` measures ours against one: cores pinned, the same fresh distinct prompts
on both, prefix caches flushed, interleaved rounds, server CPU seconds. Both servers are stopped and
started afresh between pairs. With no difference in code, each pair's ratio B / A shows how far one
process start moves a pair's ratio: the spread that the pair-level bootstrap interval of the
capture-overhead key accounts for (rounds of one pair share it). Writes ``results/noise_floor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from benchmarks import capture_overhead
from benchmarks.stats import grouped_ratio_ci, ratio_ci

OUT = Path(__file__).resolve().parent / "results" / "noise_floor.json"


def measure(n_pairs: int, quick: bool) -> Dict[str, Any]:
    from benchmarks.run import PlainServer, machine

    wl = capture_overhead.WORKLOADS_QUICK if quick else capture_overhead.WORKLOADS
    pairs: List[Dict[str, Any]] = []
    for i in range(n_pairs):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # pinning below put this process on one core
        servers = [PlainServer([], env={"OMP_NUM_THREADS": "1"}).start() for _ in range(2)]
        try:
            a, b = (s.wait_ready().url for s in servers)
            sides = {"plain": (a, None), "plain_b": (b, None)}
            pairs.append(capture_overhead.pair_rounds(a, b, wl, min_rounds=4, max_rounds=8 if quick else 12,
                                                      budget_s=60.0, seed=100 + i, sides=sides))
        finally:
            for s in servers:
                s.stop()
        print(f"[noise_floor] pair {i + 1}/{n_pairs} done", flush=True)
    groups = [([x for w in wl for x in p["cpu"][w]["plain_b"]], [x for w in wl for x in p["cpu"][w]["plain"]])
              for p in pairs]
    return {
        "machine": machine(),
        "workloads": {k: dict(zip(("batch", "prompt_tokens", "max_new_tokens"), v)) for k, v in wl.items()},
        "rounds_per_pair": [p["rounds"] for p in pairs],
        "same_output_ids": [{w: p["same"][w]["plain_b"] for w in wl} for p in pairs],
        "ratio_per_server_pair": [ratio_ci(num, den)["value"] for num, den in groups],
        "pooled_ratio": grouped_ratio_ci(groups),
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="the --quick workloads of benchmarks.run")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    res = measure(args.pairs, args.quick)
    res["total_seconds"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("ratio_per_server_pair", "pooled_ratio")}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
