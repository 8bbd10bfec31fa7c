"""Every record is checked before anything is replayed; a bad one raises naming what differs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from replay_helpers import synthetic_batch, synthetic_record
from sglang_r3.layout import ModelLayout
from sglang_r3.record import RecordError, RoutingRecord
from sglang_r3.trainer import ReplayFiller, check_record


def _other_model(layout: ModelLayout) -> ModelLayout:
    return ModelLayout("DeepseekV3ForCausalLM", layout.num_hidden_layers, layout.layers)


def test_record_from_another_model(glm_layout):
    rec = synthetic_record(_other_model(glm_layout), 6)
    with pytest.raises(RecordError, match=r"sample 0: record belongs to layout '[0-9a-f]{16}', but the trainer's layout is '"
                       + glm_layout.fingerprint + r"' \(Glm4MoeForCausalLM\); it comes from another model"):
        check_record(rec, glm_layout, 6)


def test_record_whose_layers_omit_a_layer(glm_layout):
    rec = synthetic_record(glm_layout, 6)
    rec = dataclasses.replace(rec, layers=(1, 3), experts=rec.experts[:, [0, 2], :])
    with pytest.raises(RecordError, match=r"record layers \[1, 3\] omit layer\(s\) \[2\] \(layout MoE layers: \[1, 2, 3\]\)"):
        check_record(rec, glm_layout, 6)


def test_record_with_an_extra_or_reordered_layer(glm_layout):
    rec = synthetic_record(glm_layout, 6)
    extra = dataclasses.replace(rec, layers=(0, 1, 2, 3), experts=np.concatenate([rec.experts[:, :1], rec.experts], 1))
    with pytest.raises(RecordError, match=r"have layer\(s\) \[0\] the layout does not route"):
        check_record(extra, glm_layout, 6)
    swapped = dataclasses.replace(rec, layers=(2, 1, 3))
    with pytest.raises(RecordError, match=r"record layers \[2, 1, 3\] are out of order"):
        check_record(swapped, glm_layout, 6)


def test_row_count_against_the_sample(glm_layout):
    rec = synthetic_record(glm_layout, 6)  # 5 rows
    with pytest.raises(RecordError, match=r"sample 3: record has 5 rows, but the sample has 7 tokens \(expected 6 rows"):
        check_record(rec, glm_layout, 7, sample=3)


def test_expert_id_out_of_range(glm_layout):
    rec = synthetic_record(glm_layout, 6)
    experts = rec.experts.copy()
    experts[2, 1, 3] = 16
    with pytest.raises(RecordError, match=r"expert id 16 at row 2, layer 2 is outside 0..15"):
        check_record(dataclasses.replace(rec, experts=experts), glm_layout, 6)


def test_topk_and_start(glm_layout):
    rec = synthetic_record(glm_layout, 6)
    with pytest.raises(RecordError, match=r"record is top-2, layout is top-4"):
        check_record(dataclasses.replace(rec, experts=rec.experts[:, :, :2]), glm_layout, 6)
    with pytest.raises(RecordError, match=r"record starts at token 3; replay needs rows from token 0"):
        check_record(dataclasses.replace(rec, start=3), glm_layout, 6)


def test_records_and_samples_must_pair_up(gpt_mtp1, glm_layout):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    with pytest.raises(RecordError, match=r"2 records for 3 samples"):
        filler.fill(synthetic_batch(glm_layout, [4, 5]), [4, 5, 6])


def test_wire_round_trip_then_check(glm_layout):
    rec = synthetic_record(glm_layout, 9)
    for binary in (False, True):
        back = RoutingRecord.from_wire(rec.to_wire(binary=binary))
        check_record(back, glm_layout, 9)


@pytest.mark.parametrize("bad", ["fingerprint", "omitted_layer", "rows", "expert_id"])
def test_a_bad_record_in_the_batch_fills_nothing(gpt_mtp1, glm_layout, bad):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    lengths = [6, 8, 5]
    records = synthetic_batch(glm_layout, lengths)
    last = records[-1]
    if bad == "fingerprint":
        records[-1] = synthetic_record(_other_model(glm_layout), 5)
    elif bad == "omitted_layer":
        records[-1] = dataclasses.replace(last, layers=(1, 2), experts=last.experts[:, :2, :])
    elif bad == "rows":
        records[-1] = dataclasses.replace(last, experts=last.experts[:-1])
    else:
        e = last.experts.copy()
        e[0, 0, 0] = 200
        records[-1] = dataclasses.replace(last, experts=e)
    with pytest.raises(RecordError, match=r"sample 2"):
        filler.fill(records, lengths)
    for s in filler.decoder_sites:
        rr = s.router.router_replay
        assert rr.target_topk_idx is None and rr.replay_backward_list == [] and rr.router_replay_action is None
