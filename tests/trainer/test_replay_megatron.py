"""ReplayFiller against real megatron-core 0.16 models on CPU (GLM-4.7-style MoE + MTP)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from replay_helpers import synthetic_batch
from megatron_cpu import RouterSpy, forward_loss, routers
from sglang_r3.trainer import ReplayFiller, pack_rows

pytestmark = pytest.mark.fast

LENGTHS = [7, 9, 5]  # three samples packed into one microbatch of 21 tokens


def _sorted(a):
    return np.sort(np.asarray(a), axis=-1)


def test_seed_001_glm47_decoder_routers_replay_records_mtp_routers_live(gpt_mtp1, glm_layout, caplog):
    model, layout = gpt_mtp1, glm_layout
    records, tokens = synthetic_batch(layout, LENGTHS, seed=1)

    with caplog.at_level(logging.INFO, logger="sglang_r3.trainer.megatron"):
        filler = ReplayFiller(model, layout)
    assert [s.layer_id for s in filler.decoder_sites] == [1, 2, 3]
    assert [(s.layer_id, s.depth) for s in filler.mtp_sites] == [(4, 1)]
    live_logs = [r.getMessage() for r in caplog.records if "left live" in r.getMessage()]
    assert len(live_logs) == 1 and "1 MTP router(s) left live" in live_logs[0]

    summary = filler.fill(records, tokens)
    assert summary.num_rows == sum(LENGTHS)
    assert summary.replayed_layers == (1, 2, 3) and summary.live_mtp_layers == (4,)

    spy = RouterSpy(model)
    try:
        loss = forward_loss(model, torch.cat(tokens), train=True)
        filler.replay_backward()
        loss.mean().backward()
    finally:
        spy.close()

    packed = pack_rows([r.experts for r in records], layout.num_experts)
    for site in filler.decoder_sites:
        chosen = spy.chosen(site.path).numpy()
        col = layout.moe_layer_ids.index(site.layer_id)
        assert np.array_equal(chosen, _sorted(packed.experts[:, col, :])), site.describe()
        # The real rows are exactly the records' rows, sample after sample.
        real = chosen[packed.real]
        assert np.array_equal(real, _sorted(np.concatenate([r.experts[:, col, :] for r in records])))

    # MTP router computed its own top-k from its own logits.
    (mtp,) = filler.mtp_sites
    x, routing_map = spy.seen[mtp.path][0]
    with torch.no_grad():
        logits = mtp.router.gating(x).view(-1, layout.num_experts)
    own = torch.sort(torch.topk(logits, layout.topk, dim=1).indices, dim=1).values
    assert torch.equal(spy.chosen(mtp.path), own)
    assert mtp.router.router_replay.router_replay_action is None

    assert torch.isfinite(loss).all()
    for site in filler.sites:
        assert site.router.weight.grad is not None and torch.isfinite(site.router.weight.grad).all()
    filler.clear()


def test_seed_001_backward_recompute_pops_the_same_rows(gpt_mtp1, glm_layout):
    """REPLAY_BACKWARD: a recomputed router forward (activation recompute) gets the filled rows again."""
    model, layout = gpt_mtp1, glm_layout
    records, tokens = synthetic_batch(layout, LENGTHS, seed=2)
    filler = ReplayFiller(model, layout)
    filler.fill(records, tokens)
    site = filler.decoder_sites[0]
    filler.replay_backward()
    x = torch.randn(sum(LENGTHS), 1, 64)
    _, routing_map = site.router(x)
    got = torch.sort(torch.nonzero(routing_map)[:, 1].reshape(-1, layout.topk), dim=1).values.numpy()
    packed = pack_rows([r.experts for r in records], layout.num_experts)
    assert np.array_equal(got, _sorted(packed.experts[:, 0, :]))
    assert site.router.router_replay.replay_backward_list == []
    filler.clear()


def test_seed_001_clear_returns_routers_to_their_own_routing(gpt_mtp1, glm_layout):
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill(*synthetic_batch(glm_layout, [6], seed=3))
    filler.clear()
    for s in filler.decoder_sites:
        rr = s.router.router_replay
        assert rr.router_replay_action is None and rr.target_topk_idx is None and rr.replay_backward_list == []


def test_seed_001_rows_that_do_not_match_the_microbatch_are_named(gpt_mtp1, glm_layout):
    from sglang_r3.trainer import ReplayError

    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill(*synthetic_batch(glm_layout, [8], seed=4))
    with pytest.raises(ReplayError, match=r"decoder, layer 1\): 10 tokens reach the router but 8 rows"):
        forward_loss(gpt_mtp1, torch.zeros(10, dtype=torch.long), train=False)
    filler.clear()


def test_seed_001_global_action_does_not_capture_mtp_routers(gpt_mtp1, glm_layout):
    """Even if someone sets a global RouterReplay action, fill() leaves MTP routers live."""
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    filler = ReplayFiller(gpt_mtp1, glm_layout)
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    filler.fill(*synthetic_batch(glm_layout, [5, 5], seed=5))
    for s in filler.mtp_sites:
        assert s.router.router_replay.router_replay_action is None
    for s in filler.decoder_sites:
        assert s.router.router_replay.router_replay_action == RouterReplayAction.REPLAY_FORWARD
    filler.clear()


def test_routers_without_replay_instances_get_one(megatron_cpu, glm_layout):
    from megatron_cpu import TinyMoeSpec, build_gpt

    model = build_gpt(TinyMoeSpec(mtp_layers=1, routing_replay=False))
    assert all(m.router_replay is None for _, m in routers(model))
    filler = ReplayFiller(model, glm_layout)
    assert all(s.router.router_replay is not None for s in filler.decoder_sites)
    assert all(s.router.router_replay is None for s in filler.mtp_sites)
    (rec,), (ids,) = synthetic_batch(glm_layout, [6], seed=6)
    filler.fill([rec], [ids])
    spy = RouterSpy(model)
    try:
        forward_loss(model, ids, train=False)
    finally:
        spy.close()
    assert np.array_equal(spy.chosen(filler.decoder_sites[0].path).numpy()[:5], _sorted(rec.experts[:, 0, :]))
    filler.clear()
