"""``python -m benchmarks.pd_cost``: what the prompt's rows cost a PD request (issue 54), against PD without R3.

Two PD setups are up at once, each a prefill engine, a decode engine (KV over Mooncake's TCP transport) and SGLang's
gateway (``sglang_router.launch_router --pd-disaggregation``): plain SGLang (``benchmarks.plain_server``, our plugin
inert, no capture: what users run without R3) and sglang-r3 (our launcher; the prompt's rows travel with its KV,
sglang_r3/serving/adapter/pd_rows.py). Both serve the embedded model with its default EAGLE MTP.

* **Bytes**: the prefill engine's log line says what one KV slot carries: our rows and mark (and, for a model with MTP
  layers, the prompt's MTP draft slots), and SGLang's own KV items
  (``kv_args.kv_item_lens``, every layer buffer of the target and the draft model). A request's transfer carries its
  prompt's KV slots of each.
* **Time**: the same greedy request (a distinct prompt each round, so no prefix is reused; ``--new`` tokens) through
  each gateway, the two setups alternating which goes first each round; end-to-end seconds per request and the
  paired per-round ratio r3 / plain with bootstrap 95% intervals (``benchmarks/stats.py``).

Writes ``benchmarks/results/pd_cost.json``. On a 2-core host the four engines share the cores (idle ones sleep:
``--sleep-on-idle``); compare the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import httpx

from benchmarks.machine import machine
from benchmarks.pd_probe import ROOT, Proc, server_cmd, wait_ok
from benchmarks.stats import bootstrap_ci, ratio_ci
from sglang_r3.serving.fleet.gateway import free_port

OUT = ROOT / "benchmarks" / "results" / "pd_cost.json"
SLOT_LINE = re.compile(r"capture rows travel with the KV transfer \((\d+) B per KV slot; the KV: (\d+) B per KV slot; "
                       r"of ours, MTP draft slots: (\d+) B\)")


def engine_cmd(launcher: str, port: int, extra: List[str]) -> List[str]:
    if launcher == "plain":  # SGLang's own run_server, our plugin inert, no capturer (no --upstream-capture)
        return [sys.executable, "-m", "benchmarks.plain_server", "--host", "127.0.0.1", "--port", str(port), *extra]
    return server_cmd("r3", port, extra, spec=True)


def start_pd(launcher: str, env: Dict[str, str], procs: List[Proc]) -> Dict[str, object]:
    pp, dp, bp, gp = free_port(), free_port(), free_port(), free_port()
    common = ["--disaggregation-transfer-backend", "mooncake"]
    pre = Proc(f"{launcher}-prefill", engine_cmd(launcher, pp, ["--disaggregation-mode", "prefill",
                                                                 "--disaggregation-bootstrap-port", str(bp), *common]),
               env)
    dec = Proc(f"{launcher}-decode", engine_cmd(launcher, dp, ["--disaggregation-mode", "decode", *common]), env)
    procs += [pre, dec]
    wait_ok(pre, f"http://127.0.0.1:{pp}/health")
    wait_ok(dec, f"http://127.0.0.1:{dp}/health")
    gw = Proc(f"{launcher}-gateway", [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                                      "--host", "127.0.0.1", "--port", str(gp), "--prefill", f"http://127.0.0.1:{pp}",
                                      str(bp), "--decode", f"http://127.0.0.1:{dp}", "--policy", "round_robin",
                                      "--prometheus-port", str(free_port())], env)  # two gateways: two metrics ports
    procs.append(gw)
    wait_ok(gw, f"http://127.0.0.1:{gp}/health", timeout=300)
    return {"url": f"http://127.0.0.1:{gp}", "prefill": pre, "decode": dec}


def timed(client: httpx.Client, url: str, ids: List[int], new: int) -> tuple:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": new}}
    for _ in range(60):  # 503 until the gateway's health checks admit both workers
        t0 = time.perf_counter()
        r = client.post(url + "/generate", json=body)
        dt = time.perf_counter() - t0
        if r.status_code != 503:
            break
        time.sleep(1)
    r.raise_for_status()
    return dt, r.json()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--new", type=int, default=4, help="max_new_tokens of each request")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    shim = Path(tempfile.mkdtemp(prefix="pd-cost-path-"))  # this checkout's server/ as sglang_r3_server
    (shim / "sglang_r3_server").symlink_to(ROOT / "server")
    base = {"PYTHONPATH": f"{ROOT}{os.pathsep}{shim}", "MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
    procs: List[Proc] = []
    try:
        setups = {"plain": start_pd("plain", {**base, "SGLANG_PLUGINS": "none"}, procs),
                  "r3": start_pd("r3", base, procs)}
        line = SLOT_LINE.search(setups["r3"]["prefill"].log.read_text())
        if line is None:
            raise RuntimeError("the r3 prefill engine did not log its per-slot bytes:\n" + setups["r3"]["prefill"].tail())
        rows_b, kv_b, draft_b = int(line.group(1)), int(line.group(2)), int(line.group(3))
        report: Dict[str, object] = {
            "what": "PD request cost of the prompt's rows: sglang-r3 vs plain SGLang, both PD behind sglang-router, "
                    "Mooncake over TCP, the embedded model with EAGLE MTP, CPU runtime",
            "machine": machine(), "rounds": a.rounds, "max_new_tokens": a.new,
            # ours: the rows and their mark, and (a model with MTP layers) the prompt's MTP draft slots
            "bytes_per_kv_slot": {"ours": rows_b, "of_which_mtp_draft_slots": draft_b, "sglang_kv": kv_b,
                                  "extra_fraction": rows_b / kv_b},
            "workloads": {},
        }
        import random

        rng = random.Random(0)
        with httpx.Client(timeout=300) as client:
            for n in a.prompt_tokens:
                times: Dict[str, List[float]] = {"plain": [], "r3": []}
                for k in range(a.rounds + 1):  # round 0 warms both setups up, not counted
                    ids = [rng.randrange(1, 250) for _ in range(n)]
                    order = ["plain", "r3"] if k % 2 == 0 else ["r3", "plain"]
                    outs = {}
                    for name in order:
                        dt, outs[name] = timed(client, setups[name]["url"], ids, a.new)
                        if k:
                            times[name].append(dt)
                    if outs["plain"]["output_ids"] != outs["r3"]["output_ids"]:
                        raise RuntimeError(f"the two setups answered other tokens for a {n}-token prompt")
                    if k and "routing" not in outs["r3"]["meta_info"]:
                        raise RuntimeError(f"no record from the r3 decode engine: {outs['r3']['meta_info']}")
                report["workloads"][f"prompt_{n}"] = {
                    "prompt_tokens": n,
                    "extra_bytes_per_request": n * rows_b, "sglang_kv_bytes_per_request": n * kv_b,
                    "seconds_plain": bootstrap_ci(times["plain"]), "seconds_r3": bootstrap_ci(times["r3"]),
                    "ratio_r3_over_plain": ratio_ci(times["r3"], times["plain"]),
                }
                print(json.dumps({n: report["workloads"][f"prompt_{n}"]}), flush=True)
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {a.out}")
        return 0
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    raise SystemExit(main())
