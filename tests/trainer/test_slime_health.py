"""Live R3 health under slime's own replay: ``fill_routing_replay(..., measure=True)`` and ``health(model)``.

slime is not on PyPI: ``slime_reference`` is the stand-in written from THUDM/slime 624b824 (RoutingReplay,
``get_routing_replay_compute_topk`` and the two megatron.patch R3 hunks applied to the installed
megatron-core 0.16.1). The step is slime's: ``actor.py`` ``train_actor`` (fill, the log-prob pass under
``replay_forward`` in eval mode, ``clear_all_forward``, ``replay_backward`` around ``train``) with ``model.py``
``train_one_step``'s forward_step (``replay_forward`` around the model call only, so the backward and its
activation recompute run under ``replay_backward``), one ``health(model)`` read per training step as slime's
``train`` logs once per step. Samples are packed as slime packs them (THD: each sample attends to itself).

Oracle: megatron's own router top-k (``topk_routing_with_score_function`` before slime's patch) on the very
inputs the replayed training forward gave each router, compared with the records by a plain count of sets
(test_health's ``count_flips``); the model's own routing comes from a ``fallthrough`` forward.
"""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import torch

import slime_reference as slime
from health_helpers import host_reads_inside_routers, random_samples, records_from_rows
from slime_helpers import (  # noqa: F401  (fixtures)
    STAGE,
    Spy,
    build_slime_model,
    chunks_of,
    clean_slime_state,
    own_routing,
    packed_inputs,
    plain_counts,
    planted,
    slime_process,
    upstream,
)
from sglang_r3.trainer.slime import fill_routing_replay, health, health_counts
from sglang_r3.trainer import ReplayError
from sglang_r3.trainer.diagnostics import find_routers

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

MICROBATCHES = [[6, 9], [11], [4, 7, 5]]  # three microbatches of packed samples


@pytest.fixture(scope="module", autouse=True)
def _slime_compute_topk_as_installed():
    """measure=True wraps slime's compute_topk factory once per process; put slime's own back afterwards."""
    original = slime.get_routing_replay_compute_topk
    yield
    slime.get_routing_replay_compute_topk = original


def _pass(model, batches, forward_only: bool):
    """One ``forward_backward_func`` over token batches; training: forward_step as model.py's."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    data = iter(batches)

    def forward_step(data_iterator, m):
        ids, pos, mask = packed_inputs(next(data_iterator))
        if not forward_only:  # train_one_step.forward_step: replay_forward around the model call only
            old_stage = os.environ[STAGE]
            os.environ[STAGE] = "replay_forward"
        out = m(ids, pos, mask, labels=torch.roll(ids, -1, 1))
        if not forward_only:
            os.environ[STAGE] = old_stage
        return out, lambda o: (o.mean(), {"loss": o.mean().detach()})

    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=data, model=chunks_of(model), num_microbatches=len(batches),
        seq_length=max(sum(len(t) for t in b) for b in batches), micro_batch_size=1, forward_only=forward_only,
    )


def slime_step(model, microbatches, layout, *, measure=True, steps=None, spy=None):
    """train_actor with --use-rollout-routing-replay: fill, log-prob pass, training steps, clear_all.
    steps: microbatches per training step (slime's num_microbatches); reads health once after each.
    Returns (health per step, losses, gradients after the last step)."""
    steps = steps or [len(microbatches)]
    tokens = [t for _, t in microbatches]
    fill_routing_replay(model, microbatches, layout, measure=measure)
    os.environ[STAGE] = "replay_forward"  # compute_log_prob: forward_only per step, eval mode
    if spy:
        spy.phase = "log_prob"
    model.eval()
    with torch.no_grad():
        at = 0
        for n in steps:
            _pass(model, tokens[at : at + n], forward_only=True)
            at += n
    model.train()
    slime.RoutingReplay.clear_all_forward()
    os.environ[STAGE] = "replay_backward"  # before train()
    if spy:
        spy.phase = "train"
    reads, losses, at = [], [], 0
    for n in steps:  # model.py train: one train_one_step and one log per step
        losses += [d["loss"] for d in _pass(model, tokens[at : at + n], forward_only=False)]
        at += n
        if measure:
            reads.append(health(model))  # the line a slime user adds to train's log_dict
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    slime.RoutingReplay.clear_all()
    return reads, losses, grads


def record_rows(microbatches):
    return sum(len(t) - 1 for _, tokens in microbatches for t in tokens)


# -- tests -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mtp_layers, recompute", [(1, False), (1, True), (3, True)],
                         ids=["mtp1", "mtp1_recompute", "mtp3_recompute"])
def test_records_equal_to_the_models_own_routing_count_no_flip_in_slimes_step(
    slime_process, glm_layout, mtp3_layout, mtp_layers, recompute
):
    model = slime_process(mtp_layers, recompute)
    layout = glm_layout if mtp_layers == 1 else mtp3_layout
    batches = [random_samples(lens, seed=70 + m) for m, lens in enumerate(MICROBATCHES)]
    own = own_routing(model, layout, batches)
    mbs = [(records_from_rows(layout, tokens, rows), tokens) for tokens, rows in zip(batches, own)]
    # slime's pad rows (one per sample) replay ids its own preparation chose, not the router's: were
    # they counted, there would be flips.
    pad_differs = 0
    for (records, tokens), rows in zip(mbs, own):
        x = slime.prepare_routed_experts_for_routing_replay(
            [upstream(r, layout) for r in records], tokens, num_experts=layout.num_experts)
        pads = np.cumsum([len(t) for t in tokens]) - 1
        for lid in layout.moe_layer_ids:
            pad_differs += sum(set(x[p, lid].tolist()) != set(rows[lid][p].tolist()) for p in pads)
    assert pad_differs > 0

    (h,), _, _ = slime_step(model, mbs, layout)
    rows = record_rows(mbs)
    assert h["r3/flip_rate"] == 0.0 and h["r3/tokens_with_flip"] == 0.0
    assert h["r3/pairs_flipped"] == 0 and h["r3/tokens_flipped"] == 0
    assert {k: v for k, v in h.items() if k.startswith("r3/flip_rate/layer_")} == {
        f"r3/flip_rate/layer_{lid}": 0.0 for lid in layout.moe_layer_ids}
    # Each record row once per layer: the log-prob pass and the recompute in the backward are not counted.
    assert h["r3/rows_replayed"] == rows and h["r3/pairs_replayed"] == len(layout.moe_layer_ids) * rows
    # Read once per step: a second read starts from zero.
    assert health(model)["r3/rows_replayed"] == 0


@pytest.mark.parametrize("recompute", [False, True], ids=["no_recompute", "recompute"])
def test_planted_flips_are_counted_as_megatrons_own_router_finds_them_each_step(slime_process, glm_layout, recompute):
    """Flips below change the inputs above: the oracle re-routes, with megatron's own top-k, what each router
    was given in the replayed training forward. Two training steps (slime's num_microbatches = [1, 2]):
    each read holds its own step's microbatches."""
    model = slime_process(1, recompute)
    batches = [random_samples(lens, seed=80 + m) for m, lens in enumerate(MICROBATCHES)]
    mbs = planted(model, glm_layout, batches, seed=recompute)
    spy = Spy(model)
    try:
        reads, _, _ = slime_step(model, mbs, glm_layout, steps=[1, 2], spy=spy)
    finally:
        spy.close()
    per_mb = plain_counts(model, glm_layout, mbs, spy)
    for h, span in zip(reads, [slice(0, 1), slice(1, 3)]):
        flips = sum((f for f, _ in per_mb[span]), collections.Counter())
        tokens_flipped = sum(t for _, t in per_mb[span])
        rows = record_rows(mbs[span])
        # Layer 1 has no replayed layer below it: its flips are exactly the planted ones; above it the
        # replayed inputs differ from a run without replay, and the count is the oracle's.
        assert flips[1] == 4 * len(mbs[span]) and min(flips[2], flips[3]) > 0
        assert h["r3/rows_replayed"] == rows and h["r3/pairs_replayed"] == 3 * rows
        assert h["r3/pairs_flipped"] == sum(flips.values()) and h["r3/tokens_flipped"] == tokens_flipped
        for lid in glm_layout.moe_layer_ids:
            assert h[f"r3/flip_rate/layer_{lid}"] == pytest.approx(flips[lid] / rows), lid
        assert h["r3/flip_rate"] == pytest.approx(sum(flips.values()) / (3 * rows))
        assert h["r3/tokens_with_flip"] == pytest.approx(tokens_flipped / rows)


def test_measuring_on_or_off_gives_bit_identical_losses_and_gradients(slime_process, glm_layout):
    model = slime_process(1, recompute=True)
    batches = [random_samples(lens, seed=90 + m) for m, lens in enumerate(MICROBATCHES)]
    mbs = planted(model, glm_layout, batches, seed=9)
    out = {}
    for measure in (False, True):
        reads, losses, grads = slime_step(model, mbs, glm_layout, measure=measure)
        out[measure] = (losses, grads)
        if measure:
            assert reads[0]["r3/pairs_flipped"] > 0  # it did measure
    assert len(out[True][0]) == len(mbs) and all(torch.equal(a, b) for a, b in zip(out[False][0], out[True][0]))
    assert out[False][1].keys() == out[True][1].keys() and len(out[True][1]) > 0
    assert all(torch.equal(out[False][1][k], out[True][1][k]) for k in out[True][1])


def test_measuring_routers_read_nothing_back_to_the_host_in_slimes_step(slime_process, glm_layout):
    """test_health's counter (patched Tensor host reads and value-dependent aten ops while a router's call
    runs, its hooks and slime's compute_topk included) over slime's whole step, measure off and on."""
    model = slime_process(1, recompute=True)
    batches = [random_samples(lens, seed=100 + m) for m, lens in enumerate(MICROBATCHES)]
    mbs = planted(model, glm_layout, batches, seed=10)
    all_routers = [s.router for s in find_routers(model, glm_layout.num_hidden_layers)]
    seen = {}
    for measure in (False, True):
        with host_reads_inside_routers(all_routers) as events:
            reads, _, _ = slime_step(model, mbs, glm_layout, measure=measure)
        seen[measure] = list(events)
        if measure:
            assert reads[0]["r3/pairs_flipped"] > 0
    assert [e for e in seen[True] if e[1]] == []  # none from sglang_r3 code (fill hooks, meters, measuring)
    assert collections.Counter(n for n, _ in seen[True]) == collections.Counter(n for n, _ in seen[False])
    assert seen[True] == []  # and slime's replay path on megatron-core 0.16.1 makes none either


def test_mtp_routers_live_rows_are_reported_apart_from_the_replayed_layers(slime_process, mtp3_layout):
    model = slime_process(3, recompute=True)
    batches = [random_samples(lens, seed=110 + m) for m, lens in enumerate(MICROBATCHES)]
    mbs = planted(model, mtp3_layout, batches, seed=11)
    spy = Spy(model)
    try:
        (h,), _, _ = slime_step(model, mbs, mtp3_layout, spy=spy)
    finally:
        spy.close()
    mtp = [s for s in find_routers(model, mtp3_layout.num_hidden_layers) if s.is_mtp]
    assert [s.layer_id for s in mtp] == [4, 5, 6]
    for s in mtp:
        calls = spy.calls[(s.chunk, s.path)]
        live = [c for c in calls if c["phase"] == "train" and not c["recompute"]]
        assert len(calls) == 3 * len(mbs)  # log-prob pass, training forward, recompute: only the middle counts
        rows = sum(c["x"].numel() // c["x"].shape[-1] for c in live)
        assert rows == sum(len(t) for b in batches for t in b)
        assert h[f"r3/mtp/rows_routed/layer_{s.layer_id}"] == rows
        assert f"r3/flip_rate/layer_{s.layer_id}" not in h  # not replayed: no flip figure of its own
    assert h["r3/mtp/rows_routed"] == 3 * sum(len(t) for b in batches for t in b)
    # The replayed figures are the decoder layers' alone.
    rows = record_rows(mbs)
    assert sorted(k for k in h if k.startswith("r3/flip_rate/layer_")) == [f"r3/flip_rate/layer_{i}" for i in (1, 2, 3)]
    assert h["r3/pairs_replayed"] == 3 * rows and h["r3/pairs_flipped"] > 0


def test_health_needs_a_measuring_fill_and_a_fill_without_it_stops_counting(slime_process, glm_layout):
    model = slime_process(1)
    batches = [random_samples(lens, seed=120 + m) for m, lens in enumerate(MICROBATCHES)]
    mbs = planted(model, glm_layout, batches, seed=12)
    slime_step(model, mbs, glm_layout, measure=True)  # reads once, leaves counters at zero
    slime_step(model, mbs, glm_layout, measure=False)
    with pytest.raises(ReplayError, match=r"not called with measure=True"):
        health(model)
    other, _ = build_slime_model(1, False, seed=77)
    with pytest.raises(ReplayError, match=r"needs fill_routing_replay\(model, \.\.\., measure=True\)"):
        health_counts(other)


def test_measure_without_slimes_compute_topk_is_refused_before_any_replay_is_touched(
    slime_process, glm_layout, monkeypatch
):
    model = slime_process(1)
    batches = [random_samples(lens, seed=130 + m) for m, lens in enumerate(MICROBATCHES)]
    mbs = planted(model, glm_layout, batches, seed=13)
    fill_routing_replay(model, mbs[:1], glm_layout)
    before = [[t.clone() for t in r.top_indices_list] for r in slime.RoutingReplay.all_routing_replays]
    monkeypatch.delattr(slime, "get_routing_replay_compute_topk")
    with pytest.raises(ReplayError, match=r"measure=True needs slime\.utils\.routing_replay\.get_routing_replay"):
        fill_routing_replay(model, mbs, glm_layout, measure=True)
    after = [r.top_indices_list for r in slime.RoutingReplay.all_routing_replays]
    assert [len(a) for a in after] == [len(b) for b in before]
    assert all(torch.equal(x, y) for a, b in zip(after, before) for x, y in zip(a, b))
