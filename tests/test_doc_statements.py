"""Statements of the documentation held to the code that makes them true (issue 53's "docs against code").

Each test reads a sentence of README.md or docs/*.md and the code or data it is about; a reintroduced
copy of the old wording (or of the old code) fails here.
"""

from __future__ import annotations

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
    from sglang_r3.seam.manifest import entries

    results = json.loads(_text("docs/compatibility.json"))["releases"]
    assert results
    for r in results:
        # tools/releases/check.py's check_release count: every entry but routes and torch ops, of the nearest served release
        want = sum(1 for e in entries(r["nearest"]) if e.kind not in ("route", "op"))
        assert r["checked"] == want, (
            f"docs/compatibility.json: SGLang {r['version']} was checked against {r['checked']} targets, the manifest "
            f"of {r['nearest']} has {want}: python -m sglang_r3.tools.releases --write docs/compatibility.md")


def test_slime_md_gives_the_manifest_checks_count_of_0_5_15():
    from sglang_r3.seam.manifest import entries
    from sglang_r3.seam.versions import V0_5_15

    counts = re.findall(r"manifest check is clean \((\d+) of (\d+) targets\)", _flat("docs/slime.md"))
    # `python -m sglang_r3.tools.manifest_check` prints "N of N SGLang targets": every entry of the release
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


# -- what the code reads, found in its source (the serving modules import SGLang: read, not imported) -----------


def _function(path: str, name: str) -> str:
    import ast

    source = _text(path)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise AssertionError(f"{path} has no function {name}")


def _row(path: str, first_cell: str) -> str:
    rows = [line for line in _text(path).splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"{path}: {len(rows)} rows start with {first_cell}"
    return rows[0]


def test_capture_off_is_told_as_the_code_chooses_it_from_the_mode_at_finish():
    # The scheduler picks the code when the finished request's rows are gathered, from the capture mode then.
    collect = _function("sglang_r3/serving/adapter/capture_site.py", "collect_request_rows")
    assert 'code = "capture_off" if not cap.capture_main else "missing_rows"' in collect
    row = _row("docs/api.md", "`capture_off`")
    assert "when the request finishes" in row and "not from when the missing KV was computed" in row
    assert "capture is on when the request finishes" in _row("docs/api.md", "`missing_rows`")
    assert "`capture_off` if capture is still off when it finishes, `missing_rows` if it is back on" in _flat(
        "docs/api.md")


def test_the_mtp_sections_tokens_are_told_at_positions_plus_depth():
    # The collector's own acceptance check: the entry at position p and depth d routed the sequence's token at p + d.
    collect = _function("sglang_r3/serving/capture/draft.py", "collect")
    assert "target = positions.astype(np.int64) + depth" in collect
    assert 'seq[target[inside]] == r["tokens"][inside]' in collect
    tokens = _row("docs/api.md", "`tokens`")
    assert "`positions + depth` (p + 1 at depth 1), not the token at p" in tokens
    assert "the position p the draft forward ran at" in _row("docs/api.md", "`positions`")


def test_troubleshooting_names_the_release_that_prints_the_set_internal_state_log_line():
    import ast

    line = "sglang-r3: /set_internal_state refused:"
    source = _text("sglang_r3/serving/adapter/capture_site.py")
    printers = [n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)
                and line in (ast.get_source_segment(source, n) or "")]
    assert printers == ["take_capture_mode_knob"]
    install = _function("sglang_r3/serving/adapter/capture_site.py", "install_capture_patches")
    only_015 = install.split("if not release.has_internal_state_controller():", 1)[1].split("else:", 1)[0]
    assert "take_capture_mode_knob" in only_015  # hooked on 0.5.15 only: 0.5.23 logs SGLang's own warning
    rows = [r for r in _text("docs/troubleshooting.md").splitlines() if line in r]
    assert rows and all("0.5.15.post1 (which prints it)" in r and "0.5.23" in r for r in rows)


# -- the text's own shape: fences that close, paragraphs that end ----------------------------------------------


def _markdown_files():
    return ["README.md"] + sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))


@pytest.mark.parametrize("path", _markdown_files())
def test_code_fences_pair_up_and_hold_code(path):
    lines = _text(path).splitlines()
    opened = None
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            if opened is None:
                opened = i
            else:
                body = lines[opened:i - 1]
                assert any(x.strip() for x in body), f"{path}:{opened}: an empty code block (a stray fence?)"
                assert line.strip() == "```", f"{path}:{i}: a fence with a language closes the block of line {opened}"
                opened = None
        elif opened is not None:
            assert not line.startswith("## "), f"{path}:{i}: heading {line!r} is inside the code block of line {opened}"
    assert opened is None, f"{path}:{opened}: a code block that never closes"


@pytest.mark.parametrize("path", _markdown_files())
def test_every_paragraph_ends_its_sentence(path):
    """A prose paragraph ends with . : ; ? ! or ) unless a code block continues it (`... then` + ```)."""
    lines = _text(path).splitlines()
    fence, para = False, None  # para: the line number of the paragraph's last line so far
    ends = []
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence, para = not fence, None
            continue
        if fence:
            continue
        plain = bool(line.strip()) and not line.startswith(("#", "|", "<!--", ">", " ")) and not re.match(
            r"([-*]|\d+\.)\s", line)
        if plain or (para is not None and line.startswith(" ") and line.strip()):
            para = i
        else:
            if para is not None:
                ends.append(para)
            para = None
    if para is not None:
        ends.append(para)
    for i in ends:
        following = next((x for x in lines[i + 1:] if x.strip()), "")
        if following.startswith("```"):
            continue
        assert re.search(r"[.:;?!)]$", lines[i].rstrip()), (
            f"{path}:{i + 1}: a paragraph ends mid-sentence: {lines[i].rstrip()[-70:]!r}")


def test_the_trainer_doc_says_what_fill_does_with_a_record_of_another_sample():
    text = _flat("docs/trainer.md")
    sentence = re.search(r"A record that does not belong to the model or the sample \(.*?\) is refused by `fill`[^.]*\.",
                         text)
    assert sentence, "docs/trainer.md: the sentence on records that do not belong is cut short"
    assert "a weight version other than the filler's `weight_version`" in sentence.group(0)


def test_testing_md_says_where_a_test_url_points_the_suite():
    assert re.search(r"\(and `_SPEC`, `_TREE`, `_SOAK`\) points the tests that use that suite server at one you "
                     r"already run, which the run then neither starts nor stops", _flat("docs/testing.md"))


# -- the README's opening and its figures ------------------------------------------------------------------------


def _readme_opening() -> list:
    lines = _text("README.md").splitlines()
    assert lines[0] == "# sglang-r3" and lines[1] == ""
    return lines[2:7]


def test_the_readme_opens_with_five_lines_what_where_cost_off_and_how_to_see_it():
    opening = _readme_opening()
    labels = ["What it does", "Where it is proven", "What it costs", "How to turn it off", "How to see it working"]
    assert [re.match(r"- \*\*([^*]+)\*\*", line).group(1) for line in opening] == labels
    what, where, cost, off, see = opening
    assert "MTP-draft routing is kept apart" in what
    assert "CPU runtime" in where
    assert "nothing of SGLang's own GPU forward has run with the capture yet" in where
    assert "a GPU check without SGLang (`python -m benchmarks.gpu_check`) passed on an H200" in where
    assert "`SGLANG_R3_ENABLED` unset" in off and '`{"mode": "off"}`' in off and "POST /routing/capture" in off
    assert '"SGLANG_R3_HEALTH": "1"' in see and "train/r3/flip_rate" in see
    assert "`sglang-r3 capture: … KV slots`" in see and "`R3 (slime): … replays … decoder MoE layers by identity`" in see


def test_the_readmes_cost_figures_are_the_benchmark_tables():
    cost = _readme_opening()[2]
    table = _text("docs/testing.md").split("## Benchmarks", 1)[1]
    server = next(line for line in table.splitlines() if line.startswith("| server CPU, routed requests"))
    low_high, median = re.search(r"(\d\.\d+–\d\.\d+), median (\d\.\d+)", server).groups()
    assert f"{low_high}× the server CPU time of SGLang without R3 (median {median})" in cost
    capture = next(line for line in table.splitlines() if line.startswith("| capture hot path per forward"))
    ratios = [float(x) for x in re.search(r"\| ([\d. /]+) × \|", capture).group(1).split(" / ")]
    assert f"{min(ratios):.2f}–{max(ratios):.2f}× the time of SGLang's own capturer" in cost
    health = next(line for line in table.splitlines() if line.startswith("| replayed train step with live R3 health"))
    assert round((float(re.search(r"\| (1\.\d+) \[", health).group(1)) - 1) * 100) == 1
    assert "live R3 health adds about 1% to a replayed train step" in cost


def test_the_readme_gives_the_suites_time_testing_md_measured():
    measured = re.search(r"the whole run takes (\d+ to \d+) minutes on a 2-core machine", _flat("docs/testing.md"))
    assert measured, "docs/testing.md no longer says how long the suite takes"
    said = re.findall(r"(?:about )?(\d+(?: to \d+)?) minutes on 2 cores", _flat("README.md"))
    assert said == [measured.group(1)], f"README says {said}, docs/testing.md {measured.group(1)} minutes"


def test_the_readme_tells_verl_to_ask_each_request_for_its_rows():
    verl = _flat("README.md").split("## verl and other in-process engines", 1)[1].split("## ", 1)[0]
    assert "`engine.generate(..., return_routed_experts=True)`" in verl
    # the in-process engine's own check asks the same way (tests/scripts/engine_check.py)
    assert "return_routed_experts=True" in _text("tests/scripts/engine_check.py")
