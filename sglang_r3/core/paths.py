"""Where sglang-r3 keeps generated files (stub library, embedded model)."""

import os
from pathlib import Path

from sglang_r3.core import settings


def cache_root() -> Path:
    root = settings.current().cache or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sglang_r3"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
