"""Test tiers by what a test needs: every test gets exactly one.

* ``fast``: no SGLang at all (records, layout, client, trainer code on numpy / torch / megatron-core).
  ``python -m pytest tests -m fast`` collects only the modules that can hold fast tests, and a run that
  selected nothing but fast tests makes ``import sglang`` fail, so a fast test that needs SGLang fails
  instead of passing by accident (``tests/test_tiers.py`` checks this in a fresh process).
* ``sglang``: SGLang imported in process, or a child process that runs SGLang code, with no server
  serving (argument checks, hooks, the manifest, start-up refusals, response building).
* ``server``: real SGLang servers or engines serving the embedded model (or others).

How a test gets its tier, first rule that applies:

1. a tier mark on the test function itself (``@pytest.mark.server`` where a module's own fixture starts
   a server);
2. ``server`` when it uses one of the suite's servers (any fixture that depends on ``_servers``:
   ``routing_server``, ``nospec_server``, ``tree_server``, ``soak_server``);
3. the module's (or class's) ``pytestmark``.

A test with no tier, or with two, stops the collection naming it. The tier marks of modules and classes
are defaults only: after the decision they are taken off those nodes and each test carries its own one,
so ``-m sglang`` does not select a module's server tests.

A run that selects only fast tests (``-m fast``, ``-k``, a file, a node id) runs them where SGLang cannot
be imported. When collecting the rest of the tree already imported it (``pytest tests -k NAME``), the
selected tests run in a fresh pytest process over their own files only, as ``-m fast`` would collect
them; a selected module that itself imports SGLang stops that run naming the module.
"""

from __future__ import annotations

import ast
import importlib.abc
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional

import pytest

__all__ = ["pytest_collection_finish", "pytest_collection_modifyitems", "pytest_ignore_collect",
           "pytest_make_collect_report", "pytest_runtest_makereport", "pytest_runtestloop",
           "pytest_sessionfinish"]

TIERS = ("fast", "sglang", "server")
SERVER_FIXTURES = frozenset({"_servers"})  # routing_server, nospec_server, ... all depend on it
# Set in the fresh process that runs a fast selection: the file listing the node ids it runs.
FRESH_RUN_ENV = "SGLANG_R3_FAST_SELECTION"

_first_importer = pytest.StashKey[str]()  # the collector during whose collection SGLang was first imported
_fresh_run = pytest.StashKey[List[str]]()  # node ids to run in a fresh process
_fresh_rc = pytest.StashKey[int]()


_ANY = None  # _marks_in's answer for a module it cannot read: it may carry any mark


def _marks_in(path: Path) -> Optional[FrozenSet[str]]:
    """Mark names a test module mentions as ``pytest.mark.<name>`` / ``mark.<name>``, read without importing it."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return _ANY  # cannot tell: collect it
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Attribute) and base.attr == "mark") or (
                    isinstance(base, ast.Name) and base.id == "mark"):
                found.add(node.attr)
    return frozenset(found)


def _could_select(expr, tiers, others_present=_ANY) -> bool:
    """Whether ``-m EXPR`` could select a test of one of these tiers. Another mark the module mentions (or
    any, for ``_ANY``) may be on a test or not; one it never mentions is on none of its tests (so ``-m
    release`` does not import a module without release tests)."""
    for tier in tiers:
        for others in (False, True):
            def match(name, **_kw):
                if name in TIERS:
                    return name == tier
                return others if others_present is _ANY or name in others_present else False
            if expr.evaluate(match):
                return True
    return False


def pytest_ignore_collect(collection_path, config) -> Optional[bool]:
    """Under ``-m``, a module none of whose tests can be selected is not imported at all: ``-m fast``
    imports only modules that declare fast tests. A module can hold server tests whatever it declares
    (rule 2), and one that declares no tier holds only server tests."""
    markexpr = config.option.markexpr
    path = Path(collection_path)
    if not markexpr or path.suffix != ".py" or not path.name.startswith("test_"):
        return None
    from _pytest.mark.expression import Expression

    try:
        expr = Expression.compile(markexpr)
    except SyntaxError:
        return None  # pytest reports the bad expression itself
    marks = _marks_in(path)
    tiers = set(TIERS) if marks is _ANY else (set(marks) & set(TIERS)) | {"server"}
    if _could_select(expr, tiers, marks):
        return None
    return True


def _decide(item) -> str:
    own = [m.name for m in item.own_markers if m.name in TIERS]
    uses_server = bool(SERVER_FIXTURES & set(item.fixturenames))
    where = item.nodeid
    if own:
        if len(set(own)) > 1:
            raise pytest.UsageError(f"{where}: more than one tier mark: {sorted(set(own))}")
        if uses_server and own[0] != "server":
            raise pytest.UsageError(f"{where}: marked {own[0]!r} but uses a suite server ({sorted(SERVER_FIXTURES & set(item.fixturenames))})")
        return own[0]
    if uses_server:
        return "server"
    inherited = {m.name for node in item.listchain()[:-1] for m in node.own_markers if m.name in TIERS}
    if len(inherited) > 1:
        raise pytest.UsageError(f"{where}: its module/class declares more than one tier: {sorted(inherited)}")
    if not inherited:
        raise pytest.UsageError(
            f"{where}: no tier (pytestmark = pytest.mark.fast | sglang | server; tests/support/tiers.py)")
    return inherited.pop()


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection reads the marks
def pytest_collection_modifyitems(session, config, items):
    if keep_file := os.environ.get(FRESH_RUN_ENV):
        # The fresh process runs exactly the selection it was handed (its files hold other tests too).
        keep = set(Path(keep_file).read_text().splitlines())
        dropped = [i for i in items if i.nodeid not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [i for i in items if i.nodeid in keep]
    tiers: Dict[str, str] = {}
    problems = []
    for item in items:
        try:
            tiers[item.nodeid] = _decide(item)
        except pytest.UsageError as e:
            problems.append(str(e))
    if problems:
        raise pytest.UsageError(f"{len(problems)} tests without exactly one tier:\n" + "\n".join(problems))
    for item in items:
        for node in item.listchain()[:-1]:
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
        item.own_markers[:] = [m for m in item.own_markers if m.name not in TIERS]
        item.add_marker(tiers[item.nodeid])


_BLOCKED = "a fast-tier test imported SGLang; mark it sglang or server (tests/support/tiers.py)"


class _NoSglang(importlib.abc.MetaPathFinder):
    """``import sglang`` fails in a run that selected only fast tests, as on a host without SGLang (code
    that falls back without it does so)."""

    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ImportError(f"{name}: {_BLOCKED}")
        return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A fast test that skips itself because SGLang is blocked (``pytest.importorskip("sglang")``) fails:
    it is not a fast test."""
    report = yield
    if report.skipped and call.excinfo is not None and _BLOCKED in str(call.excinfo.value):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: skipped for want of SGLang: {_BLOCKED}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Remembers which collector's collection (a module's import, a conftest) first imported SGLang."""
    before = "sglang" in sys.modules
    report = yield
    if not before and "sglang" in sys.modules:
        collector.config.stash.setdefault(_first_importer, collector.nodeid or str(collector.path))
    return report


def pytest_collection_finish(session):
    items = session.items
    if not items or any(item.get_closest_marker("fast") is None for item in items):
        return
    loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
    if not loaded:
        sys.meta_path.insert(0, _NoSglang())
        return
    importer = session.config.stash.get(_first_importer, None)
    selected_files = {item.nodeid.split("::")[0] for item in items}
    if os.environ.get(FRESH_RUN_ENV) or importer is None or importer.split("::")[0] in selected_files:
        where = f" ({importer})" if importer else " (before collection: a conftest or plugin)"
        raise pytest.UsageError(
            f"collecting the fast tier imported SGLang ({loaded[0]}, ...): a fast module imports it{where}")
    # Only fast tests were selected, but modules collected alongside them imported SGLang, which this
    # process cannot forget: the selection runs in a fresh process (pytest_runtestloop).
    session.config.stash[_fresh_run] = [item.nodeid for item in items]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    nodeids = session.config.stash.get(_fresh_run, None)
    if nodeids is None or session.config.option.collectonly:
        return None
    config = session.config
    inv = config.invocation_params
    # The same options, the selected tests' files in place of the paths given (or the testpaths).
    paths = set(config.args)
    options = [a for a in inv.args if a not in paths]
    files = sorted({str(item.path) for item in session.items})
    fd, keep = tempfile.mkstemp(prefix="r3-fast-selection-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(nodeids))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tests/support/tiers.py: the {len(nodeids)} selected tests are all fast, and collecting "
                            "the other modules imported SGLang: running them in a fresh process that cannot import it")
    try:
        rc = subprocess.call([sys.executable, "-m", "pytest", *options, *files], cwd=str(inv.dir),
                             env={**os.environ, FRESH_RUN_ENV: keep})
    finally:
        os.unlink(keep)
    config.stash[_fresh_rc] = rc
    # The fresh run wrote the --junitxml report; this run's empty one must not replace it.
    from _pytest.junitxml import xml_key

    if (xml := config.stash.get(xml_key, None)) is not None:
        xml.logfile = os.devnull
    return True


def pytest_sessionfinish(session, exitstatus):
    rc = session.config.stash.get(_fresh_rc, None)
    if rc is not None:
        session.exitstatus = rc  # the fresh run's outcome is this run's
