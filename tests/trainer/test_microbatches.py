"""Several microbatches per step through Megatron's own schedules: each router replays each microbatch's rows.

The schedule is megatron-core's ``get_forward_backward_func()``; the oracle is what each real
router chose in each of its calls (forward hooks), compared with the rows packed for that microbatch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_cpu import RouterSpy, TinyMoeSpec, build_gpt, causal_mask
from replay_helpers import synthetic_batch
from sglang_r3.core.record import RecordError
from sglang_r3.trainer import ReplayError, ReplayFiller, pack_rows
from sglang_r3.trainer.routers import state_of

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

LENGTHS = [[5, 7], [9], [4, 3, 6]]  # three microbatches of different sizes


def _microbatches(layout, lengths=LENGTHS):
    return [synthetic_batch(layout, lens, seed=100 * m) for m, lens in enumerate(lengths)]


def _expected(layout, microbatch, layer_id):
    records, _ = microbatch
    packed = pack_rows([r.experts for r in records], layout.num_experts)
    return np.sort(packed.experts[:, layout.moe_layer_ids.index(layer_id), :], axis=1)


def _run_schedule(model, microbatches, forward_only=False):
    """Megatron's schedule over the microbatches, one packed sample sequence each."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    data = iter([torch.cat(tokens) for _, tokens in microbatches])

    def forward_step(data_iterator, model):
        ids = next(data_iterator).reshape(1, -1)
        S = ids.shape[1]
        loss = model(ids, torch.arange(S)[None], causal_mask(S), labels=torch.roll(ids, -1, 1))
        return loss, lambda out: (out.mean(), {"loss": out.mean().detach()})

    model.train(not forward_only)
    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=data,
        model=[model],
        num_microbatches=len(microbatches),
        seq_length=max(sum(len(t) for t in tokens) for _, tokens in microbatches),
        micro_batch_size=1,
        forward_only=forward_only,
    )


@pytest.fixture(autouse=True)
def _fresh_moe_loss_tracker():
    """Training steps here log aux losses into megatron's layer-wise tracker, sized by the first model
    that logs; a later model with more MTP layers must not inherit it."""
    yield
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    get_moe_layer_wise_logging_tracker().clear()


@pytest.fixture(scope="module")
def gpt_recompute(megatron_cpu):
    """Full activation recompute of every layer: each router runs again inside the backward."""
    return build_gpt(
        TinyMoeSpec(mtp_layers=1), seed=77,
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
    )


def test_each_microbatch_reaches_every_router_with_its_own_rows(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    summaries = filler.fill_microbatches(mbs)
    assert [s.num_samples for s in summaries] == [2, 1, 3]
    spy = RouterSpy(gpt_mtp1)
    try:
        losses = _run_schedule(gpt_mtp1, mbs)
        filler.finish()
    finally:
        spy.close()
        filler.clear()
    assert len(losses) == 3
    for site in filler.decoder_sites:
        assert len(spy.seen[site.path]) == 3  # no recompute: one call per microbatch
        for m, mb in enumerate(mbs):
            assert np.array_equal(spy.chosen(site.path, m).numpy(), _expected(glm_layout, mb, site.layer_id))
    # The MTP router routed for itself: its choice is not the replayed decoder rows.
    (mtp,) = filler.mtp_sites
    assert mtp.router.router_replay.router_replay_action is None
    assert all(state_of(s.router).data is None for s in filler.decoder_sites)


def test_activation_recompute_replays_each_microbatch_again_in_its_backward(gpt_recompute, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_recompute, glm_layout)
    filler.fill_microbatches(mbs)
    spy = RouterSpy(gpt_recompute)
    try:
        _run_schedule(gpt_recompute, mbs)
        filler.finish()
    finally:
        spy.close()
        filler.clear()
    for site in filler.decoder_sites:
        calls = spy.seen[site.path]
        assert len(calls) == 6  # forward then recompute, microbatch by microbatch (no pipelining)
        for m, mb in enumerate(mbs):
            want = _expected(glm_layout, mb, site.layer_id)
            assert np.array_equal(spy.chosen(site.path, 2 * m).numpy(), want)
            assert np.array_equal(spy.chosen(site.path, 2 * m + 1).numpy(), want)
    router = filler.decoder_sites[0].router
    assert router.weight.grad is not None and torch.isfinite(router.weight.grad).all()


def test_forward_only_schedule_consumes_each_microbatch_once(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill_microbatches(mbs)
    try:
        with torch.no_grad():
            _run_schedule(gpt_mtp1, mbs, forward_only=True)
        filler.finish()
    finally:
        filler.clear()


def test_rows_left_over_after_the_schedule_name_the_routers(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill_microbatches(mbs)
    try:
        with torch.no_grad():
            _run_schedule(gpt_mtp1, mbs[:2], forward_only=True)
        with pytest.raises(ReplayError, match=r"decoder\.layers\.1\.mlp\.router .*microbatch\(es\) \[2\] of 3"):
            filler.finish()
    finally:
        filler.clear()


def test_a_forward_past_the_filled_microbatches_names_the_router(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill_microbatches(mbs[:1])
    try:
        with torch.no_grad(), pytest.raises(ReplayError, match=r"decoder\.layers\.1\.mlp\.router.*forward #2 but only 1"):
            _run_schedule(gpt_mtp1, mbs[:2], forward_only=True)
    finally:
        filler.clear()


def test_microbatch_rows_that_do_not_fit_its_tokens_name_router_and_microbatch(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill_microbatches([mbs[0], mbs[1]])
    try:
        # The schedule feeds microbatch 2's tokens where microbatch 1 was filled.
        with torch.no_grad(), pytest.raises(ReplayError, match=r"layers\.1\.mlp\.router.*\(microbatch 1\): 13 tokens .* 9 rows"):
            _run_schedule(gpt_mtp1, [mbs[0], mbs[2]], forward_only=True)
    finally:
        filler.clear()


def test_one_bad_record_in_any_microbatch_fills_nothing(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    records, tokens = mbs[2]
    swapped = (records, [tokens[0].flip(0), tokens[1], tokens[2]])  # right length, other tokens
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    with pytest.raises(RecordError, match=r"microbatch 2: sample 0: .*different token sequence"):
        filler.fill_microbatches([mbs[0], mbs[1], swapped])
    for s in filler.decoder_sites:
        assert state_of(s.router).data is None and s.router.router_replay.router_replay_action is None


def test_single_fill_after_a_queued_step_replaces_the_queue(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout)
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    filler.fill_microbatches(mbs)
    filler.fill(*mbs[1])
    spy = RouterSpy(gpt_mtp1)
    try:
        with torch.no_grad():
            _run_schedule(gpt_mtp1, mbs[1:2], forward_only=True)
    finally:
        spy.close()
        filler.clear()
    site = filler.decoder_sites[0]
    assert np.array_equal(spy.chosen(site.path, 0).numpy(), _expected(glm_layout, mbs[1], site.layer_id))


class _InBackward(torch.autograd.Function):
    """Calls a function while autograd runs the backward, as activation recompute does."""

    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.fn()
        return grad, None


def test_recomputes_that_do_not_match_the_forwards_name_the_router(gpt_mtp1, glm_layout):
    mbs = _microbatches(glm_layout, [[6], [6]])
    filler = ReplayFiller(gpt_mtp1, glm_layout)
    site = filler.decoder_sites[0]
    hidden = torch.randn(6, 1, 64)
    filler.fill_microbatches(mbs)
    try:
        with torch.no_grad():
            site.router(hidden)  # microbatch 0 forward
            site.router(hidden)  # microbatch 1 forward
        x = torch.ones(1, requires_grad=True)
        _InBackward.apply(x, lambda: site.router(hidden)).sum().backward()  # recomputes microbatch 0 only
        with pytest.raises(ReplayError, match=r"decoder\.layers\.1\.mlp\.router .*recomputed 1 forward\(s\) but not microbatch\(es\) \[1\]"):
            filler.finish()

        filler.fill_microbatches(mbs[:1])  # nothing forwarded yet, but a recompute arrives
        x = torch.ones(1, requires_grad=True)
        with pytest.raises(ReplayError, match=r"decoder\.layers\.1\.mlp\.router .*recompute #1 but no forward is awaiting"):
            _InBackward.apply(x, lambda: site.router(hidden)).sum().backward()
    finally:
        filler.clear()


# -- pipeline parallel: 2 gloo ranks on CPU -------------------------------------------------------------


def _pipeline_rank(rank: int, port: int, results) -> None:
    """One pipeline stage: 1F1B over 3 microbatches with full recompute, so each stage interleaves
    forwards of later microbatches with recomputes of earlier ones."""
    import os
    import sys
    import traceback
    from pathlib import Path

    try:
        sys.path.insert(0, str(Path(__file__).parent))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        from megatron_cpu import RouterSpy, TinyMoeSpec, build_gpt, init_megatron_cpu
        from replay_helpers import embedded_layout

        init_megatron_cpu(rank=rank, world_size=2, pipeline_parallel=2)
        layout = embedded_layout()
        model = build_gpt(
            TinyMoeSpec(mtp_layers=1), seed=5, pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        )
        model.config.batch_p2p_comm = False  # gloo has no batched isend/irecv
        filler = ReplayFiller(model, layout)
        mbs = _microbatches(layout, [[6, 6], [5, 7], [4, 8]])  # the p2p shapes are fixed: 12 tokens each
        filler.fill_microbatches(mbs)
        spy = RouterSpy(model)
        order = []
        for s in filler.decoder_sites:  # forward (0) or recompute (1), in call order
            s.router.register_forward_pre_hook(lambda m, a: order.append(int(torch._C._current_graph_task_id() != -1)))
        _run_schedule(model, mbs)
        filler.finish()
        checks = {}
        for s in filler.decoder_sites:
            calls = [spy.chosen(s.path, c).numpy() for c in range(len(spy.seen[s.path]))]
            n = len(filler.decoder_sites)
            kinds = order[filler.decoder_sites.index(s)::n]
            fwd = [c for c, k in zip(calls, kinds) if k == 0]
            rec = [c for c, k in zip(calls, kinds) if k == 1]
            checks[s.layer_id] = {
                "forwards_match": len(fwd) == 3 and all(np.array_equal(c, _expected(layout, mb, s.layer_id)) for c, mb in zip(fwd, mbs)),
                "recomputes_match": len(rec) == 3 and all(np.array_equal(c, _expected(layout, mb, s.layer_id)) for c, mb in zip(rec, mbs)),
                "kinds": kinds,
            }
        results.put((rank, checks, [s.layer_id for s in filler.mtp_sites]))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def test_pipeline_parallel_stages_replay_their_layers_microbatch_by_microbatch():
    import socket

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_pipeline_rank, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict((rank, (checks, mtp)) for rank, checks, mtp in (results.get(timeout=300) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for rank, (checks, mtp) in got.items():
        assert checks != "error", f"rank {rank}:\n{mtp}"
    # Stage 0 holds layers 0 (dense) and 1; stage 1 holds 2, 3 and the MTP layer.
    assert sorted(got[0][0]) == [1] and sorted(got[1][0]) == [2, 3] and got[1][1] == [4]
    for rank, (checks, _) in got.items():
        for layer, c in checks.items():
            assert c["forwards_match"] and c["recomputes_match"], f"stage {rank} layer {layer}: {c}"
    # 1F1B on the first stage: a second forward runs before the first recompute.
    assert got[0][0][1]["kinds"][:3] == [0, 0, 1]
