"""``python -m benchmarks.dp_overhead``: capture overhead under DP attention, against the same DP configuration
without R3.

Both servers run ``--tp-size 2 --dp-size 2 --enable-dp-attention`` (spec off: the DP window is what is new
here), ours (``sglang_r3.launch_server``) and SGLang without R3 (``benchmarks.plain_server``, same resolved
flags, no capturer at all). The rounds are ``capture_overhead.pair_rounds``: the same distinct prompts to
each side in rotated order, prefix caches flushed, same output ids checked, server CPU seconds per batch;
the key is ours / plain with a bootstrap 95% interval (``capture_overhead.summarize``). No core pinning:
each server has two schedulers. Writes ``benchmarks/results/dp_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from benchmarks import capture_overhead
from benchmarks.run import PlainServer
from tests.servers import ServerProcess

DP = ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--disable-speculation"]
OUT = Path(__file__).resolve().parent / "results" / "dp_overhead.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="server pairs, restarted in between")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per pair")
    args = ap.parse_args()
    wl = capture_overhead.WORKLOADS_QUICK
    pairs, t0 = [], time.monotonic()
    for i in range(args.pairs):
        # One compute thread per scheduler, both servers alike (as benchmarks/run.py starts its pair).
        servers = [ServerProcess(DP, env={"OMP_NUM_THREADS": "1"}).start(),
                   PlainServer(DP, env={"OMP_NUM_THREADS": "1"}).start()]
        try:
            ours, plain = (s.wait_ready().url for s in servers)
            pairs.append(capture_overhead.pair_rounds(plain, ours, wl, min_rounds=args.rounds,
                                                      max_rounds=args.rounds, pin=False, seed=i))
        finally:
            for s in servers:
                s.stop()
    res = {"config": " ".join(DP), "host": platform.node(), "cpus": os.cpu_count(),
           "seconds": round(time.monotonic() - t0, 1), **capture_overhead.summarize(pairs, wl)}
    OUT.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in res if k not in ("workloads",)}, indent=1)[:4000])


if __name__ == "__main__":
    main()
