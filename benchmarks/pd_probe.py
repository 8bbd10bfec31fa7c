"""``python -m benchmarks.pd_probe``: does SGLang's PD disaggregation run on the CPU runtime here? (issue 54, step 1)

Starts, one after the other on a 2-core host: a unified one-engine server of the embedded model (spec off), then a
prefill engine + a decode engine (KV over ``--disaggregation-transfer-backend``, Mooncake over TCP by default) and
SGLang's gateway (``sglang_router.launch_router --pd-disaggregation``), sends the same greedy ``/generate`` requests
to both and compares the output tokens (and upstream's ``routed_experts`` when asked). Every process it starts is
its own process group, killed at the end.

``--launcher plain`` (default): ``benchmarks.plain_server`` (SGLang's own ``run_server``, our plugin inert) with
``--upstream-capture``; ``--launcher r3``: ``python -m sglang_r3.launch_server`` (our capture; the prompt's rows travel with its KV,
sglang_r3/serving/adapter/pd_rows.py); ``--launcher sglang``: SGLang's own launcher with ``SGLANG_R3_ENABLED=1``.
The served feature's test is tests/test_pd.py; this probe prints each engine's own answers for a closer look.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import httpx
import numpy as np

from sglang_r3.serving.fleet.gateway import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["The capital of France is", "1 2 3 4 5 6 7 8", "Once upon a time, in a small village by the sea, there"]


class Proc:
    def __init__(self, name: str, cmd: List[str], env: Dict[str, str]):
        fd, path = tempfile.mkstemp(prefix=f"pd-{name}-", suffix=".log")
        self.name, self.log = name, Path(path)
        with os.fdopen(fd, "w") as log:
            self.proc = subprocess.Popen(["nice", "-n", "10", *cmd], stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **env}, cwd=ROOT, start_new_session=True)
        print(f"[{name}] pid {self.proc.pid} log {self.log}\n  {' '.join(cmd)}", flush=True)

    def tail(self, n: int = 80) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass


def wait_ok(p: Proc, url: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}")
        try:
            if httpx.get(url, timeout=10).status_code == 200:
                print(f"[{p.name}] ready ({url})", flush=True)
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{p.name} not ready:\n{p.tail()}")


DEFAULT_ROUTING = ["main"]


def server_cmd(launcher: str, port: int, extra: List[str], spec: bool = False) -> List[str]:
    nospec = [] if spec else ["--disable-speculation"]  # the embedded model's default: EAGLE MTP on
    if launcher == "plain":
        return [sys.executable, "-m", "benchmarks.plain_server", *nospec, "--upstream-capture",
                "--host", "127.0.0.1", "--port", str(port), *extra]
    if launcher == "sglang":  # SGLang's own launcher, SGLANG_R3_ENABLED=1: the flags our launcher resolves
        from sglang_r3.serving.launch import resolve_argv

        return [sys.executable, "-m", "sglang.launch_server",
                *resolve_argv([*nospec, "--host", "127.0.0.1", "--port", str(port), *extra], cpu=True)]
    return [sys.executable, "-m", "sglang_r3.launch_server", *nospec, "--host", "127.0.0.1",
            "--port", str(port), "--r3-default-routing", DEFAULT_ROUTING[0], *extra]


def generate(url: str, prompt: str, n: int, upstream: bool = True) -> dict:
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n}}
    if upstream:
        body["return_routed_experts"] = True
    for _ in range(30):  # the gateway answers /health before its workers are registered (503 until then)
        r = httpx.post(url + "/generate", json=body, timeout=300)
        if r.status_code != 503:
            break
        time.sleep(2)
    r.raise_for_status()
    return r.json()


def direct(pre_url: str, dec_url: str, bootstrap_port: int, prompt: str, n: int) -> tuple:
    """The gateway's PD request by hand: the same body, with the bootstrap fields, to both engines at once; both
    engines' own responses (the prefill engine's carries its routed_experts, which the gateway drops)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n},
            "return_routed_experts": True, "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port,
            "bootstrap_room": random.randrange(1, 2 ** 62)}
    with ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(httpx.post, u + "/generate", json=body, timeout=300) for u in (pre_url, dec_url)]
        outs = [f.result() for f in futs]
    for r in outs:
        r.raise_for_status()
    return outs[0].json(), outs[1].json()


def rows(out: dict):
    import base64
    import numpy as np

    b64 = out.get("meta_info", {}).get("routed_experts")
    if not b64:
        return None
    from sglang_r3.dev.embedded import EMBEDDED_CONFIG

    flat = np.frombuffer(base64.b64decode(b64), dtype=np.int32)
    return flat.reshape(-1, EMBEDDED_CONFIG["num_hidden_layers"], EMBEDDED_CONFIG["num_experts_per_tok"])


def summary(out: dict) -> dict:
    meta = out.get("meta_info", {})
    return {"output_ids": out.get("output_ids"), "text": out.get("text"),
            "routed_experts_len": len(meta.get("routed_experts") or ""),
            "routing": "routing" in meta, "routing_error": meta.get("routing_error"),
            "keys": sorted(meta)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", choices=["plain", "r3", "sglang"], default="plain")
    ap.add_argument("--backend", default="mooncake")
    ap.add_argument("--gateway", choices=["router", "none"], default="router")
    ap.add_argument("--unified-cache", default=None, help="the unified server's responses: read if present, else saved")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--spec", action="store_true", help="EAGLE MTP on every engine (the embedded model's default)")
    ap.add_argument("--default-routing", default="main", help="r3: --r3-default-routing of every engine")
    ap.add_argument("--out", default=None, help="write the responses as JSON here")
    a = ap.parse_args()
    DEFAULT_ROUTING[0] = a.default_routing
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop every server on the way out

    # This checkout's server/ as sglang_r3_server (what pyproject's package-dir maps), ahead of any installed copy.
    shim = Path(tempfile.mkdtemp(prefix="pd-probe-path-"))
    (shim / "sglang_r3_server").symlink_to(ROOT / "server")
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{shim}", "MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
    if a.launcher == "plain":
        env["SGLANG_PLUGINS"] = "none"
    elif a.launcher == "sglang":
        env.update(SGLANG_R3_ENABLED="1", SGLANG_R3_DEFAULT_ROUTING=a.default_routing)
    results: dict = {"unified": [], "pd": []}
    procs: List[Proc] = []
    try:
        cache = Path(a.unified_cache) if a.unified_cache else None
        if cache and cache.exists():
            results["unified"] = json.loads(cache.read_text())
        else:
            port = free_port()
            u = Proc("unified", server_cmd(a.launcher, port, [], a.spec), env)
            procs.append(u)
            wait_ok(u, f"http://127.0.0.1:{port}/health_generate")
            results["unified"] = [generate(f"http://127.0.0.1:{port}", p, a.max_new_tokens) for p in PROMPTS]
            if a.launcher != "plain":  # the record the server's default routing answers (what the gateway passes)
                for i, p in enumerate(PROMPTS):
                    results["unified"][i]["record_response"] = generate(f"http://127.0.0.1:{port}", p,
                                                                        a.max_new_tokens, upstream=False)
            u.stop()
            procs.remove(u)
            if cache:
                cache.write_text(json.dumps(results["unified"]))
        pp, dp, bp = free_port(), free_port(), free_port()
        common = ["--disaggregation-transfer-backend", a.backend]
        pre = Proc("prefill", server_cmd(a.launcher, pp, ["--disaggregation-mode", "prefill",
                                                            "--disaggregation-bootstrap-port", str(bp), *common], a.spec), env)
        procs.append(pre)
        dec = Proc("decode", server_cmd(a.launcher, dp, ["--disaggregation-mode", "decode", *common], a.spec), env)
        procs.append(dec)
        wait_ok(pre, f"http://127.0.0.1:{pp}/health")
        wait_ok(dec, f"http://127.0.0.1:{dp}/health")
        if a.gateway == "none":
            return 0
        gp = free_port()
        gcmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host", "127.0.0.1",
                "--port", str(gp), "--prefill", f"http://127.0.0.1:{pp}", str(bp),
                "--decode", f"http://127.0.0.1:{dp}", "--policy", "round_robin"]
        g = Proc("gateway", gcmd, env)
        procs.append(g)
        wait_ok(g, f"http://127.0.0.1:{gp}/health", timeout=300)
        for p in PROMPTS:
            t0 = time.monotonic()
            results["pd"].append(generate(f"http://127.0.0.1:{gp}", p, a.max_new_tokens))
            print(f"[pd] {p!r}: {time.monotonic() - t0:.1f}s", flush=True)
        for i, p in enumerate(PROMPTS):
            print(json.dumps({"prompt": p, "pd": summary(results["pd"][i]),
                              "unified": summary(results["unified"][i]) if results["unified"] else None}))
        if results["unified"] and "record_response" in results["unified"][0]:
            from sglang_r3.core.record import RoutingRecord

            for u, d in zip(results["unified"], results["pd"]):
                ru = RoutingRecord.from_wire(u["record_response"]["meta_info"]["routing"])
                rd = RoutingRecord.from_wire(d["meta_info"]["routing"]) if "routing" in d["meta_info"] else None
                line = {"record_main_equal": rd is not None and ru.layers == rd.layers
                        and np.array_equal(ru.experts, rd.experts), "unified_mtp": ru.mtp is not None,
                        "pd_mtp": rd is not None and rd.mtp is not None}
                if ru.mtp is not None and rd is not None and rd.mtp is not None:
                    line["mtp_entries"] = [len(ru.mtp.positions), len(rd.mtp.positions)]
                    line["mtp_equal"] = all(np.array_equal(getattr(ru.mtp, f), getattr(rd.mtp, f))
                                            for f in ("positions", "depth", "step", "accepted", "experts"))
                print(json.dumps({"record_vs_unified": line}), flush=True)
        if results["unified"]:
            same = [u["output_ids"] == d["output_ids"] for u, d in zip(results["unified"], results["pd"])]
            re_same = [u["meta_info"].get("routed_experts") == d["meta_info"].get("routed_experts")
                       for u, d in zip(results["unified"], results["pd"])]
            print(f"output_ids equal: {same}; routed_experts equal: {re_same}", flush=True)
        # Each engine's own response, without the gateway.
        for i, p in enumerate(PROMPTS):
            pre_out, dec_out = direct(f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}", bp, p, a.max_new_tokens)
            results.setdefault("direct", []).append({"prefill": pre_out, "decode": dec_out})
            want = rows(results["unified"][i]) if results["unified"] else None
            got_p, got_d = rows(pre_out), rows(dec_out)
            n_prompt = pre_out["meta_info"].get("prompt_tokens")
            line = {"prompt": p, "prompt_tokens": n_prompt, "decode_output_ids_equal_unified":
                    bool(results["unified"]) and dec_out.get("output_ids") == results["unified"][i]["output_ids"],
                    "prefill_rows": None if got_p is None else list(got_p.shape),
                    "decode_rows": None if got_d is None else list(got_d.shape),
                    "decode_routing": dec_out["meta_info"].get("routing") is not None,
                    "decode_routing_error": dec_out["meta_info"].get("routing_error"),
                    "prefill_routing_error": pre_out["meta_info"].get("routing_error")}
            if want is not None and got_p is not None:
                line["prefill_rows_equal_unified_prompt_rows"] = bool(
                    np.array_equal(got_p, want[: got_p.shape[0]]))
            if want is not None and got_d is not None and got_d.shape == want.shape:
                line["decode_prompt_rows_equal_unified"] = bool(np.array_equal(got_d[:n_prompt], want[:n_prompt]))
                line["decode_generated_rows_equal_unified"] = bool(
                    np.array_equal(got_d[n_prompt:], want[n_prompt:]))
                line["decode_prompt_rows_all_zero"] = bool(not got_d[:n_prompt].any())
            if want is not None and dec_out["meta_info"].get("routing") is not None:
                from sglang_r3.core.record import RoutingRecord

                rec = RoutingRecord.from_wire(dec_out["meta_info"]["routing"])
                moe = list(rec.layers)
                line["decode_record"] = [rec.start, rec.num_tokens]
                line["decode_record_main_rows_equal_unified"] = bool(
                    rec.num_tokens == want.shape[0] and np.array_equal(
                        np.sort(rec.experts.astype(np.int32), axis=-1), np.sort(want[:, moe], axis=-1)))
            print(json.dumps(line), flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - a probe: print what stops it, with every log
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        for p in procs:
            print(f"===== {p.name} log tail ({p.log})\n{p.tail(120)}", flush=True)
        return 1
    finally:
        if a.out:
            Path(a.out).write_text(json.dumps(results))
        for p in procs:
            p.stop()


if __name__ == "__main__":
    sys.exit(main())
