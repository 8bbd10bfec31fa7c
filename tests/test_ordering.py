"""The run order (tests/ordering.py): a module-scoped server group is set up once, even where a test parametrizes it
indirectly with its own list.

The oracle is pytest's own fixture machinery, run in a fresh process over a module shaped like
tests/test_families.py (a module-scoped ``served`` fixture over every group, a test that parametrizes it
indirectly with a few of them): the setups it records, with and without the plugin.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]

MODULE = """
import pytest

GROUPS = ["a", "b", "c", "d"]
SETUPS = []


@pytest.fixture(scope="module", params=GROUPS)
def served(request):
    SETUPS.append(request.param)
    yield request.param


def test_every_group(served):
    pass


@pytest.mark.parametrize("served", ["c", "d"], indirect=True)
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_a_few_groups(served, mode):
    pass


def test_zz_setups(request):
    print("SETUPS", SETUPS)
"""


def _setups(tmp_path: Path, plugin: bool):
    d = tmp_path / ("with" if plugin else "without")
    d.mkdir()
    (d / "test_groups.py").write_text(textwrap.dedent(MODULE))
    if plugin:
        (d / "conftest.py").write_text("from tests.ordering import pytest_collection_modifyitems  # noqa: F401\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_groups.py"],
                          cwd=d, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(l for l in proc.stdout.splitlines() if "SETUPS" in l)
    return ast.literal_eval(line[line.index("["):])


def test_each_group_is_set_up_once_where_pytest_alone_sets_some_up_again(tmp_path):
    # pytest groups by the parameter's index in each list: the indirect test's "c" (index 0) runs beside group
    # "a", its "d" beside "b", so "c" and "d" are set up twice without the plugin.
    without = _setups(tmp_path, plugin=False)
    assert sorted(without) != sorted(set(without)), without
    with_plugin = _setups(tmp_path, plugin=True)
    assert sorted(with_plugin) == ["a", "b", "c", "d"], with_plugin
