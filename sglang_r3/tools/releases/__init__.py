"""The manifest checked against each SGLang release of the window, read from the release's published wheel
(``python -m sglang_r3.tools.releases``; the command and what it does: ``cli.py``). One module a job:
``source.py`` reads a release's sources with ``ast``, ``wheels.py`` finds the window's releases and fetches their
wheels, ``check.py`` checks the manifest against a source tree and gives a release its verdict, ``table.py`` writes
the table and the saved results, ``cli.py`` is the command line. Their names are importable from here.
"""

from sglang_r3.tools.releases.check import Diff, Release, check_release, check_source, missing_attrs
from sglang_r3.tools.releases.cli import main
from sglang_r3.tools.releases.source import Cls, Ext, Fn, Mod, Obj, Source, Unresolved, Val
from sglang_r3.tools.releases.table import COMMAND, ROOT, SLIME_COMMIT, from_json, render, stack, to_json
from sglang_r3.tools.releases.wheels import FIRST, LAST, PINNED, fetch, metadata, release_of, window

__all__ = [
    "COMMAND", "FIRST", "LAST", "PINNED", "ROOT", "SLIME_COMMIT", "Cls", "Diff", "Ext", "Fn", "Mod", "Obj", "Release",
    "Source", "Unresolved", "Val", "check_release", "check_source", "fetch", "from_json", "main", "metadata",
    "missing_attrs", "release_of", "render", "stack", "to_json", "window",
]
