"""docs/architecture.md stays true: it names every module, and its manifest table is the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_r3.serving.patches import manifest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_the_architecture_doc_shows_the_manifest_as_it_is():
    table = manifest.markdown()
    assert table in DOC, "regenerate the table: python -m sglang_r3.serving.patches.manifest --markdown"


def _modules():
    for top in ("sglang_r3", "server"):  # server/ installs as sglang_r3_server
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            yield rel


def test_the_architecture_doc_names_every_module():
    def named(rel: Path) -> bool:
        # The tables name a module relative to its top package (`record/bitpack.py`, `server/routes.py`),
        # a package (its __init__) by its folder (`capture/`), and the CPU runtime's files by theirs.
        parts = rel.parts[1:] if rel.parts[0] == "sglang_r3" else rel.parts
        folder = "/".join(parts[:-1]) + "/"
        if parts[-1] == "__init__.py":
            return f"`{folder}`" in DOC or len(parts) == 1
        return f"`{'/'.join(parts)}`" in DOC or (folder == "serving/patches/cpu/" and f"`{folder}`" in DOC)

    missing = [str(r) for r in _modules() if not named(r)]
    assert not missing, f"docs/architecture.md does not name: {missing}"
