"""A test run stopped by SIGTERM (a CI timeout) or SIGINT (Ctrl-C) leaves none of its children behind.

A small pytest session runs in a child process under the suite's own conftest (``-p tests.conftest``): it
starts a real SGLang server with the suite's ``ServerProcess``, SGLang's gateway (``sglang-router``) in
front of it, and a local Ray cluster with an actor, as the suite's fixtures do. Once every one of those
processes is up, the session's pytest process alone gets the signal; afterwards no process of its tree
may be left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import psutil
import pytest

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 900  # server start-up on a loaded 2-core machine
GONE_TIMEOUT_S = 120  # upper bound only: the reaper signals, waits 2 x 3 s, and the run exits

SESSION = '''
import json, os, threading, time

import psutil
import pytest
import ray

from sglang_r3.serving.fleet.gateway import Gateway
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.server

READY = {ready!r}


@pytest.fixture
def cluster():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)  # takes SIGTERM for itself
    yield
    ray.shutdown()


@ray.remote
class Actor:
    def pid(self):
        return os.getpid()


def names(procs):
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()) or p.name())
        except psutil.Error:
            pass
    return out


def test_starts_children_then_waits_to_be_stopped(cluster):
    server = ServerProcess(["--disable-speculation"]).start()
    # Gateway.start() waits for a healthy worker; the gateway process exists long before that.
    threading.Thread(target=lambda: Gateway([server.url]).start(timeout_s=3600), daemon=True).start()
    actor = Actor.remote()
    actor_pid = ray.get(actor.pid.remote())
    while True:
        tree = psutil.Process(server.proc.pid).children(recursive=True)
        everyone = psutil.Process().children(recursive=True)
        assert any(p.pid == actor_pid for p in everyone), "the actor's worker died"
        # SGLang's scheduler and detokenizer are up, and so is the gateway (it names itself sglang::router).
        if len(tree) >= 2 and any("sglang::router" in n or "sglang_router" in n for n in names(everyone)):
            break
        assert server.proc.poll() is None, server.log_tail()
        time.sleep(1)
    with open(READY + ".tmp", "w") as f:
        json.dump({{"server": server.proc.pid, "server_tree": [p.pid for p in tree], "actor": actor_pid}}, f)
    os.rename(READY + ".tmp", READY)
    time.sleep(3600)  # stopped by the signal
'''


def _snapshot(root: psutil.Process) -> Dict[int, psutil.Process]:
    return {p.pid: p for p in root.children(recursive=True)}


def _alive(procs: List[psutil.Process]) -> List[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running checks the create time
                out.append(f"{p.pid} {' '.join(p.cmdline())[:160] or p.name()}")
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_leaves_no_server_gateway_or_ray_process(tmp_path, sig):
    ready = tmp_path / "ready.json"
    (tmp_path / "test_session.py").write_text(textwrap.dedent(SESSION.format(ready=str(ready))))
    log = open(tmp_path / "session.log", "w")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           # Ray's memory monitor kills workers when the machine's memory runs low (other servers of the
           # suite); the actor must stay up until the signal, so it is off here.
           "RAY_memory_monitor_refresh_ms": "0"}
    # Its own session: whatever happens below, the finally clause can still take the whole tree down.
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                              "-q", "-s", "test_session.py"], cwd=tmp_path, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    snapshot: Dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            assert inner.poll() is None, (tmp_path / "session.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the session's children did not come up"
            time.sleep(1)
        started = json.loads(ready.read_text())
        snapshot = _snapshot(psutil.Process(inner.pid))
        cmdlines = " | ".join(" ".join(p.cmdline()) for p in snapshot.values() if p.is_running())
        # The tree holds what the issue names: the SGLang server, the gateway, Ray's own processes.
        assert {started["server"], started["actor"], *started["server_tree"]} <= set(snapshot)
        assert "sglang_r3.launch_server" in cmdlines and "sglang::router" in cmdlines
        assert "raylet" in cmdlines and "gcs_server" in cmdlines

        os.kill(inner.pid, sig)  # only the pytest process, as a CI runner's timeout does
        rc = inner.wait(timeout=GONE_TIMEOUT_S)
        if sig == signal.SIGTERM:
            assert rc == -signal.SIGTERM  # ended by the signal, as an unhandled SIGTERM ends a process
        else:
            assert rc == pytest.ExitCode.INTERRUPTED, (tmp_path / "session.log").read_text()[-4000:]
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while _alive(list(snapshot.values())) and time.monotonic() < deadline:
            time.sleep(1)
        left = _alive(list(snapshot.values()))
        assert not left, "left behind:\n" + "\n".join(left)
    finally:
        log.close()
        for p in snapshot.values():
            try:
                p.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(inner.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        inner.wait(timeout=60)
