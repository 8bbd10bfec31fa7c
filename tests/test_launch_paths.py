"""``SGLANG_R3_ENABLED=1`` makes SGLang's own launchers serve capture as ``python -m sglang_r3.launch_server`` does.

Three paths no sglang_r3 launcher runs on, each a real SGLang serving the embedded model:

* ``python -m sglang.launch_server ...`` (SGLang's CLI);
* ``sglang.srt.entrypoints.http_server.launch_server(ServerArgs(...))`` in a ``multiprocessing.Process``,
  exactly as slime starts its rollout engines (``tests/scripts/slime_launch.py``, a stand-in for slime's actor);
* ``sglang.Engine(**kwargs)`` in process (``tests/scripts/sglang_engine_check.py``).

The oracle of main rows is plain SGLang's own capturer (the suite's ``plain_server``: no sglang-r3,
``--enable-return-routed-experts``, spec off) on the same greedy request: its ``routed_experts`` against each path's
record and ``routed_experts`` field. Our launcher's server for the same request (the suite's ``routing_server`` /
``nospec_server``) is the reference for the rest: same layout, same record (MTP section included), same field; our
``routed_experts`` is our capture re-encoded on both sides there. Each path also refuses, at start-up and naming the
flag, what our launcher refuses; and without the opt-in our plugin leaves SGLang exactly as it is.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import httpx
import numpy as np
import pytest

from sglang_r3.core import settings
from sglang_r3.dev.cpu import has_gpu
from sglang_r3.dev.embedded import default_speculative_flags, ensure_embedded_model
from tests.support.launch_paths import OPT_IN, SLIME_LAUNCH, SLIME_OVERRIDES, SPEC_OVERRIDES, SlimeLaunchServer
from tests.support.routing_http import TIMEOUT, greedy, ids
from tests.support.servers import ServerProcess, assert_main_rows_equal_plain_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.release]

ROOT = Path(__file__).resolve().parent.parent
CPU = not has_gpu()
PROMPT = ids("rollout on SGLang's own launcher")
# What our launcher serves the embedded model with (launch_server.resolve_argv), spelled for SGLang's
# CLI: fp32 (exact equality), and on a CPU host the CPU runtime's flags, which only our launcher adds
# (--sleep-on-idle too: an idle scheduler's busy poll would take the cores from every other test while
# this module's servers stay up).
CLI_FLAGS = ["--dtype", "float32", "--max-total-tokens", "65536"] + (
    ["--device", "cpu", "--disable-overlap-schedule", "--disable-cuda-graph", "--sleep-on-idle"] if CPU else []
)
REFUSAL_TIMEOUT_S = 300  # importing SGLang twice (parent and child) on a loaded 2-core machine


class SGLangCliServer(ServerProcess):
    """``python -m sglang.launch_server --port P ARGS`` (SGLang's CLI, not ours)."""

    def start(self) -> "SGLangCliServer":
        cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(self.port), *self.args]
        self.spawn(cmd, f"sglang-cli-{self.port}-", self.env)
        return self


def _cli_args(extra: List[str]) -> List[str]:
    return ["--model-path", str(ensure_embedded_model()), "--enable-return-routed-experts", *CLI_FLAGS, *extra]


@pytest.fixture(scope="module")
def opt_in_servers():
    """Both HTTP paths with MTP speculation, started together (their start-ups overlap)."""
    procs = {
        "sglang.launch_server": SGLangCliServer(_cli_args(default_speculative_flags()), env=OPT_IN).start(),
        "slime": SlimeLaunchServer([json.dumps({**SLIME_OVERRIDES, **SPEC_OVERRIDES})], env=OPT_IN).start(),
    }
    try:
        yield {name: p.wait_ready().url for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture(scope="module", params=["sglang.launch_server", "slime"])
def opt_in_server(request, opt_in_servers) -> str:
    return opt_in_servers[request.param]


# -- each path serves what our launcher serves ------------------------------------------------------


def test_opt_in_server_serves_our_layout(opt_in_server, routing_server):
    got = httpx.get(opt_in_server + "/routing/layout", timeout=TIMEOUT)
    assert got.status_code == 200, got.text
    assert got.json() == httpx.get(routing_server + "/routing/layout", timeout=TIMEOUT).json()


def test_opt_in_server_main_rows_equal_plain_sglangs_own_capturer(opt_in_server, plain_server):
    # Both our forms at once; the opt-in servers speculate (MTP), plain SGLang does not: main rows are the verify
    # passes', the same tokens' rows.
    got = greedy(opt_in_server, 8, input_ids=PROMPT, return_routing=True, return_routed_experts=True)
    plain = greedy(plain_server, 8, input_ids=PROMPT, return_routed_experts=True)
    assert_main_rows_equal_plain_sglang(got, plain, len(PROMPT), opt_in_server)


def test_opt_in_server_returns_a_routed_experts_field_equal_to_our_launchers(opt_in_server, routing_server):
    """Our ``routed_experts`` field (our capture re-encoded) on both sides, as slime asks for it; plain SGLang's own
    capturer is the oracle in the test above."""
    # What slime's rollout sends (slime/rollout/sglang_rollout.py: payload["return_routed_experts"] = True).
    got = greedy(opt_in_server, 8, input_ids=PROMPT, return_logprob=True, return_routed_experts=True)
    ref = greedy(routing_server, 8, input_ids=PROMPT, return_logprob=True, return_routed_experts=True)
    assert got["output_ids"] == ref["output_ids"]
    rows = np.frombuffer(base64.b64decode(got["meta_info"]["routed_experts"]), dtype=np.int32)
    np.testing.assert_array_equal(rows, np.frombuffer(base64.b64decode(ref["meta_info"]["routed_experts"]),
                                                      dtype=np.int32))
    assert rows.size == (len(PROMPT) + len(got["output_ids"]) - 1) * 4 * 4  # [T-1, num_hidden_layers, topk]


def test_opt_in_server_returns_role_tagged_records_equal_to_our_launcher(opt_in_server, routing_server):
    for option in (True, {"mtp": True}):
        got = greedy(opt_in_server, 8, input_ids=PROMPT, return_routing=option)
        ref = greedy(routing_server, 8, input_ids=PROMPT, return_routing=option)
        assert got["output_ids"] == ref["output_ids"]
        assert "routing_error" not in got["meta_info"], got["meta_info"].get("routing_error")
        got_rec, ref_rec = got["meta_info"]["routing"], ref["meta_info"]["routing"]
        if option is not True:
            # Draft rounds are numbered by each server's own verify counter: equal up to where it started.
            got_rounds, ref_rounds = (_rounds(r["mtp"].pop("rounds")) for r in (got_rec, ref_rec))
            np.testing.assert_array_equal(got_rounds - got_rounds[0], ref_rounds - ref_rounds[0])
        # layout fingerprint, layers, rows, token digest, weight version (and the MTP section) alike
        assert got_rec == ref_rec


def _rounds(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.int32).astype(np.int64)


@pytest.mark.server  # opt_in_server serves
def test_opt_in_server_refuses_an_id_outside_the_vocabulary_with_a_400_and_keeps_serving(opt_in_server):
    r = httpx.post(opt_in_server + "/generate", json={"input_ids": [1, 99999999], "sampling_params": {
        "max_new_tokens": 2}}, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert "input_ids[1]" in r.json()["error"]["message"]
    assert greedy(opt_in_server, 2, input_ids=PROMPT)["output_ids"]


@pytest.fixture(scope="module")
def engine_run():
    script = ROOT / "tests" / "scripts" / "sglang_engine_check.py"
    run = subprocess.run([sys.executable, str(script), json.dumps(PROMPT)], capture_output=True, text=True,
                         timeout=900, cwd=ROOT, env={**os.environ, **OPT_IN})
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_sglang_engine_main_rows_equal_plain_sglangs_own_capturer(engine_run, plain_server):
    plain = greedy(plain_server, 6, input_ids=PROMPT, return_routed_experts=True)  # the Engine's 6 tokens
    ours = {"output_ids": engine_run["output_ids"],
            "meta_info": {k: engine_run[k] for k in ("routing", "routed_experts") if engine_run[k] is not None}}
    assert engine_run["routing_error"] is None, engine_run["routing_error"]
    assert_main_rows_equal_plain_sglang(ours, plain, len(PROMPT), "sglang.Engine")


def test_sglang_engine_returns_a_routed_experts_field_and_record_equal_to_our_launchers(engine_run, nospec_server):
    """Our ``routed_experts`` field (our capture re-encoded) and record on both sides; plain SGLang's own capturer is
    the oracle in the test above."""
    ref = greedy(nospec_server, 6, input_ids=PROMPT, return_routing=True, return_routed_experts=True)
    assert engine_run["output_ids"] == ref["output_ids"]
    assert engine_run["routing_error"] is None
    np.testing.assert_array_equal(
        np.frombuffer(base64.b64decode(engine_run["routed_experts"]), dtype=np.int32),
        np.frombuffer(base64.b64decode(ref["meta_info"]["routed_experts"]), dtype=np.int32),
    )
    # The role-tagged record the in-process contract adds (JSON form), as our /generate builds it.
    assert engine_run["routing"] == ref["meta_info"]["routing"]


# -- each path refuses what our launcher refuses, at start-up, naming the flag ---------------------------


@pytest.mark.server  # engine_run serves an Engine
def test_sglang_engine_refuses_two_batch_overlap_naming_the_flag_before_any_process_starts(engine_run):
    refusal = engine_run["refusal"]
    assert refusal is not None, "sglang.Engine(enable_two_batch_overlap=True) started"
    assert refusal["type"] == "UnsupportedConfigError"
    assert "\n  --enable-two-batch-overlap: " in refusal["message"]
    assert any("SGLANG_R3_ENABLED=1" in n for n in refusal["notes"])
    assert refusal["children"] == 0


def _slime(overrides) -> List[str]:
    return [sys.executable, str(SLIME_LAUNCH), "0", json.dumps({**SLIME_OVERRIDES, **overrides})]


def _cli_without(omit: List[str]) -> List[str]:
    args = _cli_args([])
    for flag in omit:
        i = args.index(flag)
        del args[i: i + (2 if flag == "--device" else 1)]
    return [sys.executable, "-m", "sglang.launch_server", *args]


_CPU_FLAGS_OMITTED = {"device": ["--device"],
                      "overlap-and-graphs": ["--disable-overlap-schedule", "--disable-cuda-graph"]}
# The launches each test below expects refused at start-up: a test (and parameter) -> the command.
REFUSED_LAUNCHES = {
    "test_sglang_cli_refuses_two_batch_overlap_naming_the_flag":
        lambda: [sys.executable, "-m", "sglang.launch_server", *_cli_args(["--enable-two-batch-overlap"])],
    "test_slime_launch_refuses_another_speculative_algorithm_naming_the_flag":
        lambda: _slime({"speculative_algorithm": "NGRAM"}),
    "test_slime_launch_refuses_a_multi_tokenizer_server_naming_the_flag": lambda: _slime({"tokenizer_worker_num": 2}),
    "test_slime_launch_without_routed_experts_is_refused_naming_the_flag":
        lambda: _slime({"enable_return_routed_experts": None}),
    **{f"test_sglang_cli_on_a_cpu_host_refuses_missing_cpu_flags_naming_them[{k}]": (lambda o=o: _cli_without(o))
       for k, o in _CPU_FLAGS_OMITTED.items() if CPU},
}


@pytest.fixture(scope="module")
def launches(request, tmp_path_factory):
    """The selected tests' launches, all started at once: each is a SGLang import (parent and child) that ends at
    start-up, about 30 s on one core, which one by one ran in series. Yields test name -> its finished process."""
    selected = [item.name for item in request.session.items if item.name in REFUSED_LAUNCHES]
    folder = tmp_path_factory.mktemp("refusals")
    started = {}
    for name in selected:
        out, err = open(folder / f"{name}.out", "w+"), open(folder / f"{name}.err", "w+")
        proc = subprocess.Popen(REFUSED_LAUNCHES[name](), stdout=out, stderr=err, text=True, cwd=ROOT,
                                env={**os.environ, **OPT_IN})
        started[name] = (proc, out, err)

    def finished(name: str) -> subprocess.CompletedProcess:
        proc, out, err = started[name]
        try:
            proc.wait(timeout=REFUSAL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())

    yield finished
    for proc, out, err in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()


def _refused(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    # SGLang logs its resolved arguments right before it starts its scheduler processes: never got there.
    assert "server_args=" not in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return proc


def test_sglang_cli_refuses_two_batch_overlap_naming_the_flag(launches, request):
    proc = _refused(launches(request.node.name))
    assert "\n  --enable-two-batch-overlap: " in proc.stderr, proc.stderr[-3000:]
    assert "SGLANG_R3_ENABLED=1" in proc.stderr


def _installed_sglang() -> str:
    import importlib.metadata

    return importlib.metadata.version("sglang")


def test_slime_launch_refuses_another_speculative_algorithm_naming_the_flag(launches, request):
    # Resolved by SGLang before our plugin loads (slime's path): refused at check_server_args, in the child.
    proc = launches(request.node.name)
    if CPU and _installed_sglang() == "0.5.15.post1":
        # 0.5.15 resolves ServerArgs when slime builds it, in slime's own process (no plugin loaded there), and
        # itself refuses NGRAM off CUDA (arg_groups/speculative_hook.py _handle_ngram): no server starts, so no
        # child for our refusal. On a GPU the child starts and check_server_args refuses it as on 0.5.23.
        assert proc.returncode != 0 and "server_args=" not in proc.stdout + proc.stderr
        assert "Ngram speculative decoding only supports CUDA device" in proc.stderr, proc.stderr[-3000:]
        return
    proc = _refused(proc)
    assert "\n  --speculative-algorithm NGRAM: " in proc.stderr, proc.stderr[-3000:]
    assert "slime_launch: server process exited with 1" in proc.stdout


def test_slime_launch_refuses_a_multi_tokenizer_server_naming_the_flag(launches, request):
    # The same path with a setting every served release resolves on the CPU runtime: the child refuses it.
    proc = _refused(launches(request.node.name))
    assert "\n  --tokenizer-worker-num 2: " in proc.stderr, proc.stderr[-3000:]
    assert "slime_launch: server process exited with 1" in proc.stdout


def test_slime_launch_without_routed_experts_is_refused_naming_the_flag(launches, request):
    # A slime run without --use-rollout-routing-replay: capture asked for, but no request could get routing.
    proc = _refused(launches(request.node.name))
    assert "\n  --enable-return-routed-experts: " in proc.stderr, proc.stderr[-3000:]


@pytest.mark.skipif(not CPU, reason="the CPU runtime's flags are required only on a host without a GPU")
@pytest.mark.parametrize("named", [["--device cpu"], ["--disable-overlap-schedule", "--disable-cuda-graph"]],
                         ids=list(_CPU_FLAGS_OMITTED))  # the flags left out, named in the refusal
def test_sglang_cli_on_a_cpu_host_refuses_missing_cpu_flags_naming_them(named, launches, request):
    proc = _refused(launches(request.node.name))
    listed = [line.split(":", 1)[0].strip() for line in proc.stderr.splitlines() if line.startswith("  --")]
    assert listed == named, proc.stderr[-3000:]


@pytest.fixture
def our_launchers_resolved_args():
    """SGLang's resolved record for exactly the argv our launcher builds (in process; environment restored)."""
    saved = dict(os.environ)
    from sglang_r3.dev.cpu import activate_cpu_runtime
    from sglang_r3.serving.launch import resolve_argv

    if CPU:
        activate_cpu_runtime()
    from sglang_r3.serving.adapter.api import prepare_server_args
    from sglang_r3.seam.release import resolved

    server_args, resolve = prepare_server_args(resolve_argv([], cpu=CPU))
    resolve()
    yield resolved(server_args)
    os.environ.clear()
    os.environ.update(saved)


def test_opt_in_requires_exactly_what_our_launcher_adds(our_launchers_resolved_args, monkeypatch):
    from sglang_r3.serving.adapter.opt_in import missing_settings

    monkeypatch.delenv(settings.DEFAULT_ROUTING, raising=False)
    assert missing_settings(our_launchers_resolved_args) == []
    monkeypatch.setenv(settings.DEFAULT_ROUTING, "everything")  # what --r3-default-routing would refuse
    settings.current.cache_clear()  # read once per process: read this one afresh
    [missing] = missing_settings(our_launchers_resolved_args)
    assert missing.flag == "SGLANG_R3_DEFAULT_ROUTING (environment variable)"
    assert missing.reason.startswith("must be main|main+mtp|ref, got 'everything'; it says which routing")


# -- hooks bind or stop start-up; without the opt-in nothing is touched ----------------------------------


def test_hook_target_whose_module_fails_to_import_is_named_with_its_own_error(tmp_path, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_r3.seam import hooks

    pkg = tmp_path / "r3_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hooks, "_missing", [])
    monkeypatch.setattr(hooks, "_registered", [])
    target = "r3_probe_pkg.broken.Thing.method"
    # What SGLang's HookRegistry resolves with: the import error becomes a missing attribute.
    with pytest.raises(AttributeError, match="has no attribute 'broken'"):
        __import__("pkgutil").resolve_name(target)
    assert hooks.register(target, lambda original, *a, **k: None, HookType.AROUND) is False
    assert target not in HookRegistry._hooks  # never handed to SGLang, which would skip it silently
    with pytest.raises(hooks.HookTargetError) as info:
        hooks.raise_if_missing()
    assert info.value.targets == [target]
    assert f"\n  {target}: ImportError: libcuda.so.1: cannot open shared object file" in str(info.value)
    # And a target that is simply not there:
    monkeypatch.setattr(hooks, "_missing", [])
    assert hooks.register("r3_probe_pkg.Nothing.here", lambda *a: None, HookType.AFTER) is False
    with pytest.raises(hooks.HookTargetError, match=r"r3_probe_pkg\.Nothing\.here: AttributeError"):
        hooks.raise_if_missing()


@pytest.mark.skipif(not CPU, reason="with a GPU driver installed, sgl-kernel loads")
def test_plugin_that_cannot_install_stops_start_up_instead_of_being_skipped():
    # The CPU failure, for real: sgl-kernel cannot load libcuda.so.1 (the CPU runtime is marked as
    # prepared, but no stand-in is on the loader path). SGLang's loader logs a plugin's exception and goes on.
    env = {**OPT_IN, settings.CPU: "1", "SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": ""}
    proc = subprocess.run([sys.executable, "-c", "from sglang.srt.plugins import load_plugins; load_plugins()"],
                          capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S, cwd=ROOT,
                          env={**os.environ, **env})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "sglang-r3 refuses to start" in proc.stderr
    assert "libcuda.so.1" in proc.stderr.splitlines()[-1]
    assert "has no attribute" not in proc.stderr, proc.stderr[-3000:]


_PLUGIN_STATE = textwrap.dedent("""
    import json, os, sys
    before = dict(os.environ)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    import importlib.metadata  # not our package: importing it would load sglang_r3.serving.adapter
    resolution, response = (("__post_init__", "_wait_one_response")
                            if importlib.metadata.version("sglang") == "0.5.15.post1"
                            else ("resolve_once", "_stream_one_response"))
    print(json.dumps({
        "ours_loaded": "sglang_r3.serving.adapter" in sys.modules,
        "hooks": sorted([t, src.plugin_name if src else None] for t, hs in HookRegistry._hooks.items() for _, _, src in hs),
        "wrapped": [f for f, o in (("ServerArgs.resolution", getattr(ServerArgs, resolution)),
                                   ("ServerArgs.check_server_args", ServerArgs.check_server_args),
                                   ("TokenizerManager.response", getattr(TokenizerManager, response)))
                    if hasattr(o, "__wrapped__")],
        "env_changed": sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)),
    }))
""")


def _plugin_state(env) -> dict:
    env = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    proc = subprocess.run([sys.executable, "-c", _PLUGIN_STATE], capture_output=True, text=True,
                          timeout=REFUSAL_TIMEOUT_S, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_the_opt_in_sglang_loads_our_plugin_and_it_installs_nothing():
    from importlib.metadata import entry_points

    # Upstream: SGLang's loader with every installed plugin but ours (its SGLANG_PLUGINS allow-list).
    others = [e.name for e in entry_points(group="sglang.srt.plugins") if e.name != "sglang_r3"]
    upstream = _plugin_state({settings.ENABLED: None, "SGLANG_PLUGINS": ",".join(others) or "none"})
    off = _plugin_state({settings.ENABLED: None, "SGLANG_PLUGINS": None})
    assert off["ours_loaded"] and not upstream["ours_loaded"]  # SGLang found and ran ours
    assert {**off, "ours_loaded": False} == upstream  # same hooks, same wrapped methods, same environment
    assert not any(src == "sglang_r3" for _, src in off["hooks"])
    # The same loader with the opt-in: the methods above are ours to wrap, and only then.
    on = _plugin_state({**OPT_IN, "SGLANG_PLUGINS": None})
    ours = {t for t, src in on["hooks"] if src == "sglang_r3"}
    from sglang_r3.seam.versions import installed

    response = "_wait_one_response" if installed() == "0.5.15.post1" else "_stream_one_response"
    assert {"sglang.srt.server_args.ServerArgs.check_server_args",
            f"sglang.srt.managers.tokenizer_manager.TokenizerManager.{response}",
            "sglang.srt.layers.moe.topk.capture_routed_experts_if_allowed"} <= ours
    assert on["wrapped"] == ["ServerArgs.resolution", "ServerArgs.check_server_args", "TokenizerManager.response"]
