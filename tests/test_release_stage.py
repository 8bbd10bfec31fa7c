"""What CI's SGLang 0.5.15.post1 stage runs is what the docs say runs there.

The oracle is pytest's own selection: the stage's exact arguments (read from ``.ci/run``) collected with
``--collect-only`` in a child pytest, a small plugin writing each selected test's node id, its ``served`` group and
whether it carries the ``release`` mark. Collected here on the main install (0.5.23): the 0.5.15.post1 environment
selects the same tests except the flipped checkpoints, which carry no release mark on either.

- Every test of a group served on 0.5.15.post1 too (``RELEASE_FAMILIES``) carries the ``release`` mark, however it
  parametrizes ``served`` (pytest drops the fixture's marks under indirect parametrization).
- Every family docs/models.md marks "on SGLang 0.5.15.post1 too" is served by a test the stage selects, and the MTP
  claims docs/testing.md makes for that release (DeepSeek-V3 with MTP speculation on and off, GLM-4.7-Flash with it)
  are tests the stage selects.
- Every test module with ``release`` tests the stage does not run is named in docs/testing.md's list of them, with
  why, and that list names nothing the stage runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang  # a child pytest collects the suite, which imports SGLang

ROOT = Path(__file__).resolve().parents[1]
STAGE_PYTHON = ".venv-sglang-0.5.15.post1/bin/python"

PLUGIN = """
import json, os


def pytest_collection_finish(session):
    rows = []
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        rows.append([item.nodeid, params.get("served"), item.get_closest_marker("release") is not None])
    with open(os.environ["R3_COLLECTED"], "w") as f:
        json.dump(rows, f)
"""


def stage_args() -> list:
    """The pytest arguments of .ci/run's 0.5.15.post1 stage, continuation lines joined."""
    text = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    (line,) = [l for l in text.splitlines() if l.strip().startswith(f"{STAGE_PYTHON} -m pytest")]
    args = shlex.split(line)[3:]
    return [a for a in args if a != "-v"]


def _collect(tmp_path: Path, args: list, name: str) -> list:
    (tmp_path / "r3_collect_plugin.py").write_text(textwrap.dedent(PLUGIN))
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "R3_COLLECTED": str(out),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "r3_collect_plugin", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage")
    args = stage_args()
    files = [a for a in args if a.startswith("tests/")]
    return {"stage": _collect(tmp, args, "stage"),
            "files": _collect(tmp, files, "files"),  # the stage's files, every test
            "release": _collect(tmp, ["-m", "release", "tests"], "release")}  # every release test of the suite


def test_every_test_of_a_release_group_carries_the_release_mark(collected):
    from tests.family_specs.groups import RELEASE_FAMILIES

    unmarked = [nodeid for nodeid, served, marked in collected["files"] if served in RELEASE_FAMILIES and not marked]
    assert not unmarked, ("tests of groups served on 0.5.15.post1 too without the release mark (parametrize "
                          "`served` through tests/test_families.py groups()):\n" + "\n".join(unmarked))


def test_what_the_docs_say_runs_on_the_oldest_release_is_selected_by_the_stage(collected):
    from tests.family_specs.specs import SPECS

    stage = collected["stage"]
    served = {s for _, s, _ in stage if s}
    models = (ROOT / "docs" / "models.md").read_text()
    claimed = set(re.findall(r"`tests/test_families\.py` `(\w+)`, on SGLang 0.5.15.post1 too", models))
    assert claimed, "docs/models.md marks no family 'on SGLang 0.5.15.post1 too'"
    assert claimed <= set(SPECS)
    assert not claimed - served, f"docs/models.md says these run on 0.5.15.post1, the stage serves none of their tests: {sorted(claimed - served)}"
    ids = [nodeid for nodeid, _, _ in stage]
    # docs/testing.md: DeepSeek-V3 with MTP speculation on and off, GLM-4.7-Flash with it
    testing = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    assert "GLM-4.7-Flash with MTP speculation, DeepSeek-V3 with it on and off" in testing
    for name in ("test_deepseek_v3_mtp_main_rows_equal_spec_off_rows_and_transformers[deepseek_v3]",
                 "test_deepseek_v3_mtp_sampled_rows_are_transformers_router_topk[deepseek_v3]",
                 "test_nextn_mtp_speculation_rows_are_transformers_router_topk_and_mtp_tagged[glm4_moe_lite]"):
        assert f"tests/test_families.py::{name}" in ids, name


def _not_run_list() -> dict:
    """docs/testing.md's list of release tests the stage does not run: path (or path::name) -> why."""
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text.split("<!-- release tests CI does not run -->", 1)[1].split("<!-- end -->", 1)[0]
    return dict(re.findall(r"^- `([\w/.:]+)`: (.+)$", section, re.M))


def test_every_release_test_the_stage_does_not_run_is_named_in_the_docs_with_why(collected):
    def where(nodeid: str) -> str:
        path, _, rest = nodeid.partition("::")
        cls = rest.split("::")[0]
        return f"{path}::{cls}" if cls[:1].isupper() else path

    in_stage = {nodeid for nodeid, _, _ in collected["stage"]}
    left_out = {where(nodeid) for nodeid, _, _ in collected["release"] if nodeid not in in_stage}
    named = _not_run_list()
    assert all(why.strip() for why in named.values())
    assert left_out == set(named), (f"release tests the stage does not run, not named in docs/testing.md: "
                                    f"{sorted(left_out - set(named))}; named but run or gone: "
                                    f"{sorted(set(named) - left_out)}")
