"""The SGLang releases the adapter serves and the one installed: read by the manifest (one shape per release)
and by ``release`` (which refuses a release outside the window, then chooses each shim by the release).
"""

from __future__ import annotations

import functools
from typing import Tuple

V0_5_15 = "0.5.15.post1"  # slime's image (THUDM/slime 624b824 docker/Dockerfile)
V0_5_23 = "0.5.23"  # the suite's pin
SERVED: Tuple[str, ...] = (V0_5_15, V0_5_23)  # oldest first


@functools.cache
def installed() -> str:
    """The installed SGLang's version, as its distribution metadata says (slime builds it from source)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        import sglang

        return str(sglang.__version__)


def _key(version: str) -> tuple:
    from packaging.version import Version

    v = Version(version)
    return v.release + ((v.post or 0),)


def nearest(version: str) -> str:
    """The served release closest below (or, below the window, the oldest): whose targets it most resembles."""
    below = [r for r in SERVED if _key(r) <= _key(version)]
    return below[-1] if below else SERVED[0]


def in_force() -> str:
    """The served release whose shapes apply: the installed one, or for another the nearest (start-up refuses
    it, naming what differs from that one)."""
    version = installed()
    return version if version in SERVED else nearest(version)
