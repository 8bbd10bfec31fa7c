"""Seed 001 inside slime's own replay: ``sglang_r3.trainer.slime.fill_routing_replay`` on real megatron-core.

slime is not on PyPI: ``slime_reference`` is a stand-in written from THUDM/slime 624b824 (its RoutingReplay,
register_routing_replay, compute_topk, the two megatron.patch R3 hunks applied to the installed
megatron-core 0.16.1, its data preparation and its positional fill loop). The models are GLM-style
(first layer dense, sigmoid scores with an expert bias) with one MoE MTP layer (seed 001) or three.

Oracles: decoder routers must use the rows slime's own ``prepare_routed_experts_for_routing_replay`` gives
their layer (from the records' upstream int32 form); MTP routers must pick megatron's own top-k
(``topk_routing_with_score_function`` before the patch) of the router input they saw in that same
replayed forward; each replay's cursors are slime's ``assert_all_consumed``; MTP losses are slime's log.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import slime_reference as slime
from megatron_cpu import causal_mask, routers
from replay_helpers import replace_layer, synthetic_batch
from slime_helpers import (  # noqa: F401  (fixtures)
    STAGE,
    Spy,
    build_slime_model,
    chosen,
    chunks_of,
    clean_slime_state,
    mtp_oracle,
    slime_process,
    slime_rows,
    upstream,
)
from sglang_r3.trainer.slime import fill_routing_replay
from sglang_r3.core.record import RecordError
from sglang_r3.trainer import ModelMismatchError, ReplayError
from sglang_r3.trainer.diagnostics import mtp_loss_metrics

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

MICROBATCHES = [[5, 7], [9, 3]]  # two microbatches of 12 tokens (the pipeline's p2p shape is fixed)


def layout_for(glm_layout, mtp3_layout, mtp_layers):
    return glm_layout if mtp_layers == 1 else mtp3_layout


def make_microbatches(layout, lengths=MICROBATCHES, seed=0):
    return [synthetic_batch(layout, lens, seed=seed + 100 * m) for m, lens in enumerate(lengths)]


# -- slime's step: actor.py train_actor with model.py forward_only / train_one_step -------------------------

def _schedule(model, microbatches, forward_only: bool, train_forward_step: bool):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = chunks_of(model)
    data = [iter([torch.cat(tokens) for _, tokens in microbatches]) for _ in chunks]  # one per chunk

    def forward_step(data_iterator, model):
        ids = next(data_iterator).reshape(1, -1)
        S = ids.shape[1]
        if train_forward_step and os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            # model.py train_one_step.forward_step: replay_forward around the model call only, so the
            # backward (and its recompute) runs under the ambient replay_backward.
            old_stage = os.environ[STAGE]
            os.environ[STAGE] = "replay_forward"
        # slime passes labels=None and mtp_kwargs (its gpt_model hunk); megatron-core 0.16.1 takes labels.
        out = model(ids, torch.arange(S)[None], causal_mask(S), labels=torch.roll(ids, -1, 1))
        if train_forward_step and os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            os.environ[STAGE] = old_stage
        return out, lambda o: (o.mean(), {"loss": o.mean().detach()})

    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=data if len(chunks) > 1 else data[0], model=chunks,
        num_microbatches=len(microbatches),
        seq_length=sum(len(t) for t in microbatches[0][1]), micro_batch_size=1, forward_only=forward_only,
    )


def slime_r3_step(model, microbatches, fill, spy=None) -> dict:
    """train_actor with --use-rollout-routing-replay, up to (not including) its final clear_all().
    Returns the replay cursors after the log-prob pass, as (forward_index, backward_index, recorded)."""
    fill()  # self.fill_routing_replay(data_iterator, num_microbatches, rollout_data)
    os.environ[STAGE] = "replay_forward"  # before compute_log_prob
    if spy:
        spy.phase = "log_prob"
    for chunk in chunks_of(model):
        chunk.eval()  # forward_only: eval mode, no grad
    with torch.no_grad():
        _schedule(model, microbatches, forward_only=True, train_forward_step=False)
    for chunk in chunks_of(model):
        chunk.train()
    after_log_prob = [(r.forward_index, r.backward_index, len(r.top_indices_list))
                      for r in slime.RoutingReplay.all_routing_replays]
    slime.RoutingReplay.clear_all_forward()
    os.environ[STAGE] = "replay_backward"  # before train()
    if spy:
        spy.phase = "train"
    _schedule(model, microbatches, forward_only=False, train_forward_step=True)
    return {"after_log_prob": after_log_prob}


def check_step(model, layout, microbatches, spy, recompute: bool, mtp_here: bool = True):
    from sglang_r3.trainer.diagnostics import find_routers

    sites = find_routers(model, layout.num_hidden_layers)
    n = len(microbatches)
    for s in (s for s in sites if not s.is_mtp):
        calls = spy.calls[(s.chunk, s.path)]
        by_kind = {
            "log_prob": [c for c in calls if c["phase"] == "log_prob"],
            "forward": [c for c in calls if c["phase"] == "train" and not c["recompute"]],
            "recompute": [c for c in calls if c["phase"] == "train" and c["recompute"]],
        }
        assert [len(v) for v in by_kind.values()] == [n, n, n if recompute else 0], s.describe()
        for kind, kind_calls in by_kind.items():
            for m, (c, mb) in enumerate(zip(kind_calls, microbatches)):
                assert np.array_equal(chosen(c), slime_rows(layout, mb, s.layer_id)), f"{s.describe()} {kind} {m}"
    mtp_sites = [s for s in sites if s.is_mtp]
    assert len(mtp_sites) == (layout.num_mtp_layers if mtp_here else 0)
    for s in mtp_sites:
        calls = spy.calls[(s.chunk, s.path)]
        assert len([c for c in calls if c["recompute"]]) == (n if recompute else 0), s.describe()
        assert len(calls) == (3 if recompute else 2) * n, s.describe()
        for c in calls:
            probs, routing_map = mtp_oracle(s.router, c)
            assert torch.equal(c["map"], routing_map), f"{s.describe()} {c['phase']} recompute={c['recompute']}"
            torch.testing.assert_close(c["probs"], probs)
        assert s.router.routing_replay.top_indices_list == []


# -- the seed bug, reproduced in slime's own code --------------------------------------------------------

@pytest.mark.parametrize("mtp_layers", [1, 3])
def test_slime_positional_fill_raises_the_seed_assertion_with_moe_mtp_layers(
    slime_process, glm_layout, mtp3_layout, mtp_layers
):
    model = slime_process(mtp_layers)
    layout = layout_for(glm_layout, mtp3_layout, mtp_layers)
    assert len(slime.RoutingReplay.all_routing_replays) == 3 + mtp_layers  # MTP routers registered too
    mbs = make_microbatches(layout)
    upstream_mbs = [([upstream(r, layout) for r in recs], toks) for recs, toks in mbs]
    with pytest.raises(AssertionError):
        slime.slime_positional_fill([model], upstream_mbs, layout.num_experts)


def test_mtp_router_left_with_an_empty_slime_replay_dies_in_replay_forward(slime_process, glm_layout):
    """What "skipping" MTP replays did: the decoder replays filled, the MTP replay empty, then slime's
    replay_forward pops from it (the issue's IndexError)."""
    model = slime_process(1)
    mbs = make_microbatches(glm_layout)[:1]
    decoder = slime.RoutingReplay.all_routing_replays[:3]
    records, tokens = mbs[0]
    x = slime.prepare_routed_experts_for_routing_replay(
        [upstream(r, glm_layout) for r in records], tokens, num_experts=glm_layout.num_experts
    )
    for replay, layer_id in zip(decoder, glm_layout.moe_layer_ids):
        replay.record(x[:, layer_id])
    os.environ[STAGE] = "replay_forward"
    ids = torch.cat(tokens).reshape(1, -1)
    with torch.no_grad(), pytest.raises(IndexError):
        model(ids, torch.arange(ids.shape[1])[None], causal_mask(ids.shape[1]), labels=torch.roll(ids, -1, 1))


# -- ours, through slime's stage sequence -------------------------------------------------------------------

@pytest.mark.parametrize("recompute", [False, True], ids=["no_recompute", "recompute"])
@pytest.mark.parametrize("mtp_layers", [1, 3])
def test_r3_step_decoder_routers_replay_slime_rows_and_mtp_routers_route_live(
    slime_process, glm_layout, mtp3_layout, mtp_layers, recompute
):
    model = slime_process(mtp_layers, recompute)
    layout = layout_for(glm_layout, mtp3_layout, mtp_layers)
    mbs = make_microbatches(layout, seed=mtp_layers)
    spy = Spy(model)
    try:
        state = slime_r3_step(model, mbs, lambda: fill_routing_replay([model], mbs, layout), spy)
    finally:
        spy.close()
    check_step(model, layout, mbs, spy, recompute)

    replays = slime.RoutingReplay.all_routing_replays
    decoder, mtp = replays[:3], replays[3:]
    # Log-prob pass: every decoder replay popped once per microbatch, nothing from the MTP ones.
    assert state["after_log_prob"] == [(2, 0, 2)] * 3 + [(0, 0, 0)] * mtp_layers
    if recompute:
        slime.RoutingReplay.assert_all_consumed()  # forward and recompute each took every microbatch once
    else:
        assert [(r.forward_index, r.backward_index) for r in decoder] == [(2, 0)] * 3
        assert all((r.forward_index, r.backward_index, r.top_indices_list) == (0, 0, []) for r in mtp)

    # Per-head MTP losses, as slime logs them after the step, and as mtp_loss_metrics reports them.
    ours = mtp_loss_metrics(loss_scale=1 / len(mbs), clean=False)
    theirs = slime.slime_mtp_log(len(mbs))
    assert sorted(ours) == sorted(k[len("train/"):] for k in theirs)
    assert len(ours) == mtp_layers + 1
    for key, value in ours.items():
        assert np.isfinite(value) and value > 0 and value == pytest.approx(theirs[f"train/{key}"], rel=1e-6)
    slime.RoutingReplay.clear_all()
    assert all(r.top_indices_list == [] and r.forward_index == r.backward_index == 0 for r in replays)


def test_mtp_routing_in_the_replayed_forward_is_not_what_a_live_forward_picks(slime_process, glm_layout):
    """The MTP oracle is the replayed forward's own input: replaying the decoder changes what reaches the
    MTP layer, so a run without replay would be the wrong reference."""
    model = slime_process(1)
    mbs = make_microbatches(glm_layout)[:1]
    ids = torch.cat(mbs[0][1]).reshape(1, -1)
    S = ids.shape[1]
    mtp_name = (0, [n for n, _ in routers(model)][-1])
    maps = {}
    for stage in ("fallthrough", "replay_forward"):
        fill_routing_replay(model, mbs, glm_layout)
        os.environ[STAGE] = stage
        spy = Spy(model)
        try:
            with torch.no_grad():
                model.eval()
                model(ids, torch.arange(S)[None], causal_mask(S), labels=torch.roll(ids, -1, 1))
        finally:
            spy.close()
            model.train()
        maps[stage] = chosen(spy.calls[mtp_name][0])
    assert not np.array_equal(maps["fallthrough"], maps["replay_forward"])


def test_two_rollout_steps_in_a_row_each_replay_their_own_rows(slime_process, glm_layout):
    model = slime_process(1, recompute=True)
    for step in range(2):
        mbs = make_microbatches(glm_layout, seed=1000 * (step + 1))
        fill_routing_replay(model, mbs, glm_layout)  # a repeated fill replaces, it does not append
        spy = Spy(model)
        try:
            slime_r3_step(model, mbs, lambda: fill_routing_replay(model, mbs, glm_layout), spy)
        finally:
            spy.close()
        check_step(model, glm_layout, mbs, spy, recompute=True)
        slime.RoutingReplay.assert_all_consumed()
        slime.RoutingReplay.clear_all()  # end of train_actor


def test_each_router_gets_its_own_layer_whatever_the_registration_order(slime_process, glm_layout):
    model = slime_process(1)
    slime.RoutingReplay.all_routing_replays = list(reversed(slime.RoutingReplay.all_routing_replays))
    mbs = make_microbatches(glm_layout)
    summary = fill_routing_replay([model], mbs, glm_layout)
    assert summary.replayed_layers == (1, 2, 3) and summary.live_mtp_layers == (4,)
    assert summary.rows == (12, 12) and summary.digests_checked
    for layer_id, (_, r) in zip(glm_layout.moe_layer_ids, routers(model)):
        got = [np.sort(t.numpy().astype(np.int64), axis=1) for t in r.routing_replay.top_indices_list]
        assert len(got) == 2
        for g, mb in zip(got, mbs):
            assert np.array_equal(g, slime_rows(glm_layout, mb, layer_id))
    # Pad rows too are slime's own (its arange over all layers), not merely valid ids.
    (_, first), *_ = routers(model)
    x = slime.prepare_routed_experts_for_routing_replay(
        [upstream(r, glm_layout) for r in mbs[0][0]], mbs[0][1], num_experts=glm_layout.num_experts
    )
    assert torch.equal(first.routing_replay.top_indices_list[0].to(torch.int32), x[:, 1])


def test_upstream_int32_arrays_fill_the_same_rows_as_records(slime_process, glm_layout):
    model = slime_process(1)
    mbs = make_microbatches(glm_layout)
    fill_routing_replay(model, mbs, glm_layout)
    from_records = [[t.clone() for t in r.routing_replay.top_indices_list] for _, r in routers(model)]
    arrays = [([upstream(r, glm_layout) for r in recs], toks) for recs, toks in mbs]
    summary = fill_routing_replay(model, arrays, glm_layout)
    assert not summary.digests_checked
    for before, (_, r) in zip(from_records, routers(model)):
        after = r.routing_replay.top_indices_list
        assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))


@pytest.mark.parametrize("tp, tp_rank, cp, cp_rank, sp, allgather_cp, multiplier", [
    (1, 0, 2, 0, False, False, 1),
    (1, 0, 2, 1, False, False, 1),
    (2, 1, 1, 0, True, False, 3),
    (2, 0, 2, 1, True, True, 1),
    (1, 0, 3, 2, False, True, 2),
], ids=["cp2_rank0", "cp2_rank1", "tp2_sp_pad3", "tp2_sp_cp2_allgather", "cp3_allgather_pad2"])
def test_rows_are_slimes_own_preparation_under_cp_tp_sp(monkeypatch, glm_layout, tp, tp_rank, cp, cp_rank, sp,
                                                         allgather_cp, multiplier):
    """Every row a rank records, pad rows included, is the row slime's cp_utils.py gives that rank."""
    from megatron.core import parallel_state as mpu
    from sglang_r3.trainer.slime import layer_rows
    from sglang_r3.trainer import TokenLayout

    for name, value in (("get_tensor_model_parallel_world_size", tp), ("get_tensor_model_parallel_rank", tp_rank),
                        ("get_context_parallel_world_size", cp), ("get_context_parallel_rank", cp_rank)):
        monkeypatch.setattr(mpu, name, lambda v=value: v)
    records, tokens = synthetic_batch(glm_layout, [5, 11, 8], seed=3)
    want = slime.prepare_routed_experts_for_routing_replay(
        [upstream(r, glm_layout) for r in records], tokens, num_experts=glm_layout.num_experts,
        data_pad_size_multiplier=multiplier, sequence_parallel=sp, allgather_cp=allgather_cp,
    )
    layout = TokenLayout(tp_size=tp, tp_rank=tp_rank, cp_size=cp, cp_rank=cp_rank, sequence_parallel=sp,
                         data_pad_size_multiplier=multiplier, allgather_cp=allgather_cp)
    got, checked, real = layer_rows(records, tokens, glm_layout, layout, [3, 1])  # any subset, any order
    assert checked and got.shape == (2, want.shape[0], glm_layout.topk)
    assert torch.equal(got[0].to(torch.int32), want[:, 3]) and torch.equal(got[1].to(torch.int32), want[:, 1])
    assert real.dtype == bool and real.shape == (want.shape[0],)  # the pad mask health counts by


# -- refusals -------------------------------------------------------------------------------------------------

def _replay_contents(model):
    return [[t.clone() for t in r.routing_replay.top_indices_list] for _, r in routers(model)]


def _unchanged(model, before):
    after = _replay_contents(model)
    return len(after) == len(before) and all(
        len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(after, before)
    )


def test_model_that_does_not_match_the_layout_is_refused_naming_the_difference(slime_process, glm_layout, mtp3_layout):
    model = slime_process(1)
    with pytest.raises(ModelMismatchError, match=r"MTP layers: trainer has 1, layout has 3"):
        fill_routing_replay(model, make_microbatches(mtp3_layout), mtp3_layout)
    other = replace_layer(glm_layout, 2, num_experts=32)
    with pytest.raises(ModelMismatchError, match=r"layer 2\): trainer has 16 experts, layout has 32"):
        fill_routing_replay(model, make_microbatches(other), other)


@pytest.mark.parametrize("bad", ["other_tokens", "other_weights", "other_fingerprint", "bare_lengths"])
def test_records_that_do_not_belong_fill_nothing(slime_process, glm_layout, bad):
    from sglang_r3.core.layout import ModelLayout

    model = slime_process(1)
    fill_routing_replay(model, make_microbatches(glm_layout), glm_layout)
    before = _replay_contents(model)
    mbs = make_microbatches(glm_layout, seed=7)
    records, tokens = mbs[1]
    kw = {}
    if bad == "other_tokens":
        mbs[1] = (records, [tokens[0].flip(0), tokens[1]])  # right length, other ids
        match = r"microbatch 1: sample 0: record was produced for a different token sequence"
    elif bad == "other_weights":
        mbs = [synthetic_batch(glm_layout, lens, seed=7 + m, weight_version="v1")
               for m, lens in enumerate(MICROBATCHES)]
        kw = {"weight_version": "v2"}
        match = (r"microbatch 0: sample 0: record was routed with weight version 'v1', "
                 r"but the trainer holds weight version 'v2'")
    elif bad == "other_fingerprint":
        other = ModelLayout("DeepseekV3ForCausalLM", glm_layout.num_hidden_layers, glm_layout.layers)
        mbs[1] = synthetic_batch(other, MICROBATCHES[1], seed=9)
        match = r"microbatch 1: sample 0: record belongs to layout '[0-9a-f]{16}', but the trainer's layout is"
    else:
        mbs[1] = (records, [len(t) for t in tokens])
        match = r"microbatch 1: sample 0: got a bare length"
    with pytest.raises(RecordError, match=match):
        fill_routing_replay(model, mbs, glm_layout, **kw)
    assert _unchanged(model, before)


@pytest.mark.parametrize("bad", ["num_layers", "rows", "dense_column", "expert_id", "repeated_id", "weight_version"])
def test_upstream_arrays_that_cannot_be_this_models_are_refused(slime_process, glm_layout, bad):
    model = slime_process(1)
    mbs = make_microbatches(glm_layout)
    arrays = [[upstream(r, glm_layout) for r in recs] for recs, _ in mbs]
    a = arrays[0][1]
    kw = {}
    if bad == "num_layers":
        arrays[0][1] = torch.cat([a, torch.zeros_like(a[:, :1])], dim=1)
        match = r"sample 1: routed_experts has shape \(6, 5, 4\), expected \[T-1, 4, 4\]"
    elif bad == "rows":
        arrays[0][1] = a[:-1]
        match = r"sample 1: routed_experts has 5 rows, but the sample has 7 tokens"
    elif bad == "dense_column":
        a[3, 0, 0] = 5
        match = r"sample 1: routed_experts names experts at row 3 of dense layer 0"
    elif bad == "expert_id":
        a[2, 2, 1] = 16
        match = r"sample 1: expert id 16 at row 2, layer 2 is outside 0..15"
    elif bad == "repeated_id":
        a[4, 3, 2] = a[4, 3, 0]
        match = r"sample 1: row 4, layer 3 names expert \d+ twice in its top-4"
    else:
        kw = {"weight_version": "v1"}
        match = r"sample 0: an upstream routed_experts array carries no weight version"
    before = _replay_contents(model)
    with pytest.raises(RecordError, match=r"microbatch 0: " + match):
        fill_routing_replay(model, [(arr, toks) for arr, (_, toks) in zip(arrays, mbs)], glm_layout, **kw)
    assert _unchanged(model, before)


def test_model_built_without_slime_replays_is_refused_naming_the_flag(slime_process, glm_layout):
    os.environ["ENABLE_ROUTING_REPLAY"] = "0"
    try:
        model, _ = build_slime_model(1, False, seed=3)
    finally:
        os.environ["ENABLE_ROUTING_REPLAY"] = "1"
    with pytest.raises(ReplayError, match=r"without slime's routing_replay: .*decoder\.layers\.1\.mlp\.router.*"
                                          r"ENABLE_ROUTING_REPLAY=1.*--use-rollout-routing-replay"):
        fill_routing_replay(model, make_microbatches(glm_layout), glm_layout)


def test_microbatches_fed_in_another_order_name_router_and_microbatch(slime_process, glm_layout):
    model = slime_process(1)
    mbs = make_microbatches(glm_layout, [[5, 7], [9]])
    fill_routing_replay(model, mbs, glm_layout)
    os.environ[STAGE] = "replay_forward"
    ids = torch.cat(mbs[1][1]).reshape(1, -1)  # microbatch 1's tokens where microbatch 0 was recorded
    with torch.no_grad(), pytest.raises(
        ReplayError,
        match=r"decoder\.layers\.1\.mlp\.router .*\(microbatch 0, replay_forward\): 9 tokens reach the router but 12 rows",
    ):
        model(ids, torch.arange(9)[None], causal_mask(9), labels=torch.roll(ids, -1, 1))


def test_a_pass_past_the_recorded_microbatches_names_the_router(slime_process, glm_layout):
    model = slime_process(1)
    mbs = make_microbatches(glm_layout)[:1]
    fill_routing_replay(model, mbs, glm_layout)
    os.environ[STAGE] = "replay_forward"
    ids = torch.cat(mbs[0][1]).reshape(1, -1)
    run = lambda: model(ids, torch.arange(12)[None], causal_mask(12), labels=torch.roll(ids, -1, 1))  # noqa: E731
    with torch.no_grad():
        run()
        # a second log-prob pass without RoutingReplay.clear_all_forward() in between
        with pytest.raises(ReplayError, match=r"decoder\.layers\.1\.mlp\.router .*replay_forward #2, but 1 microbatch"):
            run()


def test_a_failing_mtp_forward_gives_the_ambient_stage_back(slime_process, glm_layout):
    model = slime_process(1)
    (_, mtp_router) = routers(model)[-1]
    os.environ[STAGE] = "replay_backward"
    with pytest.raises(RuntimeError):
        mtp_router(torch.zeros(3, 1, 7))  # wrong hidden size: the gating matmul raises inside the forward
    assert os.environ[STAGE] == "replay_backward"


# -- pipeline parallel: 2 gloo ranks, MTP on the last stage ---------------------------------------------------

def _pipeline_rank(rank: int, port: int, results, virtual) -> None:
    import sys
    import traceback
    from pathlib import Path

    try:
        sys.path.insert(0, str(Path(__file__).parent))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ENABLE_ROUTING_REPLAY="1")
        from megatron_cpu import init_megatron_cpu
        from replay_helpers import embedded_layout

        init_megatron_cpu(rank=rank, world_size=2, pipeline_parallel=2, virtual_pipeline=virtual)
        import slime_reference

        slime_reference.install()
        layout = embedded_layout()
        model, replays = build_slime_model(1, True, seed=5, virtual=virtual, pipeline_model_parallel_size=2,
                                           pipeline_dtype=torch.float32)
        chunks = chunks_of(model)
        for chunk in chunks:
            chunk.config.batch_p2p_comm = False  # gloo has no batched isend/irecv
        mbs = make_microbatches(layout)
        spy = Spy(chunks)
        summary = fill_routing_replay(chunks, mbs, layout)
        slime_r3_step(chunks, mbs, lambda: fill_routing_replay(chunks, mbs, layout), spy)
        spy.close()
        check_step(chunks, layout, mbs, spy, recompute=True, mtp_here=rank == 1)
        slime_reference.RoutingReplay.assert_all_consumed()
        first_router = next((c, n) for c, chunk in enumerate(chunks) for n, _ in routers(chunk))
        order = [c["recompute"] for c in spy.calls[first_router] if c["phase"] == "train"]
        results.put((rank, summary.replayed_layers, summary.live_mtp_layers, len(replays), order))
    except BaseException:
        results.put((rank, "error", traceback.format_exc(), None, None))


def _run_ranks(virtual):
    import socket

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_pipeline_rank, args=(r, port, results, virtual)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = {r[0]: r[1:] for r in (results.get(timeout=300) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for rank, res in got.items():
        assert res[0] != "error", f"rank {rank}:\n{res[1]}"
    return got


def test_pipeline_parallel_stages_fill_their_own_routers_and_mtp_routes_live_on_the_last():
    got = _run_ranks(virtual=None)
    # Stage 0: layers 0 (dense) and 1; stage 1: layers 2, 3 and the MTP layer (its replay registered too).
    assert got[0][:3] == ((1,), (), 1) and got[1][:3] == ((2, 3), (4,), 3)
    # 1F1B on the first stage: both forwards before the first recompute.
    assert got[0][3][:3] == [False, False, True]


def test_virtual_pipeline_chunks_replay_their_layers_and_mtp_routes_live_on_the_last():
    """2 stages x 2 virtual stages, one layer per chunk: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3
    plus the MTP layer; the interleaved schedule runs both chunks of a rank."""
    got = _run_ranks(virtual=2)
    assert got[0][:3] == ((2,), (), 1) and got[1][:3] == ((1, 3), (4,), 3)
