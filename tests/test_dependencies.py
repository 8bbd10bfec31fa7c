"""Fresh-machine reproducibility: what pip resolved is what the suite was run against.

``pyproject.toml`` bounds every third-party package the code, the server or the tests rely on (its
comment says how). These checks fail, naming the package, when the installed versions leave those bounds
(a fresh machine that resolved a newer release, a hand-upgraded environment), when a requirement has no
ceiling, and when code imports a package pyproject does not list.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = [pytest.mark.fast, pytest.mark.release]

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("sglang_r3", "server", "benchmarks", "tests")
CEILING_OPS = {"<", "<=", "==", "==="}  # "~=" is a ceiling too, but pyproject spells bounds out
# Requirements allowed without a ceiling, and why (the test extra pins each of them).
NO_CEILING = {("trainer", "megatron-core"): "a Megatron image brings its own megatron-core"}


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirement_lists(project: dict, extra: str = "test") -> List[Tuple[str, Requirement]]:
    """(list name, requirement) for the base install and every extra that ``extra`` pulls in."""
    out: List[Tuple[str, Requirement]] = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for r in map(Requirement, project["optional-dependencies"][name]):
            if canonicalize_name(r.name) == canonicalize_name(project["name"]):
                todo.extend(sorted(r.extras))
            else:
                out.append((name, r))
    return out


def out_of_bounds(reqs: Iterable[Tuple[str, Requirement]], installed: Dict[str, str]) -> List[str]:
    """One line per requirement the installed versions do not meet, naming the package."""
    problems = []
    for where, req in reqs:
        if req.marker is not None and not req.marker.evaluate({"extra": where}):
            continue
        version = installed.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name}: not installed, pyproject.toml [{where}] asks {req.specifier or 'any'}")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} is outside {req.specifier} (pyproject.toml [{where}])")
    return problems


def installed_versions() -> Dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in md.distributions()}


def test_the_check_names_a_package_outside_its_bounds_and_one_that_is_missing():
    reqs = [("test", Requirement("orjson>=3.8.3,<3.13")), ("server", Requirement("fastapi<1")),
            ("test", Requirement("msgpack>=1.2")), ("test", Requirement("pywin32>=1; sys_platform == 'win32'"))]
    assert out_of_bounds(reqs, {"orjson": "3.13.0", "fastapi": "0.165.0"}) == [
        "orjson 3.13.0 is outside <3.13,>=3.8.3 (pyproject.toml [test])",
        "msgpack: not installed, pyproject.toml [test] asks >=1.2",
    ]


# Which install this environment is: the README's (`.[test]`, SGLang 0.5.23) or slime's image as .ci/release-env
# makes it (SGLang 0.5.15.post1 first, then `.[server]`, then the test packages of `.[test-sglang-0-5-15]`).
INSTALL_OF_SGLANG = {"0.5.23": "test", "0.5.15.post1": "test-sglang-0-5-15"}
# What each SGLang release pins of its own stack (its wheel's metadata): the server extra must admit it, so pip
# leaves an image's SGLang, torch and sgl-kernel alone.
RELEASE_PINS = {"0.5.23": {"torch": "2.14.1", "sglang-kernel": "0.4.10"},
                "0.5.15.post1": {"torch": "2.11.0", "sglang-kernel": "0.4.4"}}
RELEASE_ENV = ROOT / ".ci" / "release-env"


def this_install() -> str:
    return INSTALL_OF_SGLANG.get(installed_versions().get("sglang", ""), "test")


def test_each_served_sglang_release_has_its_install_and_the_server_extra_admits_both():
    from sglang_r3.seam.versions import SERVED

    project = _project()
    assert set(INSTALL_OF_SGLANG) == set(SERVED) == set(RELEASE_PINS)
    server = {canonicalize_name(r.name): r for _, r in requirement_lists(project, "server")}
    for release, pins in RELEASE_PINS.items():
        for name, version in {"sglang": release, **pins}.items():
            assert server[name].specifier.contains(version, prereleases=True), (release, name, version)
    # The README's install pins the newest release's stack itself.
    test = {canonicalize_name(r.name): r for w, r in requirement_lists(project, "test") if w == "test"}
    newest = {"sglang": "0.5.23", **RELEASE_PINS["0.5.23"]}
    assert {n: [s.version for s in test[n].specifier if s.operator == "=="] for n in newest} == \
        {n: [v] for n, v in newest.items()}


def test_the_oldest_release_installs_as_users_do():
    # slime's image: SGLang first, then `.[server]` with the unmoved check right after it, then test packages
    # that name none of SGLang's stack (a pin there would hide what `.[server]` does to the image).
    project = _project()
    text = RELEASE_ENV.read_text()
    steps = [line.strip() for line in text.splitlines() if " -m pip install " in line and not line.lstrip().startswith("#")]
    assert 'sglang==$SGLANG' in steps[1] and '-e ".[server]"' in steps[2] and "test-sglang-0-5-15" in steps[3], steps
    after_server = text.split('-e ".[server]"', 2)[2].lstrip().splitlines()[0]
    assert after_server.startswith("unmoved "), after_server
    assert 'SGLANG=0.5.15.post1' in text and f'TORCH={RELEASE_PINS["0.5.15.post1"]["torch"]}' in text
    own = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["test-sglang-0-5-15"]}
    assert not own & {"sglang", "torch", "sglang-kernel", "sglang-r3"}, own


def test_this_install_has_its_release_s_own_stack():
    have = installed_versions()
    release = have.get("sglang")
    if release not in RELEASE_PINS:
        pytest.skip(f"SGLang {release} is not a served release")
    assert {n: have.get(n) for n in RELEASE_PINS[release]} == RELEASE_PINS[release]


def _install_lists(extra: str) -> List[Tuple[str, Requirement]]:
    reqs = requirement_lists(_project(), extra)
    if extra != "test":  # the release environment: `.[server]`, then the test packages
        reqs += [(w, r) for w, r in requirement_lists(_project(), "server") if w != "dependencies"]
    return reqs


def test_installed_versions_are_inside_every_bound_of_the_test_install():
    extra = this_install()
    problems = out_of_bounds(_install_lists(extra), installed_versions())
    assert not problems, ("installed versions leave pyproject.toml's bounds (the suite was not run against "
                          f"them; reinstall with pip install -e \".[{extra}]\" or run the suite and widen the "
                          "bound):\n" + "\n".join(problems))


def test_every_requirement_has_a_ceiling():
    project = _project()
    lists = [("dependencies", Requirement(r)) for r in project["dependencies"]] + [
        (extra, Requirement(r)) for extra, rs in project["optional-dependencies"].items() for r in rs]
    open_ended = [f"{req} (pyproject.toml [{where}])" for where, req in lists
                  if canonicalize_name(req.name) != canonicalize_name(project["name"])
                  and (where, canonicalize_name(req.name)) not in NO_CEILING
                  and not any(s.operator in CEILING_OPS for s in req.specifier)]
    assert not open_ended, "requirements without an upper bound:\n" + "\n".join(open_ended)
    for where, name in NO_CEILING:  # each exemption is pinned where the suite installs it
        test_pins = [r for w, r in requirement_lists(project) if w == "test" and canonicalize_name(r.name) == name]
        assert any(s.operator == "==" for r in test_pins for s in r.specifier), name


def _local_modules() -> Set[str]:
    names = set(SCANNED) | {"sglang_r3_server"}  # server/ installs under that name
    for root in SCANNED:
        for p in (ROOT / root).rglob("*"):
            if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()):
                names.add(p.stem if p.suffix == ".py" else p.name)
    return names


def imported_top_level_names() -> Dict[str, Set[str]]:
    """Top-level module name -> files importing it, for every import in the scanned trees (functions too)."""
    found: Dict[str, Set[str]] = {}
    for root in SCANNED:
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_package_the_code_imports_is_bounded_in_pyproject():
    declared = {canonicalize_name(r.name) for _, r in requirement_lists(_project())}
    local, dists = _local_modules(), md.packages_distributions()
    undeclared = []
    for name, files in sorted(imported_top_level_names().items()):
        if name in sys.stdlib_module_names or name in local or name == "__future__":
            continue
        # A name no installed distribution provides is an optional import of something absent here
        # (slime itself); it cannot be relied on by a run of this suite.
        owners = {canonicalize_name(d) for d in dists.get(name, [])}
        if owners and not owners & declared:
            undeclared.append(f"{name} (distribution {', '.join(sorted(owners))}) imported by {sorted(files)[:3]}")
    assert not undeclared, "imported but not bounded in pyproject.toml:\n" + "\n".join(undeclared)
