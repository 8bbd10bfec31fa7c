"""``python -m sglang_r3.tools.releases [--releases A,B] [--write docs/compatibility.md] [--source DIR]``: the
manifest checked against each SGLang release of the window, read from the release's published wheel (downloaded,
never installed or imported).

Start-up refuses a release outside ``SERVED`` by checking the manifest against the installed SGLang; this does the
same check for every release in between without installing one, so the table says what each would be refused for
and what it pins. Each target is resolved in the release's own sources with ``ast`` as ``seam.resolve`` would
import it (submodules, re-exports, module aliases, classes and their sglang bases, class bodies, dataclass fields,
``self.<attr> =``), its signature built as ``manifest.signature_of`` prints one, and each difference worded as
``manifest.check`` words it (tests/test_releases.py holds the two to the same answers on the installed SGLang).
What a module does to a class at import with names no line spells (``setattr(C, name, ...)``) cannot be read so: it
is listed apart, as not read, never as a difference. Neither can a default that is an expression or a value from
outside sglang, nor anything inherited from outside sglang but NamedTuple's API. Results go to
docs/compatibility.json; ``--render`` rebuilds docs/compatibility.md from it with no network.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from sglang_r3.tools.releases.check import check_release
from sglang_r3.tools.releases.table import from_json, render, to_json
from sglang_r3.tools.releases.wheels import FIRST, LAST, fetch, release_of, window


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_r3.tools.releases", description=__doc__.splitlines()[0])
    ap.add_argument("--releases", help="comma-separated SGLang releases (default: every one from "
                                       f"{FIRST} to {LAST} on the package index)")
    ap.add_argument("--source", type=Path, help="check this sglang package directory (e.g. the installed one) "
                                                "instead of downloading; --releases names its release (one)")
    ap.add_argument("--render", type=Path, metavar="JSON", help="render the table from these saved results")
    ap.add_argument("--write", type=Path, help="write the markdown here (and, unless --render, the results to "
                                               "the same path with .json)")
    args = ap.parse_args(argv)

    if args.render:
        releases = from_json(args.render.read_text())
    elif args.source:
        version = args.releases or release_of(args.source)
        if "," in version:
            ap.error("--source checks one release")
        releases = [check_release(version, args.source)]
    else:
        from sglang_r3.core.paths import cache_root

        versions = args.releases.split(",") if args.releases else window()
        cache = cache_root() / "releases"
        releases = []
        for v in versions:
            print(f"SGLang {v} ...", file=sys.stderr)
            releases.append(check_release(v, fetch(v, cache)))
    text = render(releases)
    if args.write:
        args.write.write_text(text)
        if not args.render:
            args.write.with_suffix(".json").write_text(to_json(releases))
    else:
        print(text, end="")
    return 1 if any(r.served and r.differences for r in releases) else 0
