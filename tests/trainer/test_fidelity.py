"""Replay fidelity: per-layer agreement of the rollout's top-k sets with the trainer's own routing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from megatron_cpu import forward_loss
from sglang_r3.record import RoutingRecord, token_digest
from sglang_r3.trainer import ReplayFiller, fidelity_report, topk_set_agreement


def test_topk_set_agreement_ignores_order():
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = np.array([[4, 3, 2, 1], [5, 6, 7, 9]])
    assert topk_set_agreement(a, b).tolist() == [True, False]


def _records_from_trainer(recorded, samples, layout):
    """Split the trainer's own packed routing (no CP/TP) back into per-sample records."""
    cols = np.stack([recorded[l].numpy() for l in layout.moe_layer_ids], axis=1)  # [rows, layers, k]
    out, at = [], 0
    for ids in samples:
        T = len(ids)
        rows = cols[at : at + T - 1].astype(np.uint8)
        out.append(RoutingRecord(layout.fingerprint, 0, layout.moe_layer_ids, rows, tokens_digest=token_digest(ids)))
        at += T
    return out


def test_fidelity_of_the_trainers_own_routing_is_one_and_drops_with_disagreement(gpt_mtp1, glm_layout):
    lengths = [8, 6]
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.record()
    tokens = torch.arange(sum(lengths)) % 128
    samples = list(torch.split(tokens, lengths))
    with torch.no_grad():
        forward_loss(gpt_mtp1, tokens, train=False)
    recorded = filler.recorded()
    assert sorted(recorded) == [1, 2, 3] and recorded[1].shape == (sum(lengths), 4)
    filler.clear()

    records = _records_from_trainer(recorded, samples, glm_layout)
    report = fidelity_report(records, samples, recorded, glm_layout)
    assert report.per_layer == {1: 1.0, 2: 1.0, 3: 1.0} and report.overall == 1.0

    # The rollout routed layer 2 differently for 3 of sample 0's 7 rows.
    e = records[0].experts.copy()
    for row in range(3):
        e[row, 1] = [x for x in range(16) if x not in set(e[row, 1])][:4]
    records[0] = dataclasses.replace(records[0], experts=e)
    report = fidelity_report(records, samples, recorded, glm_layout)
    real = (8 - 1) + (6 - 1)
    assert report.per_layer[2] == pytest.approx((real - 3) / real)
    assert report.per_layer[1] == report.per_layer[3] == 1.0
    assert report.metrics()["r3/topk_agree_layer_2"] == pytest.approx((real - 3) / real)


def test_replay_then_record_agrees_fully(gpt_mtp1, glm_layout):
    """Routing replayed from a record is exactly what RECORD sees the router use (fidelity 1 under replay)."""
    from replay_helpers import synthetic_batch

    lengths = [5, 7]
    records, samples = synthetic_batch(glm_layout, lengths, seed=11)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill(records, samples)
    spy_rows = {}
    hooks = [
        s.router.register_forward_hook(
            lambda m, a, o, lid=s.layer_id: spy_rows.__setitem__(
                lid, torch.nonzero(o[1])[:, 1].reshape(-1, 4)
            )
        )
        for s in filler.decoder_sites
    ]
    try:
        with torch.no_grad():
            forward_loss(gpt_mtp1, torch.cat(samples), train=False)
    finally:
        for h in hooks:
            h.remove()
        filler.clear()
    report = fidelity_report(records, samples, spy_rows, glm_layout)
    assert report.overall == 1.0
