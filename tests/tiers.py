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
"""

from __future__ import annotations

import ast
import importlib.abc
import sys
from pathlib import Path
from typing import Dict, FrozenSet, Optional

import pytest

TIERS = ("fast", "sglang", "server")
SERVER_FIXTURES = frozenset({"_servers"})  # routing_server, nospec_server, ... all depend on it



def _marks_in(path: Path) -> FrozenSet[str]:
    """Tier names a test module mentions as ``pytest.mark.<tier>`` / ``mark.<tier>``, read without importing it."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return frozenset(TIERS)  # cannot tell: collect it
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TIERS:
            base = node.value
            if (isinstance(base, ast.Attribute) and base.attr == "mark") or (
                    isinstance(base, ast.Name) and base.id == "mark"):
                found.add(node.attr)
    return frozenset(found)


def _could_select(expr, tiers) -> bool:
    """Whether ``-m EXPR`` could select a test of one of these tiers (other marks: either way)."""
    for tier in tiers:
        for others in (False, True):
            def match(name, **_kw):
                return name == tier if name in TIERS else others
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
    if _could_select(expr, _marks_in(path) | {"server"}):
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
        raise pytest.UsageError(f"{where}: no tier (pytestmark = pytest.mark.fast | sglang | server; tests/tiers.py)")
    return inherited.pop()


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection reads the marks
def pytest_collection_modifyitems(session, config, items):
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


_BLOCKED = "a fast-tier test imported SGLang; mark it sglang or server (tests/tiers.py)"


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


def pytest_collection_finish(session):
    items = session.items
    if not items or any(item.get_closest_marker("fast") is None for item in items):
        return
    loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
    if loaded:
        raise pytest.UsageError(f"collecting the fast tier imported SGLang ({loaded[0]}, ...): a fast module imports it")
    sys.meta_path.insert(0, _NoSglang())
