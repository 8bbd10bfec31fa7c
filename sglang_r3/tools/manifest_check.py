"""``python -m sglang_r3.tools.manifest_check [--markdown]``: the manifest (``sglang_r3/seam/manifest.py``)
checked against the installed SGLang: a ``CHANGED target: why`` line for each target of the installed release that
is missing or changed, then how many are as written against (exit status 1 when any is not); ``--markdown`` prints
the manifest as the table in docs/architecture.md instead.
"""

from __future__ import annotations

from typing import List, Mapping, Optional

from sglang_r3.seam.manifest import MANIFEST, check, entries
from sglang_r3.seam.versions import SERVED, in_force, installed


def markdown() -> str:
    """The manifest as the table in docs/architecture.md (``--markdown``; a test keeps the two equal)."""
    lines = ["| target | kind | releases | why | signature written against / attributes read |", "|---|---|---|---|---|"]
    for e in MANIFEST:
        rel = "all" if e.releases == SERVED else ", ".join(e.releases)
        if isinstance(e.signature, Mapping):
            sig = "; ".join(f"{r}: `{s}`" for r, s in e.signature.items())
        elif e.signature:
            sig = f"`{e.signature}`"
        else:
            sig = ", ".join(f"`{a}`" for a in e.attrs)
        lines.append(f"| `{e.target}` | {e.kind} | {rel} | {e.why} | {sig} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if "--markdown" in args:
        print(markdown(), end="")
        return 0
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():  # sgl-kernel's modules need the libcuda stand-in to import on a CPU host
        activate_cpu_runtime()
        # and, as a CPU server registers them first, the torch ops SGLang's CPU-path modules read at import
        from sglang_r3.cpu_runtime.ops.torch_ops import register_torch_ops

        register_torch_ops()
    release = in_force()
    bad = check(release=release)
    for target, why in bad:
        print(f"CHANGED {target}: {why}")
    n = len(entries(release))
    print(f"{n - len(bad)} of {n} SGLang targets of {release} as written against (installed: SGLang {installed()})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
