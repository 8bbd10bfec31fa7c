"""Multi-layer MTP (issue 18, item 4): Step-3.5 with 3 MTP layers under SGLang's MultiLayerEagleWorkerV2.

SGLang 0.5.23 turns multi-layer EAGLE on by itself for ``Step3p5ForCausalLM``: one draft ModelRunner per
MTP layer, each round a verify and then one draft-extend forward per depth. The model is the tiny
Step-3.5 of tests/support/step3p5.py (a seeded main checkpoint whose routers choose differently per token and
layer, MTP layers from SGLang's deterministic dummy init); there is no transformers class for Step-3.5,
so the oracle is SGLang itself: the same checkpoint served with speculation off (one server each,
started together, module-scoped).

Pinned: main rows (ours and upstream's ``routed_experts``) are the spec-off server's, prompt by prompt and
batched, with drafts rejected and accepted; the MTP section carries depths 1..3, each entry routing the
token at ``position + depth`` (``step`` counts the drafted tokens in its chain, 0 = verified only);
drafts the next verify accepted are marked accepted, others not; no draft forward writes a main row.
"""

from __future__ import annotations

import base64
import os

import httpx
import numpy as np
import pytest

from sglang_r3.core.layout import ROLE_DENSE, ROLE_MOE, layout_from_model_path
from tests.support.routing_http import TIMEOUT, fetch_layout, greedy, record_of
from tests.support.step3p5 import DENSE_LAYERS, NUM_EXPERTS, NUM_LAYERS, NUM_MTP, TOPK, build, server_flags

pytestmark = pytest.mark.server  # this module's own fixture starts two servers

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Multi-layer MTP",
    "x",
    "Routing replay for mixture-of-experts models keeps rollout and training in agreement.",
]
NEW_TOKENS = 16
# The MTP chain (dummy-init MTP layers on the checkpoint's embedding and head) drafts token 208 after
# 208 (found by trying every byte): a target held to 208 by logit_bias accepts some drafts for these
# prompts and rejects others.
ONLY_208 = {str(i): -100.0 for i in range(288) if i != 208}
ACCEPTING_PROMPTS = ["The quick brown fox", "x"]

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("step3p5"))


@pytest.fixture(scope="module")
def servers(model_dir):
    """(spec-on URL, spec-off URL); SGLANG_R3_TEST_URL_STEP3P5_SPEC / _NOSPEC reuse running servers."""
    urls = {k: os.environ.get(f"SGLANG_R3_TEST_URL_STEP3P5_{k.upper()}") for k in ("spec", "nospec")}
    if all(urls.values()):
        yield urls["spec"], urls["nospec"]
        return
    from tests.support.servers import ServerProcess

    procs = {k: ServerProcess(server_flags(model_dir, spec=(k == "spec"))).start() for k in ("spec", "nospec")}
    try:
        yield procs["spec"].wait_ready().url, procs["nospec"].wait_ready().url
    finally:
        for p in procs.values():
            p.stop()


def ids(text: str):
    return list(text.encode())  # byte-level tokenizer: id == byte


def stats(url):
    (s,) = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()
    return s


def _upstream_rows(out, T: int) -> np.ndarray:
    raw = base64.b64decode(out["meta_info"]["routed_experts"])
    return np.frombuffer(raw, dtype=np.int32).reshape(T - 1, NUM_LAYERS, TOPK)


def _check_mtp_entries(seq, mtp):
    """Each entry at position p and depth d routed the token at p + d; a verified-only entry (step 0)
    routed the sequence's own token; an accepted one too; per request and round, once a draft is
    rejected every later draft of the round is rejected."""
    assert mtp.tokens is not None and mtp.rounds is not None
    p, d, tok = mtp.positions.astype(np.int64), mtp.depth.astype(np.int64), mtp.tokens.astype(np.int64)
    assert set(np.unique(mtp.depth)) == set(range(1, NUM_MTP + 1))
    assert np.all(mtp.step <= mtp.depth - 1)  # depth d chains at most d - 1 drafted tokens
    assert np.all(mtp.step[mtp.depth == 1] == 0)  # depth 1 routes the verified token after the target's
    inside = p + d < len(seq)
    seq = np.asarray(seq)
    verified = (mtp.step == 0) & inside
    np.testing.assert_array_equal(tok[verified], seq[(p + d)[verified]])
    assert np.all(mtp.accepted[mtp.step == 0] == inside[mtp.step == 0])
    acc = mtp.accepted
    np.testing.assert_array_equal(tok[acc], seq[(p + d)[acc]])
    for r in np.unique(mtp.rounds[mtp.step > 0]):
        sel = (mtp.rounds == r) & (mtp.step > 0)
        for s in range(2, NUM_MTP):
            # the s-th draft is accepted only if the (s-1)-th was
            assert not (acc[sel & (mtp.step == s)].any() and not acc[sel & (mtp.step == s - 1)].all())
    # one entry per (position, depth): the chain routes each window row once per depth
    keys = p * 16 + d
    assert np.unique(keys).size == keys.size


def test_served_layout_has_three_moe_mtp_layers_after_the_decoder(servers, model_dir):
    spec, nospec = servers
    layout = fetch_layout(spec)
    assert layout.architecture == "Step3p5ForCausalLM" and layout.num_hidden_layers == NUM_LAYERS
    decoder = [l for l in layout.layers if l.depth is None]
    assert [l.role for l in decoder] == [ROLE_DENSE if i in DENSE_LAYERS else ROLE_MOE for i in range(NUM_LAYERS)]
    assert [(l.id, l.depth, l.num_experts, l.topk) for l in layout.mtp_layers] == [
        (NUM_LAYERS + j, j + 1, NUM_EXPERTS, TOPK) for j in range(NUM_MTP)
    ]
    # the trainer reading the checkpoint's config.json, and the spec-off server, see the same layout
    assert layout_from_model_path(str(model_dir)) == layout == fetch_layout(nospec)


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_multi_layer_spec_main_rows_equal_spec_off_rows(servers, prompt):
    spec, nospec = servers
    s = greedy(spec, NEW_TOKENS, input_ids=ids(prompt), return_routing=True, return_routed_experts=True)
    b = greedy(nospec, NEW_TOKENS, input_ids=ids(prompt), return_routing=True, return_routed_experts=True)
    assert s["meta_info"]["spec_verify_ct"] > 0  # really speculated (verify rounds)
    assert s["output_ids"] == b["output_ids"]
    rs, rb = record_of(s), record_of(b)
    T = len(ids(prompt)) + len(s["output_ids"])
    assert rs.num_tokens == T - 1 and rs.start == 0
    np.testing.assert_array_equal(rs.experts, rb.experts)
    # a comparison that could catch a misplaced row: routing changes from token to token and layer to layer
    chosen = np.sort(rs.experts, axis=-1)
    assert len(np.unique(chosen.reshape(-1, TOPK), axis=0)) > 4
    assert any(not np.array_equal(chosen[:, 0], chosen[:, j]) for j in range(1, chosen.shape[1]))
    # upstream's routed_experts: our rows at the MoE layers, zeros at the dense ones, spec on = off
    up = _upstream_rows(s, T)
    np.testing.assert_array_equal(up, _upstream_rows(b, T))
    moe = [i for i in range(NUM_LAYERS) if i not in DENSE_LAYERS]
    np.testing.assert_array_equal(up[:, moe], rs.experts.astype(np.int32))
    assert not up[:, list(DENSE_LAYERS)].any()


def test_batched_multi_layer_spec_main_rows_equal_spec_off_rows(servers):
    spec, nospec = servers
    body = dict(input_ids=[ids(p) for p in PROMPTS], return_routing={"mtp": True})
    s_all = greedy(spec, NEW_TOKENS, **body)
    b_all = greedy(nospec, NEW_TOKENS, input_ids=[ids(p) for p in PROMPTS], return_routing=True)
    for prompt, s, b in zip(PROMPTS, s_all, b_all):
        assert s["output_ids"] == b["output_ids"]
        rec = record_of(s)
        np.testing.assert_array_equal(rec.experts, record_of(b).experts)
        _check_mtp_entries(ids(prompt) + s["output_ids"], rec.mtp)


def test_mtp_section_tags_depths_one_to_three_and_leaves_main_rows_alone(servers):
    spec, _ = servers
    prompt = ids("MTP section, three depths: ")
    out = greedy(spec, NEW_TOKENS, input_ids=prompt, return_routing={"mtp": True})
    rec = record_of(out)
    seq = prompt + out["output_ids"]
    mtp = rec.mtp
    assert mtp is not None and mtp.num_entries > 0
    _check_mtp_entries(seq, mtp)
    # the prefill's draft-extend routes every prompt row at every depth
    for d in range(1, NUM_MTP + 1):
        at_d = np.sort(mtp.positions[mtp.depth == d])
        assert set(range(len(prompt))) <= set(at_d.tolist())
    assert (mtp.step > 0).any()  # drafted tokens routed by depths 2 and 3
    assert mtp.experts.shape[1] == TOPK and mtp.experts.max() < NUM_EXPERTS
    plain = greedy(spec, NEW_TOKENS, input_ids=prompt, return_routing=True)
    assert plain["meta_info"]["routing"].get("mtp") is None
    np.testing.assert_array_equal(record_of(plain).experts, rec.experts)


def test_drafts_the_next_verify_accepted_are_marked_accepted(servers):
    spec, nospec = servers
    accepted, rejected, verify_accepted = 0, 0, 0
    for prompt in ACCEPTING_PROMPTS:
        body = dict(input_ids=ids(prompt), sampling_params={"logit_bias": ONLY_208})
        s = greedy(spec, NEW_TOKENS, return_routing={"mtp": True}, **body)
        b = greedy(nospec, NEW_TOKENS, return_routing=True, **body)
        assert s["output_ids"] == b["output_ids"]
        rec = record_of(s)
        np.testing.assert_array_equal(rec.experts, record_of(b).experts)
        mtp = rec.mtp
        drafted = mtp.step > 0
        # SGLang's own count: accepted drafts per verify round, bonus token included
        verify_accepted += s["meta_info"]["spec_accept_length"] > 1
        accepted += int(mtp.accepted[drafted].sum())
        rejected += int((~mtp.accepted[drafted]).sum())
        _check_mtp_entries(ids(prompt) + s["output_ids"], mtp)
    assert verify_accepted == len(ACCEPTING_PROMPTS) and accepted and rejected


def test_no_main_row_was_written_by_a_multi_layer_draft_forward(servers):
    spec, _ = servers
    before = stats(spec)
    greedy(spec, 8, input_ids=ids("guard check"), return_routing=True)
    mid = stats(spec)
    assert mid["draft"]["entries"] == before["draft"]["entries"]  # filed only for requests that ask
    greedy(spec, 8, input_ids=ids("guard check, MTP asked"), return_routing={"mtp": True})
    after = stats(spec)
    assert after["draft"]["forwards"] > mid["draft"]["forwards"] and after["draft"]["entries"] > mid["draft"]["entries"]
    assert after["main_captures_from_draft"] == 0 and after["unknown_layer_captures"] == 0
