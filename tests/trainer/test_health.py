"""Live R3 health (``ReplayFiller(..., measure=True)``) against real megatron-core routers.

Oracles from outside the measuring code: Megatron's own routers with replay off (their routing_map,
read by forward hooks), run on the very inputs the replayed forward gave them, compared with the
records by a plain Python count of sets; on the same weights, ``benchmarks.fidelity``'s offline
figures for the same bf16 SGLang samples.
"""

from __future__ import annotations

import collections
import os
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from health_helpers import (
    LENGTHS,
    SEED,
    chosen_experts,
    count_flips,
    host_reads_inside_routers,
    perturb_rows,
    random_samples,
    records_from_rows,
)
from megatron_cpu import RouterSpy, TinyMoeSpec, build_gpt, causal_mask
from sglang_r3.trainer import ReplayError, ReplayFiller, pack_rows
from sglang_r3.trainer.diagnostics import HealthBook, measure_router, measured_compute_topk

pytestmark = pytest.mark.fast

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(megatron_cpu):
    """A model of its own: the meters these tests attach stay on its routers."""
    return build_gpt(TinyMoeSpec(mtp_layers=1), seed=2024)


@pytest.fixture(autouse=True)
def _fresh_moe_loss_state():
    """Megatron's aux-loss state is process-global: the layer-wise tracker is sized by the first model
    that logs, and the aux-loss backward scale is made 0-d by a plain ``backward()`` while Megatron's
    schedules later copy a [1] scale into it. Each test starts and ends without either."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler, get_moe_layer_wise_logging_tracker

    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    yield
    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    get_moe_layer_wise_logging_tracker().clear()


def _packed_forward(model, tokens, train: bool):
    """Samples packed into one sequence as a trainer packs them: each attends to itself only
    (block-diagonal causal mask, positions from 0 per sample), so a sample's pad row reaches no
    other sample's router. Returns the per-token loss [1, S]."""
    model.train(train)
    ids = torch.cat(tokens).reshape(1, -1)
    S = ids.shape[1]
    sample = torch.repeat_interleave(torch.arange(len(tokens)), torch.tensor([len(t) for t in tokens]))
    mask = causal_mask(S) | (sample[:, None] != sample[None, :])[None, None]
    pos = torch.cat([torch.arange(len(t)) for t in tokens]).reshape(1, S)
    return model(ids, pos, mask, labels=torch.roll(ids, -1, dims=1))


def _own_routing(model, filler, tokens):
    """layer id -> [S, topk] what each decoder router chooses with replay off (Megatron's own routing)."""
    filler.clear()
    spy = RouterSpy(model)
    try:
        with torch.no_grad():
            _packed_forward(model, tokens, train=False)
    finally:
        spy.close()
    return {s.layer_id: spy.chosen(s.path).numpy() for s in filler.decoder_sites}


@contextmanager
def _router_inputs(model, filler):
    """What each decoder router was handed in each forward (not in the backward's recompute)."""
    seen = collections.defaultdict(list)

    def hook(lid):
        def h(module, args):
            if torch._C._current_graph_task_id() == -1:
                seen[lid].append(args[0].detach().clone())

        return h

    handles = [s.router.register_forward_pre_hook(hook(s.layer_id)) for s in filler.decoder_sites]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _own_sets_on(site, x, k):
    """Megatron's own routing of ``x`` by this router, replay off (the oracle of what it would choose)."""
    rr = site.router.router_replay
    saved, training = rr.router_replay_action, site.router.training
    rr.router_replay_action = None
    site.router.eval()
    try:
        with torch.no_grad():
            _, routing_map = site.router(x)
    finally:
        rr.router_replay_action = saved
        site.router.train(training)
    return chosen_experts(routing_map, k)


def _train_step(model, filler, tokens):
    loss = _packed_forward(model, tokens, train=True)
    filler.replay_backward()
    loss.mean().backward()
    model.zero_grad(set_to_none=True)
    filler.clear()
    return loss.detach()


def test_records_equal_to_the_models_own_routing_count_no_flip(model, glm_layout):
    filler = ReplayFiller(model, glm_layout, measure=True)
    tokens = random_samples()
    own = _own_routing(model, filler, tokens)
    records = records_from_rows(glm_layout, tokens, own)
    filler.fill(records, tokens)
    _train_step(model, filler, tokens)
    h = filler.health()
    rows = sum(n - 1 for n in LENGTHS)
    assert h["r3/flip_rate"] == 0.0 and h["r3/tokens_with_flip"] == 0.0
    assert h["r3/pairs_flipped"] == 0 and h["r3/tokens_flipped"] == 0
    assert {k: v for k, v in h.items() if k.startswith("r3/flip_rate/layer_")} == {
        "r3/flip_rate/layer_1": 0.0, "r3/flip_rate/layer_2": 0.0, "r3/flip_rate/layer_3": 0.0}
    # Record rows only (one pad row per sample is not counted), each layer once: the backward's
    # activation recompute routes the same inputs again and is not counted twice.
    assert h["r3/rows_replayed"] == rows and h["r3/pairs_replayed"] == 3 * rows
    # The MTP router routed live, apart: every packed row of the one forward.
    assert h["r3/mtp/rows_routed"] == sum(LENGTHS) and h["r3/mtp/rows_routed/layer_4"] == sum(LENGTHS)
    # Read once per step: the next read starts from zero.
    assert filler.health()["r3/rows_replayed"] == 0


def test_flips_in_the_last_moe_layer_are_counted_exactly(model, glm_layout):
    """Layer 3 feeds no replayed router: its inputs, and so its own routing, are the R3-off ones."""
    filler = ReplayFiller(model, glm_layout, measure=True)
    tokens = random_samples()
    own = _own_routing(model, filler, tokens)
    rng = np.random.default_rng(0)
    record_rows = np.concatenate([np.arange(off, off + n - 1) for off, n in zip(np.cumsum([0] + LENGTHS[:-1]), LENGTHS)])
    flipped = rng.choice(record_rows, 6, replace=False)
    pad_rows = np.cumsum(LENGTHS) - 1  # a pad row replayed with other experts must not count
    changed = {**own, 3: perturb_rows(own[3], list(flipped) + list(pad_rows), 16)}
    filler.fill(records_from_rows(glm_layout, tokens, changed), tokens)
    _train_step(model, filler, tokens)
    h = filler.health()
    rows = sum(n - 1 for n in LENGTHS)
    assert h["r3/pairs_flipped"] == 6 and h["r3/tokens_flipped"] == 6
    assert h["r3/flip_rate/layer_3"] == pytest.approx(6 / rows)
    assert h["r3/flip_rate/layer_1"] == h["r3/flip_rate/layer_2"] == 0.0
    assert h["r3/flip_rate"] == pytest.approx(6 / (3 * rows)) and h["r3/tokens_with_flip"] == pytest.approx(6 / rows)


def _perturbed_everywhere(model, filler, layout, tokens, seed):
    own = _own_routing(model, filler, tokens)
    rng = np.random.default_rng(seed)
    S = sum(len(t) for t in tokens)
    changed = {lid: perturb_rows(rows, rng.choice(S, 5, replace=False), layout.num_experts) for lid, rows in own.items()}
    return records_from_rows(layout, tokens, changed)


def test_perturbed_records_in_every_layer_count_what_a_plain_count_finds(model, glm_layout):
    """Flips below change the inputs above: the oracle re-runs each router, replay off, on what it was given."""
    filler = ReplayFiller(model, glm_layout, measure=True)
    tokens = random_samples(seed=SEED + 1)
    records = _perturbed_everywhere(model, filler, glm_layout, tokens, seed=1)
    filler.fill(records, tokens)
    with _router_inputs(model, filler) as seen:
        _train_step(model, filler, tokens)
    h = filler.health()
    own = {s.layer_id: _own_sets_on(s, seen[s.layer_id][0], glm_layout.topk) for s in filler.decoder_sites}
    flips, tokens_flipped = count_flips(records, tokens, own, glm_layout)
    rows = sum(len(t) - 1 for t in tokens)
    assert sum(flips.values()) >= 10  # every layer's perturbations at least (not a vacuous zero)
    for lid in (1, 2, 3):
        assert h[f"r3/flip_rate/layer_{lid}"] == pytest.approx(flips[lid] / rows), lid
    assert h["r3/pairs_flipped"] == sum(flips.values()) and h["r3/tokens_flipped"] == tokens_flipped


def test_each_microbatch_of_a_schedule_is_measured_with_its_own_pad_rows(model, glm_layout):
    """fill_microbatches through Megatron's forward_backward_func: one binding per microbatch, in order."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    filler = ReplayFiller(model, glm_layout, measure=True)
    batches = [random_samples([6, 8], seed=50), random_samples([11], seed=51), random_samples([4, 5, 3], seed=52)]
    mbs = [(_perturbed_everywhere(model, filler, glm_layout, t, seed=60 + i), t) for i, t in enumerate(batches)]
    filler.fill_microbatches(mbs)
    data = iter([torch.cat(t) for t in batches])

    def forward_step(data_iterator, m):
        ids = next(data_iterator).reshape(1, -1)
        S = ids.shape[1]
        loss = m(ids, torch.arange(S)[None], causal_mask(S), labels=torch.roll(ids, -1, 1))
        return loss, lambda out: (out.mean(), {"loss": out.mean().detach()})

    model.train()
    with _router_inputs(model, filler) as seen:
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=data, model=[model], num_microbatches=len(mbs),
            seq_length=max(sum(len(x) for x in t) for t in batches), micro_batch_size=1, forward_only=False,
        )
        filler.finish()
    model.zero_grad(set_to_none=True)
    h = filler.health()
    flips, tokens_flipped = collections.Counter(), 0
    for m, (records, tokens) in enumerate(mbs):
        own = {s.layer_id: _own_sets_on(s, seen[s.layer_id][m], glm_layout.topk) for s in filler.decoder_sites}
        f, t = count_flips(records, tokens, own, glm_layout)
        flips += f
        tokens_flipped += t
    rows = sum(len(x) - 1 for t in batches for x in t)
    assert h["r3/rows_replayed"] == rows and h["r3/pairs_replayed"] == 3 * rows
    assert h["r3/pairs_flipped"] == sum(flips.values()) >= 15
    assert h["r3/tokens_flipped"] == tokens_flipped
    for lid in (1, 2, 3):
        assert h[f"r3/flip_rate/layer_{lid}"] == pytest.approx(flips[lid] / rows)


def test_measuring_changes_no_loss_and_no_gradient(model, glm_layout):
    tokens = random_samples(seed=SEED + 2)
    plain = ReplayFiller(model, glm_layout)
    records = _perturbed_everywhere(model, plain, glm_layout, tokens, seed=3)
    out = {}
    for measure in (False, True):
        filler = ReplayFiller(model, glm_layout, measure=measure)
        filler.fill(records, tokens)
        loss = _packed_forward(model, tokens, train=True)
        filler.replay_backward()
        loss.mean().backward()
        out[measure] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.zero_grad(set_to_none=True)
        filler.clear()
    assert torch.equal(out[False][0], out[True][0])
    assert out[False][1].keys() == out[True][1].keys()
    assert all(torch.equal(out[False][1][n], out[True][1][n]) for n in out[False][1])


def test_a_filler_without_measure_counts_nothing_and_says_health_needs_it(model, glm_layout):
    measuring = ReplayFiller(model, glm_layout, measure=True)
    tokens = random_samples(seed=SEED + 3)
    records = _perturbed_everywhere(model, measuring, glm_layout, tokens, seed=4)
    plain = ReplayFiller(model, glm_layout)  # the same routers; its fills disarm their meters
    plain.fill(records, tokens)
    _train_step(model, plain, tokens)
    assert measuring.health()["r3/pairs_replayed"] == 0
    with pytest.raises(ReplayError, match=r"measure=True"):
        plain.health()


# -- no host reads inside routers ---------------------------------------------------------------

def test_measuring_routers_read_nothing_back_to_the_host(model, glm_layout):
    """CPU stand-in for a GPU sync check: inside every router's call (hooks included) no host read is
    made by our code, and measuring adds none to what Megatron's router does itself (the same
    events with measure off). It cannot see a kernel's implicit sync; benchmarks/gpu_check.py counts those on CUDA
    with torch.cuda.set_sync_debug_mode."""
    tokens = random_samples(seed=SEED + 4)
    plain = ReplayFiller(model, glm_layout)
    records = _perturbed_everywhere(model, plain, glm_layout, tokens, seed=5)
    seen = {}
    for measure in (False, True):
        filler = ReplayFiller(model, glm_layout, measure=measure)
        filler.fill(records, tokens)
        with host_reads_inside_routers([s.router for s in filler.sites]) as events:
            _train_step(model, filler, tokens)
        seen[measure] = list(events)
        if measure:
            assert filler.health()["r3/pairs_flipped"] > 0  # it did measure
    assert [e for e in seen[True] if e[1]] == []  # none from sglang_r3 code (filler hooks, meters)
    assert collections.Counter(n for n, _ in seen[True]) == collections.Counter(n for n, _ in seen[False])
    assert seen[True] == []  # and megatron-core 0.16.1's router makes none on this path either


def test_the_counter_sees_a_host_read_planted_in_a_router(model, glm_layout):
    """The counting method above is not blind: a `.item()` in a router's hook is caught."""
    site = ReplayFiller(model, glm_layout).decoder_sites[0]

    def planted(module, args):
        float(args[0].sum().item())

    h = site.router.register_forward_pre_hook(planted)
    try:
        with host_reads_inside_routers([site.router]) as events:
            with torch.no_grad():
                site.router(torch.randn(5, 1, 64))
    finally:
        h.remove()
    assert ("item", False) in events and ("_local_scalar_dense", False) in events


# -- the same meter under a slime-style compute_topk --------------------------------------------


class SlimeStyleReplay:
    """Stand-in for slime's RoutingReplay (slime/utils/routing_replay.py at 624b824; slime is not
    installable here): rows recorded per router, popped in order by a compute_topk that slime's
    megatron patch puts where Megatron's compute_topk is defined; the stage from an env-like dict."""

    stage = {"ROUTING_REPLAY_STAGE": "fallthrough"}
    current = None

    def __init__(self):
        self.rows, self.forward_index = [], 0

    def pop_forward(self):
        r = self.rows[self.forward_index]
        self.forward_index += 1
        return r

    @classmethod
    def compute_topk(cls, old_compute_topk):
        def compute_topk(scores, topk, num_groups=None, group_topk=None):
            if cls.stage["ROUTING_REPLAY_STAGE"] == "replay_forward":
                ids = cls.current.pop_forward()
                return scores.gather(1, ids), ids
            return old_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)

        return compute_topk


class _SlimePatchedSite:
    """Where slime's patch sits: topk_routing_with_score_function builds compute_topk, slime wraps it.
    Megatron 0.16.1 reaches that spot through ``router_replay.get_replay_topk(..., _compute_topk)``,
    so this object stands in the router's router_replay slot and calls the wrapped function there."""

    router_replay_action = None  # read by the filler's row guard, which has nothing to do here

    def __init__(self, measured):
        self.measured = measured

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        wrapped = measured_compute_topk(
            SlimeStyleReplay.compute_topk(default_compute_topk), default_compute_topk,
            replaying=lambda: SlimeStyleReplay.stage["ROUTING_REPLAY_STAGE"] == "replay_forward",
        ) if self.measured else SlimeStyleReplay.compute_topk(default_compute_topk)
        return wrapped(scores, topk, num_groups, group_topk)


def test_a_slime_style_compute_topk_is_measured_through_the_same_meter(model, glm_layout):
    filler = ReplayFiller(model, glm_layout)
    tokens = random_samples(seed=SEED + 5)
    records = _perturbed_everywhere(model, filler, glm_layout, tokens, seed=6)
    packed = pack_rows([r.experts for r in records], glm_layout.num_experts)
    per_layer = packed.layer_tensors()
    meters, saved, hooks = [], {}, []
    book = None
    try:
        for s in filler.decoder_sites:
            meters.append(measure_router(s.router, s.layer_id))  # the reusable entry point: (router, layer_id)
            replay = SlimeStyleReplay()
            replay.rows = [per_layer[glm_layout.moe_layer_ids.index(s.layer_id)]]
            hooks.append(s.router.register_forward_pre_hook(
                lambda m, a, r=replay: setattr(SlimeStyleReplay, "current", r)))  # slime's register_routing_replay
            saved[s.path] = s.router.router_replay
            s.router.router_replay = _SlimePatchedSite(measured=True)
        book = HealthBook(meters)
        book.arm(True)
        book.start_fill()  # drops whatever an earlier fill left on these meters
        binding = book.binding(packed.real, torch.device("cpu"))
        for m in meters:
            m.push(binding)
        SlimeStyleReplay.stage["ROUTING_REPLAY_STAGE"] = "replay_forward"
        with _router_inputs(model, filler) as seen:
            with torch.no_grad():
                _packed_forward(model, tokens, train=False)
    finally:
        SlimeStyleReplay.stage["ROUTING_REPLAY_STAGE"] = "fallthrough"
        for h in hooks:
            h.remove()
        for s in filler.decoder_sites:
            if s.path in saved:
                s.router.router_replay = saved[s.path]
        if book is not None:
            book.arm(False)
    counts = book.read()
    own = {s.layer_id: _own_sets_on(s, seen[s.layer_id][0], glm_layout.topk) for s in filler.decoder_sites}
    flips, tokens_flipped = count_flips(records, tokens, own, glm_layout)
    assert counts.flipped == tuple(flips[lid] for lid in (1, 2, 3)) and sum(counts.flipped) >= 10
    assert counts.tokens_flipped == tokens_flipped and counts.rows == sum(len(t) - 1 for t in tokens)


# -- same weights: bf16 SGLang rollouts, fp32 trainer --------------------------------------------

BF16_FLAGS = ["--dtype", "bfloat16", "--disable-speculation", "--random-seed", "0"]


@pytest.fixture(scope="module")
def bf16_server():
    """The embedded model served in bf16 (what benchmarks.fidelity rolls out with);
    SGLANG_R3_TEST_URL_BF16 reuses a running one."""
    if url := os.environ.get("SGLANG_R3_TEST_URL_BF16"):
        yield url
        return
    from tests.support.servers import ServerProcess

    proc = ServerProcess(BF16_FLAGS).start()
    try:
        yield proc.wait_ready().url
    finally:
        proc.stop()


@pytest.mark.server
def test_live_figures_on_the_same_weights_equal_the_offline_ones_for_the_same_samples(bf16_server, glm_layout):
    """bf16 SGLang rollouts replayed into the fp32 converted model (benchmarks.fidelity's setup).

    Offline, as benchmarks.fidelity computes them: R3 off (routers choose) -> the first MoE layer's
    input does not depend on any replayed layer, so its live flips equal the offline ones exactly.
    Deeper layers see replayed layers below under R3; their offline counterpart is the same
    fidelity report on what each router chooses, replay off, from the inputs the replayed forward
    gave it -- equal for every layer and for tokens with a flip.
    """
    from benchmarks import fidelity as bench
    from megatron_cpu import converted_embedded_model
    from sglang_r3.trainer.diagnostics import fidelity_report, merge_reports

    rollouts = [bench.as_rollout(r) for r in bench.generate(bf16_server, 8, 32, seed=2)]
    model = converted_embedded_model()
    filler = ReplayFiller(model, glm_layout, measure=True)
    off = bench.trainer_pass(model, filler, rollouts, replay=False)
    offline_off = bench.routing_report(filler, glm_layout, rollouts, off)
    filler.health()  # R3 off measures nothing; start the step from zero
    with _router_inputs(model, filler) as seen:
        on = bench.trainer_pass(model, filler, rollouts, replay=True)
    counts = filler.health_counts()
    live = counts.metrics()
    assert bench.routing_report(filler, glm_layout, rollouts, on).flip_rate == 0.0  # R3 on: replayed exactly

    flips_off = {l.layer: l.tokens - l.agreeing for l in offline_off.layers}
    assert counts.layers == glm_layout.moe_layer_ids
    assert counts.flipped[0] == flips_off[counts.layers[0]]  # the first MoE layer: R3 off exactly
    reports = []
    for i, r in enumerate(rollouts):
        own = {s.layer_id: _own_sets_on(s, seen[s.layer_id][i], glm_layout.topk) for s in filler.decoder_sites}
        reports.append(fidelity_report([r.record], [r.tokens], own, glm_layout, weight_version=r.weight_version))
    offline_on = merge_reports(reports)
    assert offline_on.num_tokens == counts.rows == sum(len(r.tokens) - 1 for r in rollouts)
    assert counts.compared == tuple(l.tokens for l in offline_on.layers)
    assert counts.flipped == tuple(l.tokens - l.agreeing for l in offline_on.layers)
    assert counts.tokens_flipped == offline_on.tokens_flipped
    assert live["r3/flip_rate"] == pytest.approx(offline_on.flip_rate)
    assert live["r3/tokens_with_flip"] == pytest.approx(offline_on.token_flip_rate)
    assert live["r3/pairs_flipped"] > 0, "bf16 rollouts gave no flip at all: the comparison says nothing"
    print(f"\nsame weights, {len(rollouts)} bf16 rollouts: live flips per layer {counts.flipped} of "
          f"{counts.compared}, tokens {counts.tokens_flipped}/{counts.rows}; offline R3 off per layer "
          f"{tuple(flips_off.values())}, tokens {offline_off.tokens_flipped}/{offline_off.num_tokens}")
