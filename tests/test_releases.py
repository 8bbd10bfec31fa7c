"""``python -m sglang_r3.tools.releases``: the manifest checked statically against a release's sources.

The static check is what the compatibility table of the releases between the served ones rests on, so it is
proven against the runtime check (``manifest.check``, real imports) on the installed SGLang, for the
entries of every served release, and on a small synthetic tree whose differences are known. The committed
table (docs/compatibility.md) must be the rendering of the committed results (docs/compatibility.json);
nothing here downloads anything.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_r3.seam.manifest import Touch
from sglang_r3.seam.versions import SERVED, V0_5_23
from sglang_r3.tools import releases

pytestmark = [pytest.mark.sglang, pytest.mark.release]  # release: also proven on the oldest served SGLang

ROOT = Path(__file__).resolve().parents[1]

# The runtime check in a fresh process: SGLang's modules need the CPU runtime on a host without a GPU (and the
# torch ops its CPU-path modules read at import), as a server has them.
RUNTIME = """
import json, sys
from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
if not has_gpu():
    activate_cpu_runtime()
    from sglang_r3.cpu_runtime.ops.torch_ops import register_torch_ops
    register_torch_ops()
from sglang_r3.seam import manifest
print("RESULT" + json.dumps({r: manifest.check(release=r) for r in sys.argv[1:]}))
"""


def _runtime(*releases_: str, env=None, code: str = RUNTIME) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *releases_], capture_output=True, text=True, timeout=600,
                       cwd=str(ROOT), env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line is not None, r.stdout + r.stderr
    return {k: [tuple(d) for d in v] for k, v in json.loads(line[len("RESULT"):]).items()}


def test_the_static_check_of_the_installed_sources_is_the_runtime_check():
    # The installed release's entries (none differ) and the other served release's (many differ: the targets
    # that moved between them), each as manifest.check reports them with real imports.
    package = Path(importlib.util.find_spec("sglang").origin).parent  # found, not imported
    src = releases.Source(package)
    runtime = _runtime(*SERVED)
    installed = releases.release_of(package)
    assert installed in SERVED
    for release in SERVED:
        static, unread = releases.check_source(src, release)
        # What the static check says it cannot read (a name bound again under an import-time `if`: the host picks
        # which) it cannot call changed either; the runtime check, which sees this host's pick, may (on 0.5.15.post1,
        # afmoe's fused_moe, whose MoeRunnerConfig default has other fields than 0.5.23's).
        unread_targets = {target for target, _ in unread}
        assert not unread_targets & {target for target, _ in static}, release
        assert static == [d for d in runtime[release] if d[0] not in unread_targets], release
        if release == installed:
            assert static == []
        else:
            assert static  # the other release's shapes do differ here
    # The command's own verdict for the installed tree.
    assert releases.check_release(installed, package).verdict == "served (proven by served runs)"


FAKE = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/base.py": """
        class Base:
            def __init__(self):
                self.from_base = 1

            def inherited(self, x):
                return x
    """,
    "sglang/srt/worker.py": """
        from enum import IntEnum

        from sglang.srt.base import Base


        class Mode(IntEnum):
            A = 0
            B = 1


        class Worker(Base):
            def __init__(self, size):
                super().__init__()
                self.size: int = size

            def step(self, batch, mode=Mode.B, *, strict=False):
                return batch

            @classmethod
            def build(cls, n):
                return cls(n)


        class Pool:
            class State:
                conv: int

            class SpecState(State):  # its base by the enclosing class's name (MambaPool.SpeculativeState)
                extra: int


        def scan(x, limit=(0.0, float("inf"))):
            return x


        ON_CPU = False


        def kernel(x):
            return x


        if ON_CPU:  # the host picks (gdn_backend's causal_conv1d_update under is_cpu())
            def kernel(x, cpu=True):
                return x
    """,
    "sglang/srt/api.py": """
        from dataclasses import dataclass, field
        from typing import ClassVar

        from .worker import Worker as PublicWorker


        @dataclass
        class Item:
            a: int
            b: list = field(default_factory=list)
            c: ClassVar[int] = 3
            d: str = field(default="x", kw_only=True)
    """,
}

W = "sglang.srt.worker.Worker"
CASES = [  # (entry, what the check reports for it, or None where it matches)
    (Touch("sglang.srt.api.PublicWorker.step", "hook:around", "a re-export, an enum default, keyword-only",
           "(self, batch, mode=<Mode.B: 1>, kw:strict=False)"), None),
    (Touch(f"{W}.step", "hook:around", "a changed signature", "(self, batch)"),
     "signature changed: written against (self, batch), installed (self, batch, mode=<Mode.B: 1>, kw:strict=False)"),
    (Touch(f"{W}.build", "uses", "a classmethod", "(n)"), None),
    (Touch(f"{W}.inherited", "uses", "inherited from an sglang base", "(self, x)"), None),
    (Touch(W, "reads", "attributes", attrs=("size", "from_base", "step", "gone")),
     "no attribute gone (read by sglang-r3)"),
    (Touch("sglang.srt.api.Item", "uses", "a dataclass", "(a, b=<factory>, kw:d='x')"), None),
    (Touch("sglang.srt.api.Item.__init__", "uses", "its generated __init__", "(self, a)"),
     "signature changed: written against (self, a), installed (self, a, b=<factory>, kw:d='x')"),
    (Touch("sglang.srt.worker.removed", "uses", "a removed function"),
     "AttributeError: module 'sglang.srt.worker' has no attribute 'removed'"),
    (Touch("sglang.srt.moved.thing", "uses", "a removed module"),
     "AttributeError: module 'sglang.srt' has no attribute 'moved'"),
    (Touch(f"{W}.renamed", "hook:after", "a renamed method", "(self)"),
     "AttributeError: type object 'Worker' has no attribute 'renamed'"),
    (Touch(f"{W}.step_cpu", "adds", "a method SGLang lacks"), None),
    (Touch(f"{W}.inherited", "adds", "a method SGLang has"),
     "SGLang now defines it: sglang-r3's CPU stand-in would replace it"),
    (Touch(f"{W}.inherited", "overrides", "a method a base defines"), None),
    (Touch(f"{W}.step", "overrides", "a method the class defines itself"),
     "SGLang now defines it: sglang-r3's CPU stand-in would replace it"),
    (Touch(f"{W}.nowhere", "overrides", "a method no base defines"),
     "no base class defines it any more: nothing calls what we would override"),
    (Touch("sglang.srt.worker.Pool.SpecState", "reads", "a nested class's sibling base", attrs=("conv", "extra")),
     None),
    (Touch("sglang.srt.worker.scan", "uses", "a float('inf') default", "(x, limit=(0.0, inf))"), None),
    (Touch("sglang.srt.worker.kernel", "uses", "bound again under an if", "(x)"), None),
]
# What the static check cannot tell (the runtime check, on this host, matches it).
UNREAD = [("sglang.srt.worker.kernel",
           "signature not read statically (bound again under an if at import: the host picks which)")]


def test_the_static_check_reports_each_change_of_a_synthetic_tree_as_the_runtime_check_does(tmp_path):
    for path, text in FAKE.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    entries = [e for e, _ in CASES]
    want = [(e.target, why) for e, why in CASES if why is not None]
    static, unread = releases.check_source(releases.Source(tmp_path / "sglang"), V0_5_23, entries)
    assert static == want and unread == UNREAD
    # The same entries checked with real imports of the synthetic tree (a plain-Python stand-in for SGLang).
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from sglang_r3.seam import manifest
        from sglang_r3.seam.manifest import Touch
        entries = [{", ".join(_touch_source(e) for e in entries)}]
        print("RESULT" + json.dumps({{"fake": manifest.check(tuple(entries), release={V0_5_23!r})}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    assert _runtime(env=env, code=code)["fake"] == want


def _touch_source(e: Touch) -> str:
    return f"Touch({e.target!r}, {e.kind!r}, {e.why!r}, {e.signature!r}, attrs={e.attrs!r})"


def test_the_committed_table_is_the_rendering_of_the_committed_results():
    results = releases.from_json((ROOT / "docs" / "compatibility.json").read_text())
    assert (ROOT / "docs" / "compatibility.md").read_text() == releases.render(results), (
        "docs/compatibility.md is stale: python -m sglang_r3.tools.releases --render docs/compatibility.json "
        "--write docs/compatibility.md")
    served = [r for r in results if r.served]
    assert tuple(r.version for r in served) == SERVED
    assert all(r.differences == [] and r.nearest == r.version for r in served)
    # Every other release names the served release whose targets it was checked against.
    assert all(r.nearest in SERVED for r in results)
