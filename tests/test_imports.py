"""The import structure the architecture promises: one SGLang adapter, floors, and no import circle.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked by import-linter's own
``lint-imports``; the circle check walks grimp's graph (import-linter's graph library). Imports inside
functions count: a lazy import is still a dependency.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx
import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]


def _env():
    # grimp finds packages on sys.path; the editable install's finder hook is not a path entry.
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_only_the_adapter_imports_sglang_and_every_floor_imports_only_downward():
    lint = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    run = subprocess.run(cmd + ["--no-cache"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "5 kept, 0 broken" in run.stdout


def test_no_module_of_the_project_takes_part_in_an_import_circle(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    graph = grimp.build_graph("sglang_r3", "sglang_r3_server", "benchmarks", cache_dir=None)
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_node(m)
        for d in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, d)
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not circles, "\n".join(
        " -> ".join(a for a, _ in nx.find_cycle(g.subgraph(c))) + f" (a circle among {len(c)} modules)" for c in circles)


def test_every_sglang_name_the_adapter_api_hands_out_is_in_the_manifest():
    # adapter/api.py is how the rest of the project reaches SGLang; each name it imports is a manifest
    # entry, so `python -m sglang_r3.tools.manifest_check` (and its test) checks it against the installed SGLang.
    import ast

    from sglang_r3.seam.manifest import MANIFEST

    tree = ast.parse((ROOT / "sglang_r3" / "serving" / "adapter" / "api.py").read_text())
    names = [f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and (node.module or "").split(".")[0] == "sglang" for alias in node.names]
    assert len(names) >= 10
    listed = {e.target for e in MANIFEST}
    # A module imported whole (``from sglang.srt.entrypoints import http_server``) is listed by what we use of it.
    unlisted = [n for n in names if n not in listed and not any(t.startswith(n + ".") for t in listed)]
    assert not unlisted, f"not in sglang_r3/seam/manifest.py: {unlisted}"


def test_the_install_is_the_package_tree_and_nothing_generic():
    # pyproject lists the packages (server/ installs as sglang_r3_server); a new subpackage left out of the
    # list would be missing from a wheel, and benchmarks/ or tests/ in it would land in site-packages.
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    where = {name: ROOT / folder for name, folder in tool["package-dir"].items()}
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sglang_r3").rglob("__init__.py")}
    tree |= {"sglang_r3_server." + ".".join(p.parent.relative_to(where["sglang_r3_server"]).parts)
             for p in where["sglang_r3_server"].rglob("__init__.py")}
    tree = {t.rstrip(".") for t in tree}
    assert set(tool["packages"]) == tree
    assert all(name.split(".")[0] in ("sglang_r3", "sglang_r3_server") for name in tool["packages"])
