"""sglang-r3: Rollout Routing Replay captured inside SGLang (MTP draft routing kept apart), replayed in Megatron."""

from __future__ import annotations


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it); a checkout on sys.path
    without an install reads pyproject.toml beside the package."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-r3")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        try:
            text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
        except OSError:
            return "0+unknown"
        found = re.search(r'(?m)^version\s*=\s*"([^"]+)"', text)
        return found.group(1) if found else "0+unknown"


__version__ = _version()
