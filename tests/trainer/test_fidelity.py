"""Replay fidelity on real rollouts: SGLang's captured routing against the converted model's own routing.

Oracle: the fp32 SGLang server (``nospec_server``) serving the embedded checkpoint; the trainer side
is the same checkpoint in Megatron (``tests/trainer/convert.py``), R3 off, and what each of megatron-core's
own ``TopKRouter``s chose is read by a forward hook on it (its ``routing_map``), not through the filler.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

from megatron_cpu import RouterSpy, converted_embedded_model, forward_loss
from sglang_r3.trainer.client import RoutingClient
from sglang_r3.trainer import ReplayError, ReplayFiller
from sglang_r3.trainer.diagnostics import fidelity_report, logprob_drift, mtp_draft_agreement, topk_set_agreement

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

PROMPTS = [[7, 3, 90, 41, 12], [33, 34, 35, 36, 37, 38]]


def test_topk_set_agreement_ignores_order():
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = np.array([[4, 3, 2, 1], [5, 6, 7, 9]])
    assert topk_set_agreement(a, b).tolist() == [True, False]


def test_logprob_drift_is_the_k3_estimator_and_counts_ratios_beyond_two():
    trainer = [0.0, -1.0, -2.0 + math.log(3)]
    rollout = [0.0, -1.0 + math.log(2) / 2, -2.0]
    d = np.array(trainer) - np.array(rollout)
    drift = logprob_drift(trainer, rollout)
    assert drift.k3_kl == pytest.approx(np.mean(np.exp(d) - 1 - d))
    assert drift.extreme_token_frac == pytest.approx(1 / 3)  # only ratio 3 is beyond 2x
    assert drift.max_abs_diff == pytest.approx(math.log(3))
    with pytest.raises(ReplayError, match="trainer has 3 logprobs, rollout has 2"):
        logprob_drift(trainer, rollout[:2])


def test_mtp_draft_agreement_refuses_entries_of_another_sample():
    from sglang_r3.core.record import MtpRouting

    mtp = MtpRouting(
        positions=np.array([0, 1], np.int32), depth=np.array([1, 1], np.uint8), step=np.array([0, 0], np.uint8),
        accepted=np.array([True, True]), experts=np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.uint8),
        tokens=np.array([11, 99], np.int32),
    )
    mine = np.array([[3, 2, 1, 0], [4, 5, 6, 8], [0, 1, 2, 3]])
    with pytest.raises(ReplayError, match=r"position 1 routed token 99, but the sample has 12 at position 2"):
        mtp_draft_agreement(mtp, [10, 11, 12], mine)
    ok = mtp_draft_agreement(mtp, [10, 11, 99], mine)
    assert ok.by_step == ((0, 1, 2),) and ok.overall == 0.5


@pytest.fixture(scope="module")
def served(nospec_server, glm_layout):
    with RoutingClient(nospec_server) as client:
        assert client.layout() == glm_layout
        return client.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 8, "temperature": 1.0})


_DECODER_ROUTER = re.compile(r"decoder\.layers\.(\d+)\.mlp\.router")


def _megatron_choices(model, tokens) -> dict:
    """{decoder layer: [tokens, topk] sorted expert ids} as megatron-core's own routers chose them in one
    forward of ``tokens`` (forward hooks on each ``TopKRouter``; no replay set)."""
    spy = RouterSpy(model)
    try:
        with torch.no_grad():
            forward_loss(model, torch.as_tensor(tokens), train=False)
    finally:
        spy.close()
    return {int(m.group(1)): spy.chosen(path) for path in spy.seen if (m := _DECODER_ROUTER.fullmatch(path))}


def test_converted_model_routes_every_real_record_row_as_sglang_did(served, glm_layout):
    model = converted_embedded_model()
    for r in served:
        chosen = _megatron_choices(model, r.tokens)
        assert sorted(chosen) == list(glm_layout.moe_layer_ids) == list(r.record.layers)
        for col, layer in enumerate(r.record.layers):
            # row t: the experts for token t (the last token has no row)
            mine = chosen[layer][: r.record.num_tokens].numpy()
            assert np.array_equal(mine, np.sort(r.record.experts[:, col, :], axis=1)), (layer, r.tokens)


def test_fidelity_counts_each_row_where_the_rollout_routed_differently(served, glm_layout):
    model = converted_embedded_model()
    r = served[0]
    recorded = _megatron_choices(model, r.tokens)
    # Three rows of layer 2 as if the rollout had routed them elsewhere (the complement of the real set).
    e = r.record.experts.copy()
    for row in (0, 2, 4):
        e[row, 1] = [x for x in range(16) if x not in set(e[row, 1])][:4]
    changed = dataclasses.replace(r.record, experts=e)
    report = fidelity_report([changed], [r.tokens], recorded, glm_layout)
    n = r.record.num_tokens
    assert report.per_layer == {1: 1.0, 2: pytest.approx((n - 3) / n), 3: 1.0}
    assert report.tokens_flipped == 3 and report.token_flip_rate == pytest.approx(3 / n)
    assert report.metrics()["r3/topk_agree_layer_2"] == pytest.approx((n - 3) / n)


def test_megatron_routers_choose_exactly_the_replayed_records_rows(gpt_mtp1, glm_layout):
    """Routing replayed from records is what megatron-core's routers output (their routing_map), row by row."""
    from replay_helpers import synthetic_batch

    lengths = [5, 7]
    records, samples = synthetic_batch(glm_layout, lengths, seed=11)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill(records, samples)
    try:
        chosen = _megatron_choices(gpt_mtp1, torch.cat(samples))
    finally:
        filler.clear()
    assert sorted(chosen) == list(glm_layout.moe_layer_ids)
    at = 0
    for rec, T in zip(records, lengths):
        for col, layer in enumerate(rec.layers):
            mine = chosen[layer][at:at + T - 1].numpy()
            assert np.array_equal(mine, np.sort(rec.experts[:, col, :], axis=1)), (layer, at)
        at += T
