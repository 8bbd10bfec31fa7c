"""Replace one attribute for the duration of a call (SGLang code that reads a module global or flag we must
answer differently for that call only), restored however the call ends."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    real = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, real)
