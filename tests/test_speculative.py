"""Issue 3: MTP speculative decoding with capture.

The default server speculates with the embedded model's MTP layer; the
nospec server is the same model without speculation. Main rows must be
identical (verify routing is authoritative), draft routing must only appear in
the tagged ``mtp`` section, and no draft forward may ever write a main row.
"""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import numpy as np
import pytest

from tests.support.mtp_section import check_mtp_marks
from tests.support.routing_http import TIMEOUT, flush_cache, full_ids, greedy, record_of

pytestmark = pytest.mark.release  # also run on SGLang 0.5.15.post1 (.ci/release-env)

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding with MTP",
    "x",
    "Routing replay for mixture-of-experts models keeps rollout and training in agreement.",
]


def ids(text: str):
    return list(text.encode())


def stats(url):
    (s,) = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()
    return s


@pytest.mark.parametrize("prompt", PROMPTS)
def test_spec_and_nonspec_agree_on_tokens_and_main_rows(routing_server, nospec_server, prompt):
    spec = greedy(routing_server, 32, input_ids=ids(prompt), return_routing=True)
    base = greedy(nospec_server, 32, input_ids=ids(prompt), return_routing=True)
    assert spec["output_ids"] == base["output_ids"]
    rs, rb = record_of(spec), record_of(base)
    assert rs.num_tokens == len(ids(prompt)) + len(spec["output_ids"]) - 1
    np.testing.assert_array_equal(rs.experts, rb.experts)


def test_default_server_really_speculates(routing_server):
    out = greedy(routing_server, 64, text="An ordinary prompt about the weather today", return_routing=True)
    meta = out["meta_info"]
    assert meta["spec_accept_length"] >= 1.5, meta
    assert len(out["output_ids"]) == 64


def test_teacher_forced_fidelity_with_speculation(routing_server):
    prompt = ids("Teacher forcing under speculation: ")
    gen = greedy(routing_server, 40, input_ids=prompt, return_routing=True)
    seq = full_ids(gen, prompt)
    flush_cache(routing_server)
    forced = greedy(routing_server, 1, input_ids=seq, return_routing=True)
    assert forced["meta_info"]["cached_tokens"] == 0
    np.testing.assert_array_equal(record_of(forced).experts[: len(seq) - 1], record_of(gen).experts)


def test_batched_spec_matches_nonspec(routing_server, nospec_server):
    spec = greedy(routing_server, 24, text=PROMPTS, return_routing=True)
    base = greedy(nospec_server, 24, text=PROMPTS, return_routing=True)
    for s, b in zip(spec, base):
        assert s["output_ids"] == b["output_ids"]
        np.testing.assert_array_equal(record_of(s).experts, record_of(b).experts)


def test_concurrent_spec_requests_match_nonspec(routing_server, nospec_server):
    prompts = [f"concurrent request number {i}: " for i in range(6)]

    def run(url, p):
        return greedy(url, 20, input_ids=ids(p), return_routing=True)

    with cf.ThreadPoolExecutor(6) as pool:
        spec = list(pool.map(lambda p: run(routing_server, p), prompts))
    base = [run(nospec_server, p) for p in prompts]
    for s, b in zip(spec, base):
        assert s["output_ids"] == b["output_ids"]
        np.testing.assert_array_equal(record_of(s).experts, record_of(b).experts)


def test_mtp_section_greedy(routing_server):
    prompt = ids("MTP section, greedy: ")
    out = greedy(routing_server, 32, input_ids=prompt, return_routing={"mtp": True})
    rec = record_of(out)
    assert rec.mtp is not None and rec.mtp.num_entries > 0
    seq = full_ids(out, prompt)
    check_mtp_marks(seq, rec.mtp, rec.start)
    assert set(np.unique(rec.mtp.depth)) == {1}
    assert rec.mtp.step.max() >= 1  # draft-decode forwards, not only draft-extend
    assert rec.mtp.accepted[rec.mtp.step > 0].any()
    assert rec.mtp.experts.max() < 16
    # main rows are unaffected by asking for the MTP section
    plain = greedy(routing_server, 32, input_ids=prompt, return_routing=True)
    assert plain["meta_info"]["routing"].get("mtp") is None
    np.testing.assert_array_equal(record_of(plain).experts, rec.experts)


# The draft proposes the unbiased argmax; the target's verify applies the request's logit_bias, so every
# draft of a banned token is rejected. (SGLang 0.5.23 verifies greedily on CPU even when sampling, so
# temperature alone cannot produce rejections here.)
BAN_EVERY_THIRD = {str(i): -100.0 for i in range(0, 256, 3)}


def test_mtp_section_marks_rejected_drafts(routing_server):
    prompt = ids("Rejected drafts: ")
    out = greedy(routing_server, 40, input_ids=prompt, sampling_params={"logit_bias": BAN_EVERY_THIRD},
                 return_routing={"mtp": True})
    rec = record_of(out)
    seq = full_ids(out, prompt)
    assert rec.num_tokens == len(seq) - 1
    drafted = rec.mtp.step > 0
    assert rec.mtp.accepted[drafted].any() and (~rec.mtp.accepted[drafted]).any()
    check_mtp_marks(seq, rec.mtp, rec.start)
    # a rejected draft routed a token that is not the one the sequence has there
    rejected = drafted & ~rec.mtp.accepted
    first_rejections = [
        i for i in np.flatnonzero(rejected)
        if not (rejected & (rec.mtp.rounds == rec.mtp.rounds[i]) & (rec.mtp.step < rec.mtp.step[i])).any()
    ]
    assert first_rejections
    for i in first_rejections:
        p = int(rec.mtp.positions[i])
        assert p + 1 >= len(seq) or seq[p + 1] != int(rec.mtp.tokens[i])


def test_rejections_leave_main_rows_equal_to_nonspec(routing_server, nospec_server):
    """Verify routing of rejected drafts is overwritten by later verifies; only accepted tokens keep rows."""
    for prompt in PROMPTS[:2]:
        body = dict(input_ids=ids(prompt), sampling_params={"logit_bias": BAN_EVERY_THIRD}, return_routing=True)
        spec = greedy(routing_server, 40, **body)
        base = greedy(nospec_server, 40, **body)
        assert spec["meta_info"]["spec_accept_length"] < 3.9  # drafts really were rejected
        assert spec["output_ids"] == base["output_ids"]
        np.testing.assert_array_equal(record_of(spec).experts, record_of(base).experts)


def test_no_main_row_was_written_by_a_draft_forward(routing_server):
    greedy(routing_server, 16, input_ids=ids("guard check"), return_routing={"mtp": True})
    s = stats(routing_server)
    assert s["draft"]["forwards"] > 0 and s["draft"]["entries"] > 0  # draft forwards ran and were captured apart
    assert s["main_captures_from_draft"] == 0
    assert s["unknown_layer_captures"] == 0


def test_draft_routing_is_filed_only_for_requests_that_ask_for_it(routing_server):
    before = stats(routing_server)["draft"]["entries"]
    greedy(routing_server, 16, input_ids=ids("no MTP section asked"), return_routing=True)
    assert stats(routing_server)["draft"]["entries"] == before
    greedy(routing_server, 16, input_ids=ids("MTP section asked"), return_routing={"mtp": True})
    assert stats(routing_server)["draft"]["entries"] > before


def test_tree_drafting_matches_nonspec_and_rows_follow_kv_moves(tree_server, nospec_server):
    """topk > 1: SGLang moves accepted tokens' KV inside the request's slots; captured rows must move too."""
    moves_before = stats(tree_server)["kv_moves"]
    for prompt in PROMPTS[:3]:
        for extra in ({}, {"logit_bias": BAN_EVERY_THIRD}):
            body = dict(input_ids=ids(prompt), sampling_params=dict(extra), return_routing=True)
            tree = greedy(tree_server, 40, **body)
            base = greedy(nospec_server, 40, **body)
            assert tree["output_ids"] == base["output_ids"]
            np.testing.assert_array_equal(record_of(tree).experts, record_of(base).experts)
    # SGLang's accepted-path KV moves reached the capturer (which moves rows whenever a slot changes;
    # tests/test_kv_move.py drives that with moves that do change slots).
    assert stats(tree_server)["kv_moves"] > moves_before
