"""Records are checked against the layout, their sample and the trainer's weights; anything that differs is refused by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from replay_helpers import synthetic_batch, synthetic_record, synthetic_sample, synthetic_tokens
from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord, token_digest
from sglang_r3.trainer import ReplayFiller, check_record, check_records

pytestmark = pytest.mark.fast


def _other_model(layout: ModelLayout) -> ModelLayout:
    return ModelLayout("DeepseekV3ForCausalLM", layout.num_hidden_layers, layout.layers)


def _nothing_filled(filler: ReplayFiller) -> None:
    for s in filler.decoder_sites:
        rr = s.router.router_replay
        assert rr.target_topk_idx is None and rr.replay_backward_list == [] and rr.router_replay_action is None


def test_record_from_another_model(glm_layout):
    rec, ids = synthetic_sample(_other_model(glm_layout), 6)
    with pytest.raises(RecordError, match=r"sample 0: record belongs to layout '[0-9a-f]{16}', but the trainer's layout is '"
                       + glm_layout.fingerprint + r"' \(Glm4MoeForCausalLM\); it comes from another model"):
        check_record(rec, glm_layout, ids)


def test_record_whose_layers_omit_a_layer(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    rec = dataclasses.replace(rec, layers=(1, 3), experts=rec.experts[:, [0, 2], :])
    with pytest.raises(RecordError, match=r"record layers \[1, 3\] omit layer\(s\) \[2\] \(layout MoE layers: \[1, 2, 3\]\)"):
        check_record(rec, glm_layout, ids)


def test_record_with_an_extra_or_reordered_layer(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    extra = dataclasses.replace(rec, layers=(0, 1, 2, 3), experts=np.concatenate([rec.experts[:, :1], rec.experts], 1))
    with pytest.raises(RecordError, match=r"have layer\(s\) \[0\] the layout does not route"):
        check_record(extra, glm_layout, ids)
    swapped = dataclasses.replace(rec, layers=(2, 1, 3))
    with pytest.raises(RecordError, match=r"record layers \[2, 1, 3\] are out of order"):
        check_record(swapped, glm_layout, ids)


def test_row_count_against_the_sample(glm_layout):
    rec = synthetic_record(glm_layout, 6)  # 5 rows
    with pytest.raises(RecordError, match=r"sample 3: record has 5 rows, but the sample has 7 tokens \(expected 6 rows"):
        check_record(rec, glm_layout, synthetic_tokens(7), sample=3)


def test_expert_id_out_of_range(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    experts = rec.experts.copy()
    experts[2, 1, 3] = 16
    with pytest.raises(RecordError, match=r"expert id 16 at row 2, layer 2 is outside 0..15"):
        check_record(dataclasses.replace(rec, experts=experts), glm_layout, ids)


def test_negative_expert_id_in_a_signed_record(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    experts = rec.experts.astype(np.int32)
    experts[4, 2, 0] = -1
    with pytest.raises(RecordError, match=r"expert id -1 at row 4, layer 3 is outside 0..15"):
        check_record(dataclasses.replace(rec, experts=experts), glm_layout, ids)


def test_the_same_expert_twice_in_one_row_and_layer(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    experts = rec.experts.copy()
    experts[3, 2, 1] = experts[3, 2, 3]  # in range, but a router never picks an expert twice
    with pytest.raises(RecordError, match=rf"sample 0: row 3, layer 3 names expert {experts[3, 2, 3]} twice in its top-4"):
        check_record(dataclasses.replace(rec, experts=experts), glm_layout, ids)


def test_topk_and_start(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    with pytest.raises(RecordError, match=r"record is top-2, layout is top-4"):
        check_record(dataclasses.replace(rec, experts=rec.experts[:, :, :2]), glm_layout, ids)
    with pytest.raises(RecordError, match=r"record starts at token 3; replay needs rows from token 0"):
        check_record(dataclasses.replace(rec, start=3), glm_layout, ids)


# --- the record belongs to its sample ------------------------------------------------------------------


@pytest.mark.parametrize("length", [6, np.int64(6), torch.tensor(6)])
def test_a_bare_length_cannot_identify_the_sample(glm_layout, length):
    rec = synthetic_record(glm_layout, 6)
    with pytest.raises(RecordError, match=r"sample 0: got a bare length \(6\); a length cannot prove which sample a record "
                                          r"belongs to .*pass the token ids"):
        check_record(rec, glm_layout, length)


def test_token_ids_as_tensor_array_or_list_are_all_accepted(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    for form in (ids, ids.to(torch.int32), ids.numpy(), ids.numpy().astype(np.uint16), ids.tolist()):
        check_record(rec, glm_layout, form)
    with pytest.raises(RecordError, match=r"sample 0: token ids must be 1-D, got shape \(1, 6\)"):
        check_record(rec, glm_layout, ids[None])


def test_swapped_samples_of_equal_length_are_refused(gpt_mtp1, glm_layout):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    records, tokens = synthetic_batch(glm_layout, [7, 7])
    with pytest.raises(RecordError, match=r"sample 0: record was produced for a different token sequence .*two samples swapped"):
        filler.fill(records, tokens[::-1])
    _nothing_filled(filler)


def test_a_changed_token_is_refused(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 9)
    edited = ids.clone()
    edited[-1] = (edited[-1] + 1) % 128  # same length, one completion token differs
    with pytest.raises(RecordError, match=r"sample 2: record was produced for a different token sequence"):
        check_record(rec, glm_layout, edited, sample=2)


def test_a_record_without_a_tokens_digest_is_refused(gpt_mtp1, glm_layout):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    records, tokens = synthetic_batch(glm_layout, [5, 6])
    records[1] = dataclasses.replace(records[1], tokens_digest=None)
    with pytest.raises(RecordError, match=r"sample 1: record carries no tokens_digest, so nothing proves it was produced "
                                          r"for this sample's tokens"):
        filler.fill(records, tokens)
    _nothing_filled(filler)


# --- the record belongs to the trainer's weights -------------------------------------------------------


def test_weight_version_mismatch_is_refused_and_a_match_accepted(gpt_mtp1, glm_layout):
    records, tokens = synthetic_batch(glm_layout, [5, 6], weight_version="step-12")
    filler = ReplayFiller(gpt_mtp1, glm_layout, weight_version="step-13")
    with pytest.raises(RecordError, match=r"sample 0: record was routed with weight version 'step-12', but the trainer "
                                          r"holds weight version 'step-13'"):
        filler.fill(records, tokens)
    _nothing_filled(filler)

    filler.weight_version = "step-12"  # the trainer synced back to the rollout's weights
    try:
        summary = filler.fill(records, tokens)
        assert summary.num_samples == 2 and summary.num_rows == 11
    finally:
        filler.clear()


def test_a_record_without_weight_version_is_refused_when_the_trainer_knows_its_own(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 6)
    with pytest.raises(RecordError, match=r"record was routed with no weight_version, but the trainer holds weight version '3'"):
        check_record(rec, glm_layout, ids, weight_version="3")
    check_record(rec, glm_layout, ids)  # a trainer that does not say which weights it holds does not check


def test_one_stale_record_in_a_batch_names_its_sample(glm_layout):
    records, tokens = synthetic_batch(glm_layout, [5, 6, 4], weight_version="2")
    records[2] = dataclasses.replace(records[2], weight_version="1")
    with pytest.raises(RecordError, match=r"sample 2: record was routed with weight version '1'"):
        check_records(records, tokens, glm_layout, weight_version="2")


# --- batches ---------------------------------------------------------------------------------------------


def test_records_and_samples_must_pair_up(gpt_mtp1, glm_layout):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    records, tokens = synthetic_batch(glm_layout, [4, 5, 6])
    with pytest.raises(RecordError, match=r"2 records for 3 samples"):
        filler.fill(records[:2], tokens)


def test_wire_round_trip_then_check(glm_layout):
    rec, ids = synthetic_sample(glm_layout, 9, weight_version="v9")
    for binary in (False, True):
        back = RoutingRecord.from_wire(rec.to_wire(binary=binary))
        assert (back.tokens_digest, back.weight_version) == (rec.tokens_digest, "v9")
        check_record(back, glm_layout, ids, weight_version="v9")


@pytest.mark.parametrize("bad", ["fingerprint", "omitted_layer", "rows", "expert_id", "repeated_id", "tokens"])
def test_a_bad_record_in_the_batch_fills_nothing(gpt_mtp1, glm_layout, bad):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    lengths = [6, 8, 5]
    records, tokens = synthetic_batch(glm_layout, lengths)
    last = records[-1]
    if bad == "fingerprint":
        records[-1] = synthetic_record(_other_model(glm_layout), 5, seed=2)
    elif bad == "omitted_layer":
        records[-1] = dataclasses.replace(last, layers=(1, 2), experts=last.experts[:, :2, :])
    elif bad == "rows":
        records[-1] = dataclasses.replace(last, experts=last.experts[:-1])
    elif bad == "tokens":
        tokens[-1] = tokens[-1].flip(0)
    else:
        e = last.experts.copy()
        e[0, 0, 0] = 200 if bad == "expert_id" else e[0, 0, 1]
        records[-1] = dataclasses.replace(last, experts=e)
    with pytest.raises(RecordError, match=r"sample 2"):
        filler.fill(records, tokens)
    _nothing_filled(filler)


def test_a_valid_batch_still_fills(gpt_mtp1, glm_layout):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    records, tokens = synthetic_batch(glm_layout, [6, 8, 5])
    try:
        summary = filler.fill(records, tokens)
        assert summary.num_rows == 19 and summary.replayed_layers == (1, 2, 3)
        for s in filler.decoder_sites:
            assert s.router.router_replay.target_topk_idx.shape == (19, 4)
    finally:
        filler.clear()


# A 100k-token sample: longer than any rollout the check is tuned for, so the check goes over it in pieces.
LONG_TOKENS = 100_001


@pytest.fixture(scope="module")
def long_sample(glm_layout):
    rng = np.random.default_rng(5)
    n, L, k, E = LONG_TOKENS - 1, len(glm_layout.moe_layer_ids), glm_layout.topk, glm_layout.num_experts
    experts = np.argsort(rng.random((n, L, E)), axis=-1)[..., :k].astype(glm_layout.expert_dtype)
    ids = synthetic_tokens(LONG_TOKENS, 5)
    rec = RoutingRecord(layout=glm_layout.fingerprint, start=0, layers=glm_layout.moe_layer_ids, experts=experts,
                        weight_version=None, tokens_digest=token_digest(ids))
    return rec, ids


def test_a_long_record_with_distinct_ids_everywhere_is_accepted(long_sample, glm_layout):
    rec, ids = long_sample
    check_record(rec, glm_layout, ids)


# first row, rows spread over the record (every (row, layer) at its own offset), the last row
@pytest.mark.parametrize("row, layer", [(0, 1), (21_845, 3), (43_690, 3), (43_691, 1), (66_666, 2),
                                        (87_381, 1), (99_998, 2), (LONG_TOKENS - 2, 3)])
def test_a_repeated_id_is_found_wherever_it_is_in_a_long_record(long_sample, glm_layout, row, layer):
    rec, ids = long_sample
    experts = rec.experts.copy()
    col = glm_layout.moe_layer_ids.index(layer)
    experts[row, col, 3] = experts[row, col, 0]
    # the oracle: numpy's own view of which (row, layer) groups repeat an id
    ordered = np.sort(experts, axis=-1)
    bad = np.argwhere((ordered[..., 1:] == ordered[..., :-1]).any(axis=-1))
    assert [(int(r), glm_layout.moe_layer_ids[int(c)]) for r, c in bad] == [(row, layer)]
    with pytest.raises(RecordError, match=rf"row {row}, layer {layer} names expert {experts[row, col, 0]} twice"):
        check_record(dataclasses.replace(rec, experts=experts), glm_layout, ids)


def test_record_that_spanned_a_weight_update_is_refused_unless_mixed_versions_are_allowed(glm_layout):
    rec, toks = synthetic_sample(glm_layout, 6, weight_version="mixed:v1,v2")
    with pytest.raises(RecordError, match=r"sample 0: record was routed under several weight versions \(mixed:v1,v2\)"):
        check_record(rec, glm_layout, toks)
    check_record(rec, glm_layout, toks, allow_mixed_versions=True)
    # Without allow_mixed_versions a held version does not change the answer: the record spans an update.
    with pytest.raises(RecordError, match=r"several weight versions \(mixed:v1,v2\).*holds weight version 'v2'.*"
                                          r"allow_mixed_versions=True"):
        check_record(rec, glm_layout, toks, weight_version="v2")


@pytest.mark.parametrize("held", ["v1", "v2"])
def test_allowed_mixed_record_is_accepted_with_a_held_version_it_spans(glm_layout, held):
    # slime's partial rollouts: begun under v1, finished under v2; the trainer sets both options.
    rec, toks = synthetic_sample(glm_layout, 6, weight_version="mixed:v1,v2")
    check_record(rec, glm_layout, toks, weight_version=held, allow_mixed_versions=True)


def test_allowed_mixed_record_of_other_weights_is_refused(glm_layout):
    rec, toks = synthetic_sample(glm_layout, 6, weight_version="mixed:v1,v2")
    with pytest.raises(RecordError, match=r"weight versions \['v1', 'v2'\] \(mixed:v1,v2\), none of them the one "
                                          r"the trainer holds, weight version 'v3'"):
        check_record(rec, glm_layout, toks, weight_version="v3", allow_mixed_versions=True)
    # "v1" inside another name is not v1
    rec, toks = synthetic_sample(glm_layout, 6, weight_version="mixed:v10,v2")
    with pytest.raises(RecordError, match="none of them"):
        check_record(rec, glm_layout, toks, weight_version="v1", allow_mixed_versions=True)
