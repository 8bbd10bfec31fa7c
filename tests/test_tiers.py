"""The test tiers (tests/support/tiers.py): every test has exactly one, and the fast tier needs no SGLang.

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

from tests.support.tiers import FRESH_RUN_ENV

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


SAMPLE_CONFTEST = "from tests.support.tiers import *  # noqa: F401,F403\n"


def _sample(tmp_path: Path, module_tier: str) -> Path:
    d = tmp_path / "sample"
    d.mkdir()
    (d / "test_sample.py").write_text(textwrap.dedent(SAMPLE.format(module_tier=module_tier)))
    (d / "conftest.py").write_text(SAMPLE_CONFTEST)
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
    (d / "conftest.py").write_text("from tests.support.tiers import pytest_collection_modifyitems  # noqa: F401\n")
    proc = _pytest(["--collect-only", "-q", "test_untiered.py"], cwd=d, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "test_untiered.py::test_nobody_said: no tier" in proc.stdout + proc.stderr


# -- targeted runs: -k, a file, a node id ------------------------------------------------------------------
# A tree like the suite's: fast modules next to a module that imports SGLang when collected. A stand-in
# `sglang` package (first on the path) takes SGLang's place: the guard goes by module name, and the
# stand-in imports in milliseconds where SGLang takes seconds.

TREE = {
    "test_fast_a.py": """
import pytest

pytestmark = pytest.mark.fast


def test_plain_a():
    pass


def test_reaches_for_sglang():
    import sglang  # noqa: F401
""",
    "test_fast_b.py": """
import pytest

pytestmark = pytest.mark.fast


def test_plain_b():
    pass
""",
    "test_0_needs_sglang.py": """  # collected first: it, not a selected module, imports SGLang
import pytest
import sglang  # noqa: F401

pytestmark = pytest.mark.sglang


def test_uses_sglang():
    assert sglang.STAND_IN
""",
}


def _tree(tmp_path: Path, extra: dict = None) -> Path:
    d = tmp_path / "tree"
    d.mkdir()
    for name, text in {**TREE, **(extra or {})}.items():
        (d / name).write_text(textwrap.dedent(text))
    (d / "conftest.py").write_text(SAMPLE_CONFTEST)
    fake = tmp_path / "stand_in" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("STAND_IN = True\n")
    return d


def _run_tree(args, d: Path, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "stand_in"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop(FRESH_RUN_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args], cwd=d, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc, proc.stdout + proc.stderr


def _outcomes(out: str) -> dict:
    return {line.split()[1]: line.split()[0] for line in out.splitlines() if line.split()[:1] in (["PASSED"], ["FAILED"])}


def test_a_keyword_selection_of_fast_tests_runs_them_although_other_modules_import_sglang(tmp_path):
    d = _tree(tmp_path)
    proc, out = _run_tree(["-k", "plain", f"--junitxml={tmp_path / 'report.xml'}"], d, tmp_path)
    assert proc.returncode == 0, out[-3000:]
    assert _outcomes(out) == {"test_fast_a.py::test_plain_a": "PASSED", "test_fast_b.py::test_plain_b": "PASSED"}
    assert "running them in a fresh process that cannot import it" in out  # SGLang was imported by collection
    report = (tmp_path / "report.xml").read_text()  # the fresh run's report, not the first process's empty one
    assert report.count("<testcase ") == 2 and 'name="test_plain_a"' in report, report


def test_a_keyword_selection_still_fails_a_fast_test_that_imports_sglang(tmp_path):
    d = _tree(tmp_path)
    proc, out = _run_tree(["-k", "plain_a or reaches"], d, tmp_path)
    assert proc.returncode == 1, out[-3000:]
    assert _outcomes(out) == {"test_fast_a.py::test_plain_a": "PASSED",
                              "test_fast_a.py::test_reaches_for_sglang": "FAILED"}
    assert "a fast-tier test imported SGLang" in out


def test_a_file_and_a_node_id_run_what_they_name_with_sglang_blocked(tmp_path):
    d = _tree(tmp_path)
    proc, out = _run_tree(["test_fast_a.py"], d, tmp_path)
    assert proc.returncode == 1, out[-3000:]
    assert _outcomes(out) == {"test_fast_a.py::test_plain_a": "PASSED",
                              "test_fast_a.py::test_reaches_for_sglang": "FAILED"}
    proc, out = _run_tree(["test_fast_b.py::test_plain_b", "test_fast_a.py::test_reaches_for_sglang"], d, tmp_path)
    assert proc.returncode == 1, out[-3000:]
    assert _outcomes(out) == {"test_fast_b.py::test_plain_b": "PASSED",
                              "test_fast_a.py::test_reaches_for_sglang": "FAILED"}
    assert "fresh process" not in out  # nothing collected imported SGLang: no second process needed


def test_a_selected_fast_module_that_imports_sglang_stops_the_run_naming_it(tmp_path):
    bad = {"test_fast_c.py": "import pytest\nimport sglang  # noqa: F401\n\npytestmark = pytest.mark.fast\n\n\n"
                             "def test_plain_c():\n    pass\n"}
    d = _tree(tmp_path, bad)
    for args in (["-k", "plain"], ["test_fast_c.py"], ["-m", "fast"]):
        proc, out = _run_tree(args, d, tmp_path)
        assert proc.returncode != 0 and _outcomes(out) == {}, (args, out[-3000:])
        assert "collecting the fast tier imported SGLang (sglang, ...): a fast module imports it (test_fast_c.py)" in out, (args, out[-3000:])


@pytest.mark.sglang  # collecting the whole tree imports SGLang (in a child process)
def test_the_readme_targeted_run_of_two_fast_tests_from_the_whole_tree_runs_them():
    # The command: -k over the whole suite, whose collection imports SGLang.
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "-k", "seed_001 or seed_000", "-p", "no:cacheprovider",
                           "-rA", "-W", "ignore::DeprecationWarning"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={k: v for k, v in os.environ.items() if k != FRESH_RUN_ENV})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    ran = _outcomes(out)
    assert ran and set(ran.values()) == {"PASSED"}, out[-3000:]
    assert all("::test_seed_000_" in t or "::test_seed_001_" in t for t in ran), ran
    assert "ERROR: collecting the fast tier imported SGLang" not in out
