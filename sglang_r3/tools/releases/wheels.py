"""The releases of the window and their wheels: the releases on the package index, a release's wheel downloaded
and unpacked (sources and metadata only, never installed or imported), its Requires-Python and its pins. Part of
``python -m sglang_r3.tools.releases``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Dict, List, Tuple

from sglang_r3.seam.versions import V0_5_15, V0_5_23

FIRST, LAST = V0_5_15, V0_5_23  # the window: the served releases and every release published between them
PINNED = ("torch", "transformers", "sglang-kernel")


def window() -> List[str]:
    """The releases of sglang on the package index from FIRST to LAST inclusive, oldest first."""
    from packaging.version import Version

    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang"], capture_output=True, text=True,
                       check=True)
    line = next(x for x in r.stdout.splitlines() if x.startswith("Available versions:"))
    found = [Version(v.strip()) for v in line.split(":", 1)[1].split(",")]
    return [str(v) for v in sorted(found) if Version(FIRST) <= v <= Version(LAST)]


def fetch(version: str, cache: Path) -> Path:
    """The ``sglang`` package directory of the release's wheel, downloaded once and unpacked (sources and
    metadata only) under ``cache``; nothing is installed."""
    where = cache / version
    pkg = where / "src" / "sglang"
    if (where / "src" / ".complete").exists():
        return pkg
    wheels = list(where.glob("sglang-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        f"sglang=={version}", "-d", str(where)], check=True)
        wheels = list(where.glob("sglang-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(where / "src", [n for n in z.namelist() if n.endswith(".py") or n.endswith(".dist-info/METADATA")])
    (where / "src" / ".complete").touch()
    return pkg


def metadata(package_dir: Path, version: str) -> Tuple[str, Dict[str, str]]:
    """(Requires-Python, pins of torch / transformers / sglang-kernel) from the dist-info beside the package."""
    meta = package_dir.parent / f"sglang-{version}.dist-info" / "METADATA"
    if not meta.is_file():
        return "?", {p: "?" for p in PINNED}
    msg = Parser().parsestr(meta.read_text(encoding="utf-8"))
    pins = {}
    for req in msg.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue  # an optional extra's pins are not what the release runs on
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?", spec)
        name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        name = "sglang-kernel" if name == "sgl-kernel" else name  # the kernel package's earlier name
        if name in PINNED:
            pins[name] = m.group(2).strip() or "any"
    return msg.get("Requires-Python", "any"), {p: pins.get(p, "none") for p in PINNED}


def release_of(package_dir: Path) -> str:
    """The release an unpacked sglang package is: its dist-info's (installed or unpacked from a wheel), else its
    version.py's (read, not imported)."""
    infos = list(package_dir.parent.glob("sglang-*.dist-info"))
    if len(infos) == 1:
        return infos[0].name[len("sglang-"):-len(".dist-info")]
    text = (package_dir / "version.py").read_text()
    return re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text).group(1)
