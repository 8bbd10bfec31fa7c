"""The test tiers (tests/tiers.py): every test has exactly one, and the fast tier needs no SGLang.

Each check runs pytest in a fresh process: what a tier imports is only visible in a process that imported
nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("fast", "sglang", "server")

# Loaded with -p before any conftest: makes SGLang unimportable (unless told otherwise) and prints, once
# collected, each test's tier marks and which sglang modules the collection imported.
PROBE = """
import importlib.abc, json, os, sys

if os.environ.get("PROBE_BLOCK_SGLANG") == "1":
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "sglang" or name.startswith("sglang."):
                raise ImportError("probe: SGLang is not installed here")
    sys.meta_path.insert(0, _Block())


def pytest_collection_finish(session):
    items = {i.nodeid: sorted({m.name for m in i.iter_markers()} & {"fast", "sglang", "server"}) for i in session.items}
    loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
    print("PROBE " + json.dumps({"items": items, "sglang_loaded": loaded}))
"""


def _pytest(args, *, cwd=ROOT, block_sglang=False, tmp_path: Path):
    (tmp_path / "tier_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PROBE_BLOCK_SGLANG": "1" if block_sglang else "0"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tier_probe", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _probe(proc) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


def test_the_fast_tier_collects_with_sglang_unimportable_and_holds_only_fast_tests(tmp_path):
    proc = _pytest(["tests", "-m", "fast", "--collect-only", "-q"], block_sglang=True, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = _probe(proc)
    assert seen["sglang_loaded"] == []
    assert len(seen["items"]) > 100
    assert {tuple(t) for t in seen["items"].values()} == {("fast",)}
    assert any(i.startswith("tests/trainer/") for i in seen["items"])  # megatron-core trainer tests are fast


@pytest.mark.sglang  # the whole suite's collection imports SGLang
def test_every_test_of_the_suite_has_exactly_one_tier_and_the_fast_run_collects_all_fast_ones(tmp_path):
    full = _pytest(["tests", "--collect-only", "-q"], tmp_path=tmp_path)
    assert full.returncode == 0, full.stdout[-3000:] + full.stderr[-3000:]
    items = _probe(full)["items"]
    assert {i: t for i, t in items.items() if len(t) != 1} == {}
    by_tier = {tier: {i for i, t in items.items() if t == [tier]} for tier in TIERS}
    assert all(by_tier.values()), {k: len(v) for k, v in by_tier.items()}
    fast = _pytest(["tests", "-m", "fast", "--collect-only", "-q"], tmp_path=tmp_path)
    assert set(_probe(fast)["items"]) == by_tier["fast"]
    # A module's declared tier is a default: its tests that use a suite server are server tests only.
    server = _pytest(["tests", "-m", "server", "--collect-only", "-q"], tmp_path=tmp_path)
    assert set(_probe(server)["items"]) == by_tier["server"]
    assert any("test_hostile_input" in i for i in by_tier["server"])  # fast module, tests on nospec_server
    assert any("test_hostile_input" in i for i in by_tier["fast"])


SAMPLE = '''
import pytest

pytestmark = pytest.mark.{module_tier}


@pytest.fixture
def _servers():  # stands for the suite's session servers: a test that uses it is a server test
    return None


def test_plain():
    pass


def test_with_server(_servers):
    pass


def test_imports_sglang():
    import sglang  # noqa: F401


def test_skips_without_sglang():
    pytest.importorskip("sglang")
'''


def _sample(tmp_path: Path, module_tier: str) -> Path:
    d = tmp_path / "sample"
    d.mkdir()
    (d / "test_sample.py").write_text(textwrap.dedent(SAMPLE.format(module_tier=module_tier)))
    (d / "conftest.py").write_text("from tests.tiers import pytest_collection_finish, pytest_collection_modifyitems, "
                                   "pytest_ignore_collect, pytest_runtest_makereport  # noqa: F401\n")
    return d


def test_a_fast_test_that_reaches_for_sglang_fails_rather_than_passing_or_skipping(tmp_path):
    d = _sample(tmp_path, "fast")
    proc = _pytest(["-m", "fast", "-q", "-rA", "test_sample.py"], cwd=d, tmp_path=tmp_path)
    out = proc.stdout
    assert "PASSED test_sample.py::test_plain" in out, out[-3000:]
    assert "FAILED test_sample.py::test_imports_sglang" in out and "FAILED test_sample.py::test_skips_without_sglang" in out, out[-3000:]
    assert "test_with_server" not in _probe(proc)["items"]  # a server test, whatever the module says


def test_a_modules_tier_is_the_default_and_a_suite_server_makes_a_server_test(tmp_path):
    d = _sample(tmp_path, "sglang")
    sglang = _probe(_pytest(["-m", "sglang", "--collect-only", "-q", "test_sample.py"], cwd=d, tmp_path=tmp_path))
    server = _probe(_pytest(["-m", "server", "--collect-only", "-q", "test_sample.py"], cwd=d, tmp_path=tmp_path))
    assert set(sglang["items"]) == {"test_sample.py::test_plain", "test_sample.py::test_imports_sglang",
                                    "test_sample.py::test_skips_without_sglang"}
    assert server["items"] == {"test_sample.py::test_with_server": ["server"]}


def test_a_test_without_a_tier_stops_the_collection_naming_it(tmp_path):
    d = tmp_path / "untiered"
    d.mkdir()
    (d / "test_untiered.py").write_text("def test_nobody_said():\n    pass\n")
    (d / "conftest.py").write_text("from tests.tiers import pytest_collection_modifyitems  # noqa: F401\n")
    proc = _pytest(["--collect-only", "-q", "test_untiered.py"], cwd=d, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "test_untiered.py::test_nobody_said: no tier" in proc.stdout + proc.stderr
