"""fill_slime_replays: slime-style replay objects (decoder first, MTP last) get decoder rows only."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from replay_helpers import synthetic_batch, with_mtp
from sglang_r3.record import RecordError
from sglang_r3.trainer import ReplayError, TokenLayout, fill_slime_replays, pack_rows


class SlimeStyleReplay:
    """The interface slime's RoutingReplay offers the filler: record(tensor), in registration order."""

    def __init__(self):
        self.top_indices_list = []

    def record(self, top_indices):
        self.top_indices_list.append(top_indices)


def test_decoder_replays_filled_mtp_replays_skipped_and_said(glm_layout, caplog):
    layout = with_mtp(glm_layout, 3)
    replays = [SlimeStyleReplay() for _ in range(3 + 3)]
    lengths = [6, 4]
    records, tokens = synthetic_batch(layout, lengths, seed=7)
    with caplog.at_level(logging.INFO, logger="sglang_r3.trainer.slime_adapter"):
        result = fill_slime_replays(replays, records, tokens, layout)
    assert result.filled == (0, 1, 2) and result.skipped == (3, 4, 5) and result.layers == (1, 2, 3)
    assert "skipped 3 MTP replay(s) at positions [3, 4, 5]" in result.describe()
    assert any("skipped 3 MTP" in r.getMessage() for r in caplog.records)
    packed = pack_rows([r.experts for r in records], layout.num_experts)
    for col, rep in enumerate(replays[:3]):
        (t,) = rep.top_indices_list
        assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), packed.experts[:, col, :])
    assert all(rep.top_indices_list == [] for rep in replays[3:])


def test_pipeline_stage_with_a_subset_of_layers(glm_layout):
    replays = [SlimeStyleReplay() for _ in range(2)]  # last stage: layer 3 + the MTP router
    res = fill_slime_replays(replays, *synthetic_batch(glm_layout, [5]), glm_layout,
                             TokenLayout(), decoder_layer_ids=[3])
    assert res.filled == (0,) and res.skipped == (1,) and res.layers == (3,)


def test_replay_count_that_cannot_be_explained_is_refused(glm_layout):
    with pytest.raises(ReplayError, match=r"6 replay objects for 3 decoder MoE layers and at most 1 MTP layers"):
        fill_slime_replays([SlimeStyleReplay() for _ in range(6)], *synthetic_batch(glm_layout, [5]), glm_layout)


def test_bad_record_fills_no_slime_replay(glm_layout):
    replays = [SlimeStyleReplay() for _ in range(4)]
    records, tokens = synthetic_batch(glm_layout, [5, 6])
    tokens[1] = torch.cat([tokens[1], tokens[1][:1]])  # one token more than the record was routed for
    with pytest.raises(RecordError, match=r"sample 1: record has 5 rows, but the sample has 7 tokens"):
        fill_slime_replays(replays, records, tokens, glm_layout)
    assert all(r.top_indices_list == [] for r in replays)


def test_slime_fill_refuses_bare_lengths_and_other_weights(glm_layout):
    replays = [SlimeStyleReplay() for _ in range(4)]
    records, tokens = synthetic_batch(glm_layout, [5, 6], weight_version="7")
    with pytest.raises(RecordError, match=r"sample 0: got a bare length \(5\); a length cannot prove"):
        fill_slime_replays(replays, records, [5, 6], glm_layout)
    with pytest.raises(RecordError, match=r"sample 0: record was routed with weight version '7', but the trainer holds weight version '8'"):
        fill_slime_replays(replays, records, tokens, glm_layout, weight_version="8")
    assert all(r.top_indices_list == [] for r in replays)
    assert fill_slime_replays(replays, records, tokens, glm_layout, weight_version="7").filled == (0, 1, 2)
