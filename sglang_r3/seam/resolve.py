"""A dotted SGLang name to its object, imported for real; and the one line that says why it failed.

Shared by ``hooks`` (which binds hooks) and ``manifest`` (which checks every target)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def resolve(target: str) -> Any:
    """The object ``target`` names. Each package on the path is imported for real, so a module that
    exists but fails to import raises its own error instead of looking like a missing attribute."""
    parts = target.split(".")
    obj = importlib.import_module(parts[0])
    name, i = parts[0], 1
    while i < len(parts) and hasattr(obj, "__path__"):  # a package: the next part may be a submodule
        sub = f"{name}.{parts[i]}"
        if importlib.util.find_spec(sub) is None:
            break
        obj = importlib.import_module(sub)
        name, i = sub, i + 1
    for p in parts[i:]:
        obj = getattr(obj, p)
    return obj


def describe_error(exc: BaseException) -> str:
    # sgl-kernel's ImportError runs to 20 lines; its first non-empty one says what failed.
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    for line in str(exc).splitlines():  # sgl-kernel puts the underlying loader error at the end
        if "libcuda" in line and line.strip() != first:
            detail += f" ({line.strip().lstrip('- ')})"
            break
    return detail
