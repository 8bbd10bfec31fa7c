"""``python3 -m benchmarks.gpu.run [--kit ARCHIVE] [--out DIR] [--dry-run | --cpu-rehearsal]``: SGLang's GPU forward
with capture (0.5.15.post1), on a bare GPU host, in one run (under 9 minutes; everything as JSON and logs in one
folder).

Bring the repository and the kit (``python -m benchmarks.gpu.kit build .gpu-kit``). The run:

1. ``unpack``: the kit into a folder outside the output (``--target``), put on ``PYTHONPATH`` after the repository,
   with ``SGLANG_IS_FLASHINFER_AVAILABLE=false``, ``TVM_FFI_DISABLE_TORCH_C_DLPACK=1`` and ``TVM_FFI_CACHE_DIR`` at
   the kit's JIT kernels (built for sm90 where the kit was built, ``benchmarks/gpu/jit.py``);
   ``probe``: every package the kit leaves to the host (``contents.HOST``) is importable, which transformers and
   SGLang the children get, and ``import sglang.srt.entrypoints.http_server`` in a child.
2. Our launcher (``python -m sglang_r3.launch_server``) on the embedded model in bfloat16 with ``--attention-backend
   triton --sampling-backend pytorch --grammar-backend none``: (a) ``--disable-cuda-graph --disable-speculation``,
   (b) CUDA graphs on, speculation off, (c) CUDA graphs on with the launcher's EAGLE MTP speculation. The same
   greedy requests (``input_ids``, byte tokens) to each. (b)'s and (c)'s main rows against (a)'s: every
   (token, MoE layer) pair whose expert set differs is counted, and split by a near-tie measure (below); (c)'s MTP
   section must be there, tagged depth 1, with accepted drafts.
3. Plain SGLang (``python -m sglang.launch_server --enable-return-routed-experts``, ``SGLANG_R3_ENABLED`` unset,
   ``SGLANG_PLUGINS=none``: SGLang's loader skips our entry point) with (a)'s flags on (a)'s requests: its
   ``routed_experts`` against ours (upstream's form, as our server also returns it) and against our record.
4. Capture overhead with CUDA graphs on: ours (b) against SGLang without R3 (``python -m benchmarks.plain_server``,
   the same resolved flags minus ``--enable-return-routed-experts``), decode-heavy and prefill-heavy, the two sides
   alternated in each round (``capture_overhead.pair_rounds``); ours / plain tokens per second as the median of
   per-round ratios with a bootstrap 95% interval (``benchmarks.stats``).
5. ``python -m benchmarks.gpu_check`` with the kit on the path; ``jit``: which JIT kernels the servers built
   themselves with nvcc (a kernel the kit did not carry, or one it carried that failed to load).

The near-tie measure: transformers' own Glm4-MoE (the kit's 5.12.1) in float32 on the GPU over (a)'s full
sequences; for each (token, MoE layer) the gap between the k-th and (k+1)-th routing score (sigmoid of the router
logit plus the correction bias: what top-k ranks). A differing pair is called a near tie when that float32 gap is
below ``NEAR_TIE_GAP``; the count of differing pairs, of near ties and of the rest (which fail the check) and the
largest gap among differing pairs are all written. Nothing here claims more than those counts.

Results: ``OUT/gpu_<device>.json`` (``OUT``: ``--out``, else ``$OUT``, else ``.gpu-kit/out``), rewritten
after every step so a run cut short keeps what it measured; child logs in ``OUT/logs``. ``--dry-run`` (any host,
no GPU) unpacks, probes the host packages and writes the JSON with every GPU step marked skipped: it tests the
script, not a GPU. ``--cpu-rehearsal`` runs every step on this host's CPU runtime in the GPU's stead
(``REHEARSAL``: no bfloat16, no triton attention, no CUDA graphs, two overhead rounds, the GPU check's
``--cpu-selftest``) and writes ``gpu_cpu-rehearsal.json``: it proves the script and the package set it runs with
(``benchmarks.gpu.rehearse``), nothing about a GPU. Without CUDA and without either it says so and exits 0,
claiming nothing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.gpu import contents as C
from benchmarks.gpu import jit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_KIT = ROOT / ".gpu-kit" / C.ARCHIVE  # python -m benchmarks.gpu.kit build .gpu-kit
BUDGET_S = 530.0  # the whole run; each step gets what is left
NEEDS_CUDA = "benchmarks.gpu.run needs CUDA (torch.cuda.is_available() is False here); nothing was run"

# Sigmoid-score units. A bfloat16 forward's hidden states differ from float32's by about bf16's relative step
# (2^-8) per layer; on the embedded model (64-wide, router weights of std 2/8) that moves a router logit by about
# 1e-2 and its sigmoid score by at most a quarter of that. 0.005 is that estimate, not a measurement: 7% of the
# embedded model's (token, layer) pairs on these prompts sit below it in float32 (measured on CPU), and the run
# writes the share it saw (near_tie_gaps.pairs_below_threshold) beside every count it allows.
NEAR_TIE_GAP = 0.005
SERVE_FLAGS = ["--dtype", "bfloat16", "--attention-backend", "triton", "--sampling-backend", "pytorch",
               "--grammar-backend", "none", "--mem-fraction-static", "0.9", "--max-total-tokens", "65536",
               "--cuda-graph-max-bs-decode", "32"]
CONFIGS = {  # name -> (flags beyond SERVE_FLAGS, speculative)
    "a_nograph_nospec": (["--disable-cuda-graph", "--disable-speculation"], False),
    "b_graph_nospec": (["--disable-speculation"], False),
    "c_graph_mtp": ([], True),
}
MAX_NEW_TOKENS = 48
PROMPT_CHARS = (7, 19, 33, 64, 101, 160, 233, 300)
OVERHEAD_WORKLOADS = {"prefill_heavy": (16, 512, 4), "decode_heavy": (16, 24, 64)}  # capture_overhead.WORKLOADS


@dataclass(frozen=True)
class Plan:
    """Where the steps run: the GPU, or the CPU runtime standing in for it (``--cpu-rehearsal``)."""

    serve_flags: Tuple[str, ...]
    device: str  # transformers' near-tie routers
    min_rounds: int  # capture overhead: interleaved rounds
    max_rounds: int
    gpu_check: Tuple[str, ...]  # benchmarks.gpu_check's arguments


GPU = Plan(tuple(SERVE_FLAGS), "cuda", 3, 30, ())
# The CPU runtime's own flags are added by the launcher; bfloat16 and triton attention are the GPU's. The dtype
# is named, as SERVE_FLAGS names it: plain SGLang given --model-path takes the checkpoint's, our launcher's
# embedded default is float32.
REHEARSAL = Plan(("--dtype", "float32", "--sampling-backend", "pytorch", "--grammar-backend", "none",
                  "--max-total-tokens", "65536"), "cpu", 2, 2, ("--cpu-selftest",))


def prompts() -> List[List[int]]:
    """Byte-token prompts of several lengths (the embedded tokenizer: id == byte), no two sharing a prefix."""
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()
    out = []
    for i, n in enumerate(PROMPT_CHARS):
        text, j = f"{i}:", i
        while len(text) < n:
            text += " " + words[(j * 7 + i) % len(words)]
            j += 1
        out.append(list(text[:n].encode()))
    return out


# -- results -----------------------------------------------------------------------------------------------------


class Results:
    """One JSON document, written after every step."""

    def __init__(self, out: Path, device: str):
        self.out = out
        self.path = out / f"gpu_{device}.json"
        self.data: Dict[str, Any] = {"device": device, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "steps": {}}
        self.t0 = time.monotonic()

    def step(self, name: str, fn, *a, **kw) -> Any:
        t = time.monotonic()
        try:
            value = fn(*a, **kw)
            rec = {"ok": True, **(value if isinstance(value, dict) else {"value": value})}
        except Exception as exc:  # a step that fails is a finding: written, and the run goes on where it can
            value = None
            rec = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000],
                   "traceback": traceback.format_exc()[-4000:]}
        rec["seconds"] = round(time.monotonic() - t, 1)
        self.data["steps"][name] = rec
        self.write()
        print(f"[{time.monotonic() - self.t0:6.1f} s] {name}: {'ok' if rec['ok'] else 'FAILED ' + rec['error'][:300]}",
              flush=True)
        return value

    def skip(self, name: str, why: str) -> None:
        self.data["steps"][name] = {"ok": None, "skipped": why}
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)


def device_slug(name: Optional[str]) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; None (no GPU) -> 'dryrun'."""
    if not name:
        return "dryrun"
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "_", name)).lower()


# -- kit ------------------------------------------------------------------------------------------------------------


def unpack(archive: Path, target: Path) -> Dict[str, Any]:
    """The kit's tree under ``target`` (replaced); its site/ folder and MANIFEST."""
    if not archive.is_file():
        raise FileNotFoundError(f"no kit at {archive}: build it with python -m benchmarks.gpu.kit build "
                                f"{archive.parent}")
    shutil.rmtree(target / C.KIT_DIR, ignore_errors=True)
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        names = tar.getnames()
        if any(not (n == C.KIT_DIR or n.startswith(C.KIT_DIR + "/")) for n in names):
            raise ValueError(f"{archive} holds paths outside {C.KIT_DIR}/")
        if sys.version_info >= (3, 12):
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)  # names checked above
    site = target / C.KIT_DIR / "site"
    if not site.is_dir():
        raise ValueError(f"{archive} has no {C.KIT_DIR}/site")
    manifest_path = target / C.KIT_DIR / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return {"site": str(site), "files": len(names), "archive_bytes": archive.stat().st_size,
            "packages": manifest.get("packages", {}), "stand_ins": manifest.get("stand_ins", []),
            "jit": manifest.get("jit", {"modules": []})}


def kit_env(site: Path) -> Dict[str, str]:
    """The children's environment: the repository first (sglang_r3, benchmarks), then the kit, then the host's."""
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_R3_ENABLED", "SGLANG_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["SGLANG_IS_FLASHINFER_AVAILABLE"] = "false"
    env["TVM_FFI_DISABLE_TORCH_C_DLPACK"] = "1"
    # SGLang's JIT kernels: the kit's, built for sm90; what a server builds itself lands beside them (jit.accounting)
    env["TVM_FFI_CACHE_DIR"] = str(site.parent / jit.CACHE_DIR)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def host_module(dist: str) -> str:
    return C.HOST_MODULES.get(dist, dist.replace("-", "_"))


PROBE = r"""
import importlib.metadata as md, importlib.util, json, sys
mods = json.loads(sys.argv[1])
out = {"python": sys.version.split()[0], "missing": sorted(d for d, m in mods.items() if importlib.util.find_spec(m) is None)}
for d in ("torch", "transformers", "tokenizers", "sglang", "sglang-kernel", "sglang-r3", "flashinfer-python"):
    try:
        out[d] = md.version(d)
    except md.PackageNotFoundError:
        out[d] = None
eps = [e.value for e in md.entry_points(group="sglang.srt.plugins")]
out["sglang_plugins"] = eps
if "--import" in sys.argv:
    import sglang.srt.entrypoints.http_server  # noqa: F401  SGLang's server, as the launchers import it
    out["imported"] = "sglang.srt.entrypoints.http_server"
print(json.dumps(out))
"""


def probe(env: Dict[str, str], out: Path, import_sglang: bool) -> Dict[str, Any]:
    mods = {d: host_module(d) for d in C.HOST}
    cmd = [sys.executable, "-c", PROBE, json.dumps(mods), *(["--import"] if import_sglang else [])]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / "probe.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"probe exited {proc.returncode}: {proc.stderr[-2500:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["host_packages_checked"] = len(mods)
    return res


# -- servers --------------------------------------------------------------------------------------------------------


class Server:
    """A server process tree in its own session, logging to OUT/logs/<name>.log."""

    def __init__(self, name: str, cmd: List[str], env: Dict[str, str], out: Path):
        from sglang_r3.serving.fleet.gateway import free_port

        self.name, self.port = name, free_port()
        self.log_path = out / "logs" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cmd = [sys.executable, "-m", *cmd, "--port", str(self.port)]
        with open(self.log_path, "w") as log:
            log.write("$ " + " ".join(self.cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(self.cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.started = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float) -> float:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    return round(time.monotonic() - self.started, 1)
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.name} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        from sglang_r3.serving.fleet.gateway import log_tail

        return log_tail(self.log_path, n)

    def stop(self) -> None:
        from sglang_r3.serving.fleet.gateway import stop_process_group

        stop_process_group(self.proc)


def ours(name: str, extra: Sequence[str], env, out, plan: Plan = GPU) -> Server:
    return Server(name, ["sglang_r3.launch_server", *plan.serve_flags, *extra], env, out)


def plain_upstream(name: str, model: str, extra: Sequence[str], env, out, plan: Plan = GPU) -> Server:
    """SGLang's own launcher and capturer: no sglang-r3 plugin in any of its processes. On the CPU runtime
    (``REHEARSAL``) SGLang's launcher cannot start by itself: ``benchmarks.plain_server --upstream-capture``
    adds the CPU runtime's flags and shims and no capture of ours."""
    env = {**env, "SGLANG_PLUGINS": "none"}
    env.pop("SGLANG_R3_ENABLED", None)
    return Server(name, plain_upstream_argv(model, extra, plan), env, out)


def plain_upstream_argv(model: str, extra: Sequence[str], plan: Plan = GPU) -> List[str]:
    """The module and flags plain SGLang starts with (tests/test_gpu_kit.py parses them with SGLang's parser)."""
    if plan.device == "cpu":
        return ["benchmarks.plain_server", "--upstream-capture", "--model-path", model, *plan.serve_flags, *extra]
    # --disable-speculation is our launcher's (SGLang's parser refuses it): plain SGLang speculates only when asked
    extra = [a for a in extra if a != "--disable-speculation"]
    return ["sglang.launch_server", "--model-path", model, *plan.serve_flags, *extra, "--enable-return-routed-experts"]


def generate(url: str, ids: List[List[int]], routing, max_new_tokens: int = MAX_NEW_TOKENS) -> List[Dict[str, Any]]:
    import httpx

    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
            "return_routed_experts": True}
    if routing is not None:
        body["return_routing"] = routing
    r = httpx.post(url + "/generate", json=body, timeout=300)
    if r.status_code != 200:
        raise RuntimeError(f"/generate answered {r.status_code}: {r.text[:2000]}")
    return r.json()


# -- comparisons (pure: tests/test_gpu_kit.py runs them on made-up answers) ------------------------------------------


def record_rows(out: Dict[str, Any]):
    """(sorted [rows, layers, topk] ids, layers, the record's mtp section or None) of one answer's record."""
    import numpy as np

    from sglang_r3.core.record import RoutingRecord

    meta = out["meta_info"]
    if "routing" not in meta:
        raise ValueError(f"no routing in the answer: {meta.get('routing_error')}")
    rec = RoutingRecord.from_wire(meta["routing"])
    return np.sort(rec.experts.astype(np.int64), axis=-1), rec.layers, rec.mtp


def upstream_rows(out: Dict[str, Any]):
    """SGLang's ``routed_experts``: int32 [T-1, num_hidden_layers * topk] as sent (base64)."""
    import numpy as np

    return np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), dtype=np.int32)


def compare_rows(ref: Sequence[Dict[str, Any]], got: Sequence[Dict[str, Any]], prompt_ids: Sequence[Sequence[int]],
                 gaps: Optional[Sequence[Any]] = None, threshold: float = NEAR_TIE_GAP) -> Dict[str, Any]:
    """Main rows of ``got`` against ``ref``, request by request, over the tokens both sequences share.

    gaps: per request, float32 [rows, layers] top-k boundary gaps over ``ref``'s sequence (``router_gaps``), or
    None (then no pair is called a near tie). ok: no differing pair outside the near ties."""
    import numpy as np

    res = {"requests": len(ref), "output_ids_equal": 0, "pairs_compared": 0, "pairs_differing": 0, "near_tie_pairs": 0,
           "other_pairs": 0, "max_gap_differing": None, "examples": [], "near_tie_measure": (
               f"float32 top-k boundary gap < {threshold}" if gaps is not None else "unavailable")}
    for i, (r, g) in enumerate(zip(ref, got)):
        rr, layers, _ = record_rows(r)
        gr, glayers, _ = record_rows(g)
        if layers != glayers:
            raise ValueError(f"request {i}: layers {glayers} against {layers}")
        res["output_ids_equal"] += r["output_ids"] == g["output_ids"]
        full_r = list(prompt_ids[i]) + list(r["output_ids"])
        full_g = list(prompt_ids[i]) + list(g["output_ids"])
        same = next((j for j, (a, b) in enumerate(zip(full_r, full_g)) if a != b), min(len(full_r), len(full_g)))
        n = min(same, len(rr), len(gr))  # row t routes token t: comparable while the tokens up to t agree
        diff = np.any(rr[:n] != gr[:n], axis=-1)  # [n, layers]
        res["pairs_compared"] += int(diff.size)
        for t, c in zip(*np.nonzero(diff)):
            gap = float(gaps[i][t, c]) if gaps is not None else None
            tie = gap is not None and gap < threshold
            res["pairs_differing"] += 1
            res["near_tie_pairs" if tie else "other_pairs"] += 1
            if gap is not None:
                res["max_gap_differing"] = max(res["max_gap_differing"] or 0.0, gap)
            if len(res["examples"]) < 8:
                res["examples"].append({"request": i, "token": int(t), "layer": int(layers[c]), "gap": gap,
                                        "ref": rr[t, c].tolist(), "got": gr[t, c].tolist(), "near_tie": tie})
    res["output_ids_equal"] = f"{res['output_ids_equal']}/{len(ref)}"
    res["pass"] = res["other_pairs"] == 0 and res["pairs_compared"] > 0
    return res


def mtp_tagged(outs: Sequence[Dict[str, Any]], layout: Dict[str, Any]) -> Dict[str, Any]:
    """The MTP section of every answer: present, depth 1 (the layout's one MTP layer), positions inside the
    sequence, some drafts accepted."""
    import numpy as np

    mtp_layers = [l for l in layout.get("layers", []) if l.get("role") == "mtp"]
    entries = accepted = 0
    bad = []
    for i, o in enumerate(outs):
        rows, _, mtp = record_rows(o)
        if mtp is None or len(mtp.positions) == 0:
            bad.append(f"request {i}: no MTP entries")
            continue
        entries += len(mtp.positions)
        accepted += int(np.sum(mtp.accepted))
        if set(np.unique(mtp.depth).tolist()) != {1}:
            bad.append(f"request {i}: depths {sorted(set(np.unique(mtp.depth).tolist()))}")
        if int(np.max(mtp.positions)) > len(rows) + 1:
            bad.append(f"request {i}: a position past the sequence ({int(np.max(mtp.positions))} > {len(rows) + 1})")
    if [l.get("depth") for l in mtp_layers] != [1]:
        bad.append(f"layout's MTP layers: {mtp_layers}")
    return {"entries": entries, "accepted": accepted, "layout_mtp_layers": mtp_layers, "problems": bad[:10],
            "pass": not bad and accepted > 0}


def compare_upstream(ours_out: Sequence[Dict[str, Any]], plain_out: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Plain SGLang's ``routed_experts`` against ours: byte for byte in upstream's form, and its MoE layers' columns
    (sorted) against our record's rows."""
    import numpy as np

    equal_bytes = equal_record = tokens_equal = 0
    problems = []
    for i, (o, p) in enumerate(zip(ours_out, plain_out)):
        tokens_equal += o["output_ids"] == p["output_ids"]
        up_o, up_p = upstream_rows(o), upstream_rows(p)
        equal_bytes += up_o.shape == up_p.shape and bool(np.array_equal(up_o, up_p))
        rows, layers, _ = record_rows(o)
        k = rows.shape[-1]
        try:
            plain = up_p.reshape(rows.shape[0], -1, k)[:, list(layers), :]
            same = bool(np.array_equal(np.sort(plain, axis=-1), rows))
        except ValueError as exc:
            same = False
            problems.append(f"request {i}: {exc}")
        equal_record += same
        if not same and len(problems) < 8:
            problems.append(f"request {i}: plain SGLang's MoE columns differ from our record")
    n = len(ours_out)
    return {"requests": n, "output_ids_equal": f"{tokens_equal}/{n}", "routed_experts_equal": f"{equal_bytes}/{n}",
            "record_equal_plain_columns": f"{equal_record}/{n}", "problems": problems,
            "pass": n > 0 and equal_bytes == n and equal_record == n}


def overhead_summary(rounds: Dict[str, Any], workloads: Dict[str, tuple]) -> Dict[str, Any]:
    """Ours / plain tokens per second per round (= plain's wall time / ours, the same tokens), median and bootstrap
    95% interval per workload; server CPU seconds ours / plain beside it."""
    from benchmarks.stats import ratio_ci

    res: Dict[str, Any] = {"rounds": rounds["rounds"], "same_output_ids": rounds.get("same")}
    for w, (batch, chars, new) in workloads.items():
        wall, cpu = rounds["wall"][w], rounds["cpu"][w]
        res[w] = {"batch": batch, "prompt_tokens": chars, "max_new_tokens": new,
                  "tokens_per_s_ours_over_plain": ratio_ci(wall["plain"], wall["main"]),
                  "cpu_s_ours_over_plain": ratio_ci(cpu["main"], cpu["plain"]),
                  "wall_s_median": {s: round(sorted(v)[len(v) // 2], 4) for s, v in wall.items()}}
    return res


def router_gaps(model_dir: str, seqs: Sequence[Sequence[int]], device: str) -> List[Any]:
    """Per sequence, float32 [len - 1, MoE layers] gaps between the k-th and (k+1)-th routing score of
    transformers' own Glm4-MoE routers (sigmoid(logit) + e_score_correction_bias, what its top-k ranks)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    k = model.config.num_experts_per_tok
    routers = [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("TopkRouter")]
    if not routers:
        raise RuntimeError(f"no TopkRouter in {type(model).__name__}")
    seen: Dict[str, Any] = {}

    def hook(name):
        def fn(module, args, out):
            logits = (out[0] if isinstance(out, tuple) else out).float().reshape(-1, module.weight.shape[0])
            scores = torch.sigmoid(logits) + module.e_score_correction_bias.float()
            top = torch.topk(scores, k + 1, dim=-1).values
            seen[name] = (top[:, k - 1] - top[:, k]).cpu().numpy()
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in routers]
    out = []
    try:
        with torch.no_grad():
            for s in seqs:
                seen.clear()
                model(torch.tensor([list(s)[:-1]], device=device))
                out.append(np.stack([seen[n] for n, _ in routers], axis=1))
    finally:
        for h in handles:
            h.remove()
    return out


# -- the run --------------------------------------------------------------------------------------------------------


def run(args) -> int:
    out = Path(args.out or os.environ.get("OUT") or ROOT / ".gpu-kit" / "out").resolve()
    target = Path(args.target or Path(tempfile.gettempdir()) / "sglang-r3-gpu-kit").resolve()
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    rehearsal = bool(args.cpu_rehearsal)
    if not cuda and not args.dry_run and not rehearsal:
        print(NEEDS_CUDA)
        return 0
    name = torch.cuda.get_device_name(0) if cuda and not args.dry_run and not rehearsal else None
    res = Results(out, "cpu-rehearsal" if rehearsal and not args.dry_run else device_slug(name))
    plan = REHEARSAL if rehearsal else GPU
    res.data.update(device_name=name, dry_run=bool(args.dry_run), cpu_rehearsal=rehearsal, kit=str(args.kit),
                    argv=sys.argv[1:], serve_flags=list(plan.serve_flags), near_tie_gap=NEAR_TIE_GAP)
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                             capture_output=True, text=True)
        res.data["nvidia_smi"] = smi.stdout.strip()
    kit = res.step("unpack", unpack, Path(args.kit), target)
    if kit is None:
        return 1
    env = kit_env(Path(kit["site"]))
    res.step("probe", probe, env, out, import_sglang=not args.dry_run)
    gpu_steps = ("a_nograph_nospec", "plain_upstream_vs_a", "b_graph_nospec", "c_graph_mtp", "near_tie_gaps",
                 "b_vs_a", "c_vs_a", "c_mtp_section", "overhead", "gpu_check")
    if args.dry_run:
        for s in gpu_steps:
            res.skip(s, "dry run: no GPU step runs")
        res.data["summary"] = "dry run: unpack and probe only; nothing here is a GPU result"
        res.write()
        print(f"wrote {res.path}")
        return 0
    if rehearsal:
        res.data["summary"] = "CPU rehearsal: every step on the CPU runtime; nothing here is a GPU result"
    return gpu_run(args, res, env, out, plan)


def gpu_run(args, res: Results, env: Dict[str, str], out: Path, plan: Plan = GPU) -> int:
    deadline = res.t0 + args.budget_s
    left = lambda: max(30.0, deadline - time.monotonic())  # noqa: E731
    sys.path[1:1] = [str(ROOT), env["PYTHONPATH"].split(os.pathsep)[1]]  # this process reads answers with the kit
    ids = prompts()
    servers: Dict[str, Server] = {}
    answers: Dict[str, Any] = {}

    def serve(name: str, make, routing):
        def go():
            s = servers[name]
            ready = s.wait_ready(left())
            answers[name] = generate(s.url, ids, routing)
            return {"ready_s": ready, "cmd": s.cmd, "completion_tokens": sum(len(o["output_ids"]) for o in answers[name])}
        servers[name] = make()
        return go

    model = subprocess.run([sys.executable, "-c", "from sglang_r3.dev.embedded import ensure_embedded_model as e; "
                            "print(e())"], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    model_dir = model.stdout.strip().splitlines()[-1]
    res.data["model_dir"] = model_dir
    try:
        # 1. (a) alone first: what JIT kernels the kit lacks, its start builds (nvcc) and later starts reuse.
        res.step("a_nograph_nospec", serve("a_nograph_nospec", lambda: ours("a_nograph_nospec", CONFIGS["a_nograph_nospec"][0], env, out, plan), True))
        # 2. plain SGLang with (a)'s flags and (b), starting together.
        go_plain = serve("plain_upstream", lambda: plain_upstream("plain_upstream", model_dir, CONFIGS["a_nograph_nospec"][0], env, out, plan), None)
        go_b = serve("b_graph_nospec", lambda: ours("b_graph_nospec", CONFIGS["b_graph_nospec"][0], env, out, plan), True)
        res.step("plain_upstream_vs_a", lambda: {**go_plain(), **compare_upstream(answers["a_nograph_nospec"], answers["plain_upstream"])})
        for n in ("plain_upstream", "a_nograph_nospec"):
            servers.pop(n).stop()
        res.step("b_graph_nospec", go_b)
        # 3. (c) and SGLang without R3 (CUDA graphs on) start together; the overhead is ours (b) against the latter.
        go_c = serve("c_graph_mtp", lambda: ours("c_graph_mtp", CONFIGS["c_graph_mtp"][0], env, out, plan), {"mtp": True})
        servers["plain_graph"] = Server("plain_graph", ["benchmarks.plain_server", *plan.serve_flags, "--disable-speculation"],
                                        env, out)
        res.step("c_graph_mtp", go_c)

        def overhead():
            from benchmarks import capture_overhead

            ready = servers["plain_graph"].wait_ready(left())
            budget = min(90.0, max(20.0, deadline - time.monotonic() - 150))
            rounds = capture_overhead.pair_rounds(
                servers["plain_graph"].url, servers["b_graph_nospec"].url, workloads=OVERHEAD_WORKLOADS,
                min_rounds=plan.min_rounds, max_rounds=plan.max_rounds, budget_s=budget, pin=False,
                sides={"plain": (servers["plain_graph"].url, None), "main": (servers["b_graph_nospec"].url, True)})
            (out / "overhead_rounds.json").write_text(json.dumps(rounds, indent=1))
            return {"plain_ready_s": ready, "budget_s": round(budget, 1), **overhead_summary(rounds, OVERHEAD_WORKLOADS)}

        res.step("overhead", overhead)
        import httpx

        if "c_graph_mtp" in answers:
            layout = httpx.get(servers["c_graph_mtp"].url + "/routing/layout", timeout=30).json()
            res.step("c_mtp_section", mtp_tagged, answers["c_graph_mtp"], layout)
    finally:
        for s in servers.values():
            s.stop()
    gaps = None
    if "a_nograph_nospec" in answers:
        seqs = [list(p) + list(o["output_ids"]) for p, o in zip(ids, answers["a_nograph_nospec"])]
        gaps = res.step("near_tie_gaps", lambda: router_gaps(model_dir, seqs, plan.device))
        if gaps is not None:
            res.data["steps"]["near_tie_gaps"] = {"ok": True, "sequences": len(gaps),
                                                  "min_gap": float(min(g.min() for g in gaps)),
                                                  "pairs_below_threshold": int(sum((g < NEAR_TIE_GAP).sum() for g in gaps)),
                                                  "pairs": int(sum(g.size for g in gaps))}
        for n in ("b_graph_nospec", "c_graph_mtp"):
            if n in answers:
                res.step(f"{n[0]}_vs_a", compare_rows, answers["a_nograph_nospec"], answers[n], ids, gaps)
    (out / "answers.json").write_text(json.dumps(answers, default=str))

    def gpu_check():
        proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", *plan.gpu_check], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=max(60.0, deadline - time.monotonic() + 60))
        (out / "logs" / "gpu_check.log").write_text(proc.stdout + proc.stderr)
        lines = [l for l in proc.stdout.splitlines() if l.startswith(("PASS", "FAIL", "SKIP"))]
        return {"rc": proc.returncode, "checks": lines, "summary": proc.stdout.strip().splitlines()[-1:]}

    res.step("gpu_check", gpu_check)
    carried = res.data["steps"].get("unpack", {}).get("jit", {}).get("modules", [])
    res.step("jit", jit.accounting, Path(env["TVM_FFI_CACHE_DIR"]), carried, sorted((out / "logs").glob("*.log")))
    steps = res.data["steps"]
    verdicts = {n: steps[n].get("pass", steps[n].get("ok")) for n in steps}
    res.data["verdicts"] = verdicts
    res.write()
    print(f"wrote {res.path}")
    return 0 if all(v is not False for v in verdicts.values()) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default=str(DEFAULT_KIT), help="the kit archive (default: %(default)s)")
    ap.add_argument("--out", help="output folder (default: $OUT, else .gpu-kit/out)")
    ap.add_argument("--target", help="where the kit is unpacked (default: a folder under the temp dir)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's time (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="unpack, probe and write the results file only (any host; proves nothing about a GPU)")
    ap.add_argument("--cpu-rehearsal", action="store_true",
                    help="every step on this host's CPU runtime in the GPU's stead (proves the script and its "
                         "package set, nothing about a GPU; benchmarks.gpu.rehearse runs it)")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
