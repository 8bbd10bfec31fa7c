"""``python -m benchmarks.dp_overhead [--ranks 1,2,3] [--quick]``: capture overhead under DP attention at 2 and 3
ranks, beside the one-rank figure measured the same way in the same run, each against the same configuration
without R3.

Per rank count N, a server pair: ours (``sglang_r3.launch_server``) and SGLang without R3
(``benchmarks.plain_server``, same resolved flags, no capturer at all), both ``--tp-size N --dp-size N
--enable-dp-attention --disable-speculation`` (N = 1: no DP flags, one scheduler; spec off: the DP window is
what is new here). The rounds are ``capture_overhead.pair_rounds``: the same distinct prompts to each side in
rotated order, prefix caches flushed, same output ids checked, server CPU seconds per batch; the key is ours /
plain, pooled over the pairs' rounds with a bootstrap 95% interval (``capture_overhead.summarize``, resampling
server pairs, then rounds), and beside it each server pair's own ratio (the spread between process starts). No
core pinning: a server has N schedulers. Writes ``benchmarks/results/dp_overhead.json`` (``--quick``:
``dp_overhead_quick.json``, one pair of two rounds per rank count: a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List

from benchmarks import capture_overhead
from benchmarks.run import PlainServer
from tests.support.servers import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results"
OUT, OUT_QUICK = RESULTS / "dp_overhead.json", RESULTS / "dp_overhead_quick.json"


def flags(ranks: int) -> List[str]:
    dp = ["--tp-size", str(ranks), "--dp-size", str(ranks), "--enable-dp-attention"] if ranks > 1 else []
    return dp + ["--disable-speculation"]


def measure(ranks: int, pairs: int, rounds: int) -> Dict[str, Any]:
    wl = capture_overhead.WORKLOADS_QUICK
    done, t0 = [], time.monotonic()
    for i in range(pairs):
        # One compute thread per scheduler, both servers alike (as benchmarks/run.py starts its pair).
        servers = [ServerProcess(flags(ranks), env={"OMP_NUM_THREADS": "1"}).start(),
                   PlainServer(flags(ranks), env={"OMP_NUM_THREADS": "1"}).start()]
        try:
            ours, plain = (s.wait_ready().url for s in servers)
            done.append(capture_overhead.pair_rounds(plain, ours, wl, min_rounds=rounds, max_rounds=rounds,
                                                     pin=False, seed=100 * ranks + i))
        finally:
            for s in servers:
                s.stop()
    return {"config": " ".join(flags(ranks)), "seconds": round(time.monotonic() - t0, 1),
            **capture_overhead.summarize(done, wl)}


def table(by_ranks: Dict[str, Dict[str, Any]]) -> List[str]:
    """One line per rank count and side: the pooled ratio, its interval, and each server pair's ratio."""
    lines = ["ranks  side      ours/plain CPU  95% interval      per server pair"]
    for n, res in by_ranks.items():
        for side in ("main", "main+mtp"):
            key = res[f"pooled_cpu_ratio_{side}"]
            pairs = ", ".join(f"{v:.3f}" for v in res[f"per_server_pair_{side}"])
            lines.append(f"{n:>5}  {side:<8}  {key['value']:>14.3f}  [{key['lo']:.3f}, {key['hi']:.3f}]  {pairs}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,3", help="DP rank counts, comma-separated (1: the one-rank figure)")
    ap.add_argument("--pairs", type=int, default=2, help="server pairs per rank count, restarted in between")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per pair")
    ap.add_argument("--quick", action="store_true", help="one pair of two rounds per rank count (smoke run)")
    args = ap.parse_args()
    pairs, rounds = (1, 2) if args.quick else (args.pairs, args.rounds)
    t0 = time.monotonic()
    by_ranks: Dict[str, Dict[str, Any]] = {}
    for n in (int(x) for x in args.ranks.split(",")):
        by_ranks[str(n)] = measure(n, pairs, rounds)
        # Written after every rank count: a run cut off at 3 ranks keeps the 1- and 2-rank figures.
        lines = table(by_ranks)
        res = {"host": platform.node(), "cpus": os.cpu_count(), "seconds": round(time.monotonic() - t0, 1),
               "quick": args.quick, "table": lines, "by_ranks": by_ranks}
        (OUT_QUICK if args.quick else OUT).write_text(json.dumps(res, indent=1) + "\n")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
