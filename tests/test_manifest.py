"""The adapter's manifest (sglang_r3/seam/manifest.py) against the installed SGLang.

Every hook, instance patch, route change and private name we touch is listed with the shape it was
written against; a target that is gone or changed stops start-up naming it. The checks run in fresh
processes: the plugin's hook list is process-global, and start-up is what is being tested.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.release]

TARGET = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGLANG_R3_ENABLED": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_target_of_the_manifest_is_as_written_against_in_the_installed_sglang():
    r = subprocess.run([sys.executable, "-m", "sglang_r3.tools.manifest_check"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CHANGED" not in r.stdout


def test_the_plugin_starts_and_every_hook_it_registers_is_in_the_manifest():
    r = _run("""
        import sglang_r3.serving.adapter as p
        from sglang_r3.seam import hooks, manifest
        p.plugin()  # what SGLang's plugin loader calls in every process it starts
        got = hooks.registered()
        assert got and all(t in manifest.by_target() for t in got), got
        print("REGISTERED", len(got))
    """)
    assert r.returncode == 0 and "REGISTERED" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("change,expect", [
    ("renamed", "has no attribute 'normalize_batch_and_arguments'"),
    ("signature", "signature changed: written against (self, strict)"),
    ("unlisted", "in sglang_r3/seam/manifest.py"),
])
def test_a_hook_target_that_is_renamed_changed_or_unlisted_stops_start_up_naming_it(change, expect):
    r = _run(f"""
        import dataclasses
        from sglang_r3.seam import manifest
        target = {TARGET!r}
        entry = manifest.by_target().pop(target)
        if {change!r} == "renamed":  # SGLang renamed the method our hook is written for
            from sglang.srt.managers.io_struct import GenerateReqInput
            GenerateReqInput.normalize_batch_and_argumentz = GenerateReqInput.normalize_batch_and_arguments
            del GenerateReqInput.normalize_batch_and_arguments
            manifest.by_target()[target] = entry
        elif {change!r} == "signature":  # the manifest records another shape than the installed one
            manifest.by_target()[target] = dataclasses.replace(entry, signature="(self, strict)")
        import sglang_r3.serving.adapter as p
        p.plugin()
        print("STARTED")
    """)
    assert r.returncode != 0 and "STARTED" not in r.stdout, r.stdout + r.stderr
    assert "sglang-r3 refuses to start" in r.stderr and TARGET in r.stderr and expect in r.stderr, r.stderr


USES = "sglang.srt.managers.io_struct.SetInternalStateReq"  # POST /routing/capture builds it (adapter/api.py)


@pytest.mark.parametrize("launch", ["our launcher", "SGLang's own launcher"])
def test_a_used_sglang_name_that_is_gone_stops_start_up_naming_it(launch):
    # What our routes and launch path call (kind "uses") is checked in the launching process too: without
    # it the server would start, and /routing/capture would fail at its first call.
    r = _run(f"""
        import sys
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        from sglang.srt.managers import io_struct
        del io_struct.SetInternalStateReq  # as if SGLang renamed it
        if {launch!r} == "our launcher":
            from sglang_r3.serving.launch import prepare
            prepare(["--model-path", "unused"], process="server")
        else:
            from sglang_r3.seam.hooks import HookTargetError
            from sglang_r3.serving.adapter.opt_in import refuse_unsupported_before_sglangs_checks
            try:
                refuse_unsupported_before_sglangs_checks(None)
            except HookTargetError as err:
                sys.exit(str(err))
        print("STARTED")
    """)
    assert r.returncode != 0 and "STARTED" not in r.stdout, r.stdout + r.stderr
    # Named as the manifest target, or (0.5.15, where another hooked module imports it) as the import of it
    # that fails.
    named = USES in r.stderr or f"cannot import name '{USES.rpartition('.')[2]}'" in r.stderr
    assert "sglang-r3 refuses to start" in r.stderr and named, r.stderr[-3000:]


# -- the manifest is complete: every SGLang name the SGLang side imports, names, hooks or reads is listed -----

PKG = ROOT_PKG = Path(__file__).resolve().parents[1] / "sglang_r3"
# The SGLang side of the serving wing: the only folders that import or name SGLang (pyproject's import contracts).
SGLANG_SIDE = [PKG / d for d in ("serving/adapter", "serving/refusals", "seam", "cpu_runtime")]


def _sglang_side_files():
    return sorted(p for d in SGLANG_SIDE for p in d.rglob("*.py"))


def _module_strings(tree: ast.Module) -> dict:
    """Module-level ``NAME = "literal"`` constants (f-strings in hook targets are built from them)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def _string_of(node, consts: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in consts:
                parts.append(consts[v.value.id])
            else:
                return None
        return "".join(parts)
    return None


def sglang_names_in_patches():
    """(file, dotted name) for every SGLang module or name imported and every dotted SGLang string in the SGLang side (adapter/, seam/, refusals/, cpu_runtime/)."""
    found = []
    for path in _sglang_side_files():
        tree = ast.parse(path.read_text())
        consts = _module_strings(tree)
        rel = str(path.relative_to(PKG))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in _SGLANG:
                found += [(rel, f"{node.module}.{a.name}") for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(rel, a.name) for a in node.names if a.name.split(".")[0] in _SGLANG]
            else:
                text = _string_of(node, consts)
                if text and re.fullmatch(r"(sglang|sgl_kernel)(\.\w+)+", text):
                    found.append((rel, text))
    return found


_SGLANG = ("sglang", "sgl_kernel")


def version_tests_outside_release():
    """(file, line, what) for each version test in sglang_r3 outside release.py, versions.py and manifest.py: a use of
    ``is_0_5_15``, ``release.current()`` compared or used as a key, a served release's version string."""
    from sglang_r3.seam.versions import SERVED

    def release_current(node) -> bool:
        f = node.func if isinstance(node, ast.Call) else None
        return (isinstance(f, ast.Name) and f.id == "current") or (
            isinstance(f, ast.Attribute) and f.attr == "current" and isinstance(f.value, ast.Name)
            and f.value.id == "release")

    found = []
    for path in sorted(ROOT_PKG.rglob("*.py")):
        if path.name in ("release.py", "versions.py", "manifest.py"):
            continue
        rel = str(path.relative_to(ROOT_PKG))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Name) and node.id == "is_0_5_15") or (
                    isinstance(node, ast.Attribute) and node.attr == "is_0_5_15"):
                found.append((rel, node.lineno, "is_0_5_15"))
            elif isinstance(node, ast.ImportFrom) and any(a.name == "is_0_5_15" for a in node.names):
                found.append((rel, node.lineno, "import of is_0_5_15"))
            elif isinstance(node, (ast.Compare, ast.Subscript)) and any(release_current(n) for n in ast.walk(node)):
                found.append((rel, node.lineno, "release.current() compared or used as a key"))
            elif isinstance(node, ast.Constant) and node.value in SERVED:
                found.append((rel, node.lineno, f"the version string {node.value!r}"))
    return found


def _ours() -> set:
    """Every name sglang-r3 defines (functions, classes, attributes it assigns, dataclass fields, keywords)."""
    names = set()
    for path in ROOT_PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _other_libraries() -> set:
    """Attribute names of the non-SGLang objects the SGLang side handles: torch, numpy, the standard library, FastAPI
    routes, packaging versions, msgspec."""
    import argparse, builtins, collections, contextvars, ctypes, dataclasses, enum, functools, importlib
    import hashlib, importlib.metadata, importlib.util, inspect, itertools, logging, math, numbers, os, re as re_
    import sys as sys_, threading, types, typing

    import fastapi.routing
    import msgspec
    import numpy as np
    import packaging.version
    import torch

    objects = [builtins, str, bytes, list, dict, set, tuple, int, float, type, object, BaseException, argparse,
               argparse.ArgumentParser, argparse.Action, collections, contextvars, contextvars.ContextVar, ctypes,
               dataclasses, functools, importlib, importlib.util, inspect, inspect.Parameter, inspect.Signature,
               itertools, logging, logging.Logger, math, os, os.path, re_, re_.Match, sys_, threading, types, typing,
               fastapi.routing.APIRoute, fastapi.FastAPI, msgspec, msgspec.structs, np, np.ndarray, np.dtype,
               packaging.version.Version, torch, torch.Tensor, torch.library, torch.library.Library, torch.cuda,
               torch.nn.Module, torch.nn.functional, torch.distributed, torch._C, enum.Enum, numbers,
               hashlib, hashlib.sha256(),
               importlib.metadata, ctypes.c_void_p, ctypes.c_int64,
               type(ctypes.c_uint8 * 1),  # ctypes array types (from_address)
               types.FrameType, types.CodeType]  # release.constructing_engine walks the caller's frames
    # Instance attributes those classes set in __init__ (dir() of the class does not show them).
    instance = {"dest", "option_strings", "_actions",  # argparse parsers and actions
                "endpoint", "methods", "response_model", "responses", "openapi_extra",  # FastAPI routes
                "inc",  # prometheus_client counters (sglang_r3.serving.metrics makes them)
                "get_vocab"}  # a Hugging Face tokenizer (the TokenizerManager's .tokenizer)
    return {a for o in objects for a in dir(o)} | instance


def attributes_read_in_patches():
    """attribute name -> files of the SGLang side that read it from something sglang-r3 did not define."""
    ours, other = _ours(), _other_libraries()
    out = {}
    for path in _sglang_side_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                if node.attr not in ours and node.attr not in other:
                    out.setdefault(node.attr, set()).add(str(path.relative_to(PKG)))
    return out


@pytest.mark.fast
def test_every_sglang_name_patches_imports_or_names_is_in_the_manifest():
    from sglang_r3.seam.manifest import MANIFEST

    targets = {e.target for e in MANIFEST}
    found = sglang_names_in_patches()
    assert len(found) > 60
    # A name is listed, or a module / class of a listed target (``_MR = "...ModelRunner"`` prefixes hook targets).
    unlisted = sorted({(f, n) for f, n in found if n not in targets and not any(t.startswith(n + ".") for t in targets)})
    assert not unlisted, "SGLang names the SGLang side uses that sglang_r3/seam/manifest.py does not list:\n" + \
        "\n".join(f"  {f}: {n}" for f, n in unlisted)
    # Nor does the SGLang side (or the rest of sglang_r3) test the release itself: what differs is a capability of
    # release.py, which with versions.py and the manifest (per-release signatures and releases) alone names versions.
    versioned = version_tests_outside_release()
    assert not versioned, "release tests outside release.py, versions.py and manifest.py (ask a capability of " \
        "release.py instead):\n" + "\n".join(f"  {f}:{line}: {what}" for f, line, what in versioned)


@pytest.mark.fast
def test_every_attribute_patches_reads_of_an_sglang_object_is_in_the_manifest():
    # Read by name (no types in the AST): an attribute sglang-r3 does not define and no library object it
    # handles has is SGLang's, and must be a "reads" attribute or the name of a listed target, so that
    # start-up checks it on the installed release instead of a hook failing on first use.
    from sglang_r3.seam.manifest import MANIFEST

    listed = {a for e in MANIFEST for a in e.attrs} | {e.target.rpartition(".")[2] for e in MANIFEST}
    reads = attributes_read_in_patches()
    unlisted = {a: sorted(files) for a, files in reads.items() if a not in listed}
    assert not unlisted, "attributes the SGLang side reads of SGLang objects that no manifest entry lists:\n" + \
        "\n".join(f"  .{a}: {files}" for a, files in sorted(unlisted.items()))
