"""Session-wide real servers: the embedded model with MTP speculation (the default launch) and without, and
plain SGLang with its own capturer (the oracle of every launch path's main rows).

The ones a run needs start at once (they share the machine's two cores while loading) and
are stopped at the end of the session.
"""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.run import PlainServer
from benchmarks.soak import SOAK_SERVER_ENV, SOAK_SERVER_FLAGS
from sglang_r3.core import settings
from tests.support import children, ordering
from tests.support.servers import ServerProcess
from tests.support.tiers import *  # noqa: F401,F403  (the tier hooks: tests/support/tiers.py)

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    children.install()  # a run stopped by SIGTERM / SIGINT reaps its servers, gateways and Ray first
    config.pluginmanager.register(ordering, "sglang_r3_ordering")  # one block per server group


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    try:
        return (yield)
    finally:
        children.reclaim()  # a fixture may have called ray.init, which takes SIGTERM for itself


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    children.reclaim()
    try:
        return (yield)
    finally:
        children.reclaim()


@pytest.fixture(autouse=True)
def _settings_read_afresh():
    """``settings.current()`` is read once per process: a test that changes our variables (monkeypatch,
    a fixture that restores the environment) sees them, and the next test sees its own."""
    settings.current.cache_clear()
    yield
    settings.current.cache_clear()


ADMIN_KEY = "r3-admin-test-key"

SERVER_FLAGS = {
    "spec": [],  # no flags: exactly what `python -m sglang_r3.launch_server` serves
    "nospec": ["--disable-speculation", "--enable-metrics"],
    # EAGLE tree drafting (topk 2): accepted tokens' KV is moved, and rows must follow it. The admin
    # key guards state-changing endpoints only (/generate stays open). Default routing: every
    # /generate returns main rows unless it says otherwise (what survives sglang-router).
    "tree": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4",
             "--admin-api-key", ADMIN_KEY, "--r3-default-routing", "main"],
    # A KV pool a few requests wide: concurrent decodes run out of KV and SGLang retracts requests.
    "soak": SOAK_SERVER_FLAGS,
    # Plain SGLang: its own RoutedExpertsCapturer (--enable-return-routed-experts) with the nospec server's flags
    # (benchmarks/plain_server.py --upstream-capture resolves them as our launcher does), SGLANG_R3_ENABLED unset
    # and SGLANG_PLUGINS=none, so SGLang's loader does not even load our plugin; on a CPU host the CPU runtime is
    # all it shares with ours. Its routed_experts is the oracle for the main rows of every launch path.
    "plain": ["--disable-speculation", "--enable-metrics", "--upstream-capture"],
}
SERVER_ENV = {"soak": SOAK_SERVER_ENV, "plain": {"SGLANG_PLUGINS": "none"}}
SERVER_CLASS = {"plain": PlainServer}  # the others: ServerProcess, `python -m sglang_r3.launch_server`


# The session fixture of each suite server.
SERVER_OF_FIXTURE = {"routing_server": "spec", "nospec_server": "nospec", "tree_server": "tree",
                     "soak_server": "soak", "plain_server": "plain"}


def _servers_needed(items) -> set:
    """The suite servers the selected tests use, directly or through a module fixture (started together)."""
    return {SERVER_OF_FIXTURE[f] for item in items for f in item.fixturenames if f in SERVER_OF_FIXTURE}


class _Servers:
    def __init__(self, needed):
        self._procs = {}
        self._needed = needed

    def get(self, name: str) -> ServerProcess:
        # For development: reuse a server you already run (e.g. SGLANG_R3_TEST_URL_NOSPEC=http://127.0.0.1:31501).
        if url := os.environ.get(f"SGLANG_R3_TEST_URL_{name.upper()}"):
            return _Running(url)
        if name not in self._procs:
            # Start every server the selection needs that is not yet running, then wait: startups overlap.
            for n, flags in SERVER_FLAGS.items():
                if n not in self._procs and (n == name or n in self._needed):
                    server = SERVER_CLASS.get(n, ServerProcess)
                    self._procs[n] = server(flags, env=SERVER_ENV.get(n, {})).start()
        proc = self._procs[name]
        return proc.wait_ready()

    def stop_all(self):
        for p in self._procs.values():
            p.stop()


class _Running:
    def __init__(self, url):
        self.url = url


@pytest.fixture(scope="session")
def _servers(request):
    s = _Servers(_servers_needed(request.session.items))
    yield s
    s.stop_all()


@pytest.fixture(scope="session")
def routing_server(_servers) -> str:
    """Base URL of the default server: embedded model, MTP speculation on."""
    return _servers.get("spec").url


@pytest.fixture(scope="session")
def nospec_server(_servers) -> str:
    """Base URL of the embedded model served with --disable-speculation."""
    return _servers.get("nospec").url


@pytest.fixture(scope="session")
def tree_server(_servers) -> str:
    """Base URL of the embedded model with EAGLE tree drafting (topk 2)."""
    return _servers.get("tree").url


@pytest.fixture(scope="session")
def soak_server(_servers) -> str:
    """Base URL of the embedded model (MTP speculation on) with a small KV pool (forces retractions)."""
    return _servers.get("soak").url


@pytest.fixture(scope="session")
def plain_server(_servers) -> str:
    """Base URL of plain SGLang (no sglang-r3) serving the embedded model with its own capturer, spec off."""
    return _servers.get("plain").url
