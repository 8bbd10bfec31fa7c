"""Statements of the documentation held to the code that makes them true (issue 53's "docs against code").

Each test reads a sentence of README.md or docs/*.md and the code or data it is about; a reintroduced
copy of the old wording (or of the old code) fails here.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _text(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _flat(path: str) -> str:
    """The file's text with line breaks as spaces (sentences wrap)."""
    return re.sub(r"\s+", " ", _text(path))


# -- the manifest's counts -----------------------------------------------------------------------------------


def test_the_compatibility_results_count_the_manifest_as_it_is():
    from sglang_r3.serving.patches.manifest import entries

    results = json.loads(_text("docs/compatibility.json"))["releases"]
    assert results
    for r in results:
        # tools/releases.check_release's count: every entry but routes and torch ops, of the nearest served release
        want = sum(1 for e in entries(r["nearest"]) if e.kind not in ("route", "op"))
        assert r["checked"] == want, (
            f"docs/compatibility.json: SGLang {r['version']} was checked against {r['checked']} targets, the manifest "
            f"of {r['nearest']} has {want}: python -m sglang_r3.tools.releases --write docs/compatibility.md")


def test_slime_md_gives_the_manifest_checks_count_of_0_5_15():
    from sglang_r3.serving.patches.manifest import entries
    from sglang_r3.serving.patches.versions import V0_5_15

    counts = re.findall(r"manifest check is clean \((\d+) of (\d+) targets\)", _flat("docs/slime.md"))
    # `python -m sglang_r3.serving.patches.manifest` prints "N of N SGLang targets": every entry of the release
    assert counts == [(str(len(entries(V0_5_15))),) * 2]


# -- the client's exceptions -----------------------------------------------------------------------------------


def test_api_md_lists_every_exception_the_client_exports_with_what_it_is():
    import sglang_r3.trainer.client as client
    from sglang_r3.trainer.client import RoutingArgumentError, RoutingClientError

    api = _text("docs/api.md")
    table = api[api.index("### Client exceptions"):]
    exported = [n for n in client.__all__ if isinstance(getattr(client, n), type)
                and issubclass(getattr(client, n), Exception)]
    assert {"RoutingClientError", "RoutingArgumentError", "RoutingServerError", "RoutingUnavailableError"} <= set(exported)
    for name in exported:
        assert f"| `{name}` |" in table, f"docs/api.md's client exceptions do not list {name}"
    # The documented error for a malformed call, which callers that caught the old ValueError still catch
    assert issubclass(RoutingArgumentError, RoutingClientError) and issubclass(RoutingArgumentError, ValueError)
    row = next(line for line in table.splitlines() if line.startswith("| `RoutingArgumentError` |"))
    assert "ValueError" in row and "input_ids" in row and "prompts" in row
