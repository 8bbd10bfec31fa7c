"""The zero-edit path: ``--custom-megatron-init-path sglang_r3.trainer.slime.install`` inside slime's own step.

slime is not on PyPI: ``slime_reference`` (RoutingReplay, compute_topk, the megatron.patch R3 hunks on the
installed megatron-core 0.16.1, slime's row preparation) and ``slime_actor_reference`` (initialize.init's hook
call, DataIterator, MegatronTrainRayActor.train_actor's order, model.py's forward_only / train_one_step /
train with its log_dict and logging_utils.log, the gpt_model hunk's mtp_kwargs) are stand-ins written from
THUDM/slime 624b824, registered under slime's module names so ``install`` patches them where it would patch
slime. Nothing in slime's stand-in is edited for R3: the hook is the only change.

Oracles: decoder routers must use the rows slime's own ``prepare_routed_experts_for_routing_replay`` gives
their layer for the microbatch slime's DataIterator yields; MTP routers must pick megatron's own top-k
(``topk_routing_with_score_function`` before the patch) of the input they saw; replay cursors are slime's
(``assert_all_consumed`` before slime's final ``clear_all``); logged health is a plain count of sets
against megatron's own top-k of what each router was given in the training forward.
"""

from __future__ import annotations

import collections
import os
import re

import numpy as np
import pytest
import torch

import slime_actor_reference as sar
import slime_reference as slime
from health_helpers import random_samples
from replay_helpers import synthetic_batch
from slime_actor_helpers import (  # noqa: F401  (fixtures)
    MICRO_BATCH_INDICES,
    NUM_MICROBATCHES,
    hf_checkpoints,
    slime_trainer,
    start_actor,
)
from slime_helpers import Spy, chosen, mtp_oracle, plain_counts, planted, slime_rows, upstream
from sglang_r3.trainer import slime as r3_slime
from sglang_r3.trainer.slime import SlimeInstallError, install
from sglang_r3.core.layout import layout_from_model_path
from sglang_r3.core.record import RecordError

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

# Samples 0..4; slime's schedule (micro_batch_indices) takes them out of order, two training steps.
LENGTHS = [5, 7, 9, 4, 6]


def rollout_data(samples_tokens, routed, indices=MICRO_BATCH_INDICES, steps=NUM_MICROBATCHES, **extra):
    """What slime/ray/rollout.py hands one data-parallel rank (its keys; per-sample lists)."""
    data = {
        "tokens": list(samples_tokens),
        "micro_batch_indices": [list(mb) for mb in indices],
        "num_microbatches": list(steps),
        "global_batch_sizes": [len(indices[0])] + [sum(len(m) for m in indices[1:])],
    }
    if routed is not None:
        data["rollout_routed_experts"] = list(routed)
    data.update(extra)
    return data


def in_slime_order(per_sample, indices=MICRO_BATCH_INDICES):
    return [[per_sample[i] for i in mb] for mb in indices]


@pytest.fixture
def cursors_at_clear_all(monkeypatch):
    """Every replay's (forward_index, backward_index, recorded) when train_actor reaches slime's clear_all()."""
    seen = []
    clear_all = slime.RoutingReplay.clear_all

    def recording():
        seen.append([(r.forward_index, r.backward_index, len(r.top_indices_list))
                     for r in slime.RoutingReplay.all_routing_replays])
        clear_all()

    monkeypatch.setattr(slime.RoutingReplay, "clear_all", staticmethod(recording))
    return seen


def phased_spy(actor) -> Spy:
    """Spy on every router; calls made inside this actor's compute_log_prob are phase "log_prob", the rest "train"."""
    spy = Spy(actor.model)
    spy.phase = "train"
    compute_log_prob = actor.compute_log_prob

    def phased(*args, **kwargs):
        spy.phase = "log_prob"
        try:
            return compute_log_prob(*args, **kwargs)
        finally:
            spy.phase = "train"

    actor.compute_log_prob = phased
    return spy


# -- the hook, as initialize.init calls it ------------------------------------------------------------------

HOOK_SAW = []


def user_init(args):
    """A user's own --custom-megatron-init-path function that calls install(args) from it (docs/slime.md)."""
    HOOK_SAW.append({
        "replays_registered": len(slime.RoutingReplay.all_routing_replays),
        "fill_before": sar.MegatronTrainRayActor.fill_routing_replay,
    })
    install(args)


def test_init_hook_installs_the_fill_on_slimes_class_before_the_model_is_built(slime_trainer, hf_checkpoints):
    slimes_own = sar.MegatronTrainRayActor.fill_routing_replay
    HOOK_SAW.clear()
    actor = start_actor(hf_checkpoints, 1, custom_megatron_init_path="test_slime_install.user_init")
    assert HOOK_SAW == [{"replays_registered": 0, "fill_before": slimes_own}]  # no router existed yet
    assert len(slime.RoutingReplay.all_routing_replays) == 4  # built after: 3 decoder MoE routers + 1 MTP
    ours = sar.MegatronTrainRayActor.fill_routing_replay
    assert ours is not slimes_own and ours._r3_slime_original is slimes_own
    assert type(actor).fill_routing_replay is ours  # train_actor's self.fill_routing_replay finds it on the class
    # Idempotent: a second init (slime's hook in another call, or the user's function and the flag) wraps
    # slime's own method again, never ours.
    install(actor.args)
    assert sar.MegatronTrainRayActor.fill_routing_replay._r3_slime_original is slimes_own
    assert not hasattr(sar.train_one_step, "_r3_slime_health")  # health was not asked for


def test_without_the_hook_slimes_own_fill_raises_the_seed_assertion(slime_trainer, hf_checkpoints):
    actor = start_actor(hf_checkpoints, 1, custom_megatron_init_path=None)
    layout = layout_from_model_path(hf_checkpoints[1])
    tokens = random_samples(LENGTHS, seed=3)
    routed = [torch.zeros((len(t) - 1, layout.num_hidden_layers, layout.topk), dtype=torch.int32) for t in tokens]
    with pytest.raises(AssertionError):
        actor.train_actor(0, rollout_data(tokens, routed))


# -- slime's step with the hook: 1 and 3 MTP layers, with and without --enable-mtp-training ---------------

def _upstream_arrays(layout, tokens, seed):
    recs, _ = synthetic_batch(layout, [len(t) for t in tokens], seed=seed)
    # synthetic_batch makes its own token ids; rebuild the records for ours (rows are what matters here).
    from sglang_r3.core.record import RoutingRecord, token_digest

    recs = [RoutingRecord(layout=r.layout, start=0, layers=r.layers, experts=r.experts, tokens_digest=token_digest(t))
            for r, t in zip(recs, tokens)]
    return recs, [upstream(r, layout) for r in recs]


@pytest.mark.parametrize("mtp_training", [False, True], ids=["no_mtp_training", "enable_mtp_training"])
@pytest.mark.parametrize("mtp_layers", [1, 3])
def test_train_actor_replays_decoder_rows_by_identity_and_mtp_routes_live(
    slime_trainer, hf_checkpoints, cursors_at_clear_all, mtp_layers, mtp_training
):
    actor = start_actor(hf_checkpoints, mtp_layers, seed=41 + mtp_layers, enable_mtp_training=mtp_training)
    layout = layout_from_model_path(hf_checkpoints[mtp_layers])
    tokens = random_samples(LENGTHS, seed=50 + mtp_layers)
    records, routed = _upstream_arrays(layout, tokens, seed=mtp_layers)
    data = rollout_data(tokens, routed)
    model = actor.model
    spy = phased_spy(actor)
    try:
        actor.train_actor(0, data)
    finally:
        spy.close()
    assert "rollout_routed_experts" not in data  # the fill dropped it, as slime's does

    mbs = list(zip(in_slime_order(records), in_slime_order(tokens)))  # what DataIterator yields, in order
    n = len(mbs)
    from sglang_r3.trainer.diagnostics import find_routers

    sites = find_routers(model, layout.num_hidden_layers)
    for s in (s for s in sites if not s.is_mtp):
        calls = spy.calls[(s.chunk, s.path)]
        # log-prob pass (eval), training forward, its recompute: each takes the microbatches in slime's order
        kinds = {"log_prob": [c for c in calls if c["phase"] == "log_prob"],
                 "forward": [c for c in calls if c["phase"] == "train" and not c["recompute"]],
                 "recompute": [c for c in calls if c["phase"] == "train" and c["recompute"]]}
        assert [len(v) for v in kinds.values()] == [n, n, n], s.describe()
        for kind, kind_calls in kinds.items():
            for m, (c, mb) in enumerate(zip(kind_calls, mbs)):
                assert np.array_equal(chosen(c), slime_rows(layout, mb, s.layer_id)), f"{s.describe()} {kind} {m}"
    mtp_sites = [s for s in sites if s.is_mtp]
    assert len(mtp_sites) == mtp_layers
    for s in mtp_sites:
        calls = spy.calls.get((s.chunk, s.path), [])
        # slime's gpt_model hunk: MTP runs only with mtp_kwargs, i.e. in the training forward (and its
        # recompute) with --enable-mtp-training; never in the log-prob pass.
        assert len(calls) == (2 * n if mtp_training else 0), s.describe()
        assert all(c["phase"] == "train" for c in calls)
        for c in calls:
            probs, routing_map = mtp_oracle(s.router, c)
            assert torch.equal(c["map"], routing_map), f"{s.describe()} recompute={c['recompute']}"
            torch.testing.assert_close(c["probs"], probs)

    # Every replay consumed exactly once by the training forward and once by its recompute; MTP replays unused.
    (at_clear,) = cursors_at_clear_all
    assert at_clear == [(n, n, n)] * 3 + [(0, 0, 0)] * mtp_layers
    assert all(r.top_indices_list == [] for r in slime.RoutingReplay.all_routing_replays)  # slime's clear_all ran

    # slime's per-step log: two steps; MTP losses per head with --enable-mtp-training; no r3 keys unasked.
    assert [d["train/step"] for d in sar.LOGGED] == [0, 1]
    for d in sar.LOGGED:
        mtp_keys = sorted(k for k in d if "mtp" in k)
        assert mtp_keys == (sorted([f"train/mtp_{i + 1}_loss" for i in range(mtp_layers)] + ["train/mtp_loss"])
                            if mtp_training else [])
        assert not any(k.startswith("train/r3/") for k in d)


def test_reused_log_probs_skip_the_log_prob_pass_and_every_replay_is_still_consumed_once(
    slime_trainer, hf_checkpoints, cursors_at_clear_all
):
    """One training step with kl_coef 0: slime's can_reuse_log_probs_in_loss skips compute_log_prob, so the
    training forward is the first replay_forward pass."""
    actor = start_actor(hf_checkpoints, 1, enable_mtp_training=True)
    layout = layout_from_model_path(hf_checkpoints[1])
    tokens = random_samples(LENGTHS, seed=60)
    _, routed = _upstream_arrays(layout, tokens, seed=60)
    actor.train_actor(0, rollout_data(tokens, routed, indices=[[0, 1, 2], [3, 4]], steps=[2]))
    assert cursors_at_clear_all == [[(2, 2, 2)] * 3 + [(0, 0, 0)]]


# -- live health in slime's training log --------------------------------------------------------------------

def run_step_with_health(actor, layout, tokens, seed, mtp_training):
    """slime's train_actor on records equal to the model's own routing with 4 planted flips per MoE layer and
    microbatch; returns, per training step, the counts megatron's own top-k of each training forward's router
    inputs gives (a plain count of sets), as the raw numbers the log's rates are made of."""
    model = actor.model[0]
    mbs = planted(model, layout, in_slime_order(tokens), seed=seed)
    per_sample = {}
    for mb_indices, (recs, _) in zip(MICRO_BATCH_INDICES, mbs):
        per_sample.update(zip(mb_indices, recs))
    routed = [upstream(per_sample[i], layout) for i in range(len(tokens))]
    spy = phased_spy(actor)
    try:
        actor.train_actor(0, rollout_data(tokens, routed))
    finally:
        spy.close()
    per_mb = plain_counts(model, layout, mbs, spy)
    steps = []
    for span in (slice(0, 1), slice(1, 3)):
        flips = sum((f for f, _ in per_mb[span]), collections.Counter())
        assert flips[layout.moe_layer_ids[0]] == 4 * len(mbs[span])  # the planted ones in the first MoE layer
        steps.append({
            "rows": sum(len(t) - 1 for _, ts in mbs[span] for t in ts),
            "flips": {lid: flips[lid] for lid in layout.moe_layer_ids},
            "tokens_flipped": sum(t for _, t in per_mb[span]),
            # MTP layers run in training forwards only with mtp_kwargs (slime's gpt_model hunk)
            "mtp_rows": sum(len(t) for _, ts in mbs[span] for t in ts) if mtp_training else 0,
        })
    return steps


def check_logged(d, want, layout):
    moe, mtp_ids = layout.moe_layer_ids, [l.id for l in layout.mtp_layers]
    rows, flipped = want["rows"], sum(want["flips"].values())
    assert d["train/r3/rows_replayed"] == rows and d["train/r3/pairs_replayed"] == len(moe) * rows
    assert d["train/r3/pairs_flipped"] == flipped and d["train/r3/tokens_flipped"] == want["tokens_flipped"]
    assert d["train/r3/flip_rate"] == pytest.approx(flipped / (len(moe) * rows))
    assert d["train/r3/tokens_with_flip"] == pytest.approx(want["tokens_flipped"] / rows)
    assert {k: v for k, v in d.items() if k.startswith("train/r3/flip_rate/layer_")} == pytest.approx(
        {f"train/r3/flip_rate/layer_{lid}": want["flips"][lid] / rows for lid in moe})
    assert d["train/r3/mtp/rows_routed"] == want["mtp_rows"] * len(mtp_ids)
    assert {k: v for k, v in d.items() if k.startswith("train/r3/mtp/rows_routed/")} == {
        f"train/r3/mtp/rows_routed/layer_{lid}": float(want["mtp_rows"]) for lid in mtp_ids}
    assert "train/loss" in d and "train/step" in d  # slime's own keys, in the same dict


@pytest.mark.parametrize("mtp_layers, mtp_training", [(1, False), (3, True)], ids=["mtp1", "mtp3_training"])
def test_health_opt_in_puts_each_steps_exact_counts_into_slimes_train_log(
    slime_trainer, hf_checkpoints, monkeypatch, mtp_layers, mtp_training
):
    monkeypatch.setenv(r3_slime.HEALTH_ENV, "1")
    actor = start_actor(hf_checkpoints, mtp_layers, seed=71 + mtp_layers, enable_mtp_training=mtp_training)
    assert sar.train_one_step._r3_slime_health  # model.train calls it by name
    layout = layout_from_model_path(hf_checkpoints[mtp_layers])
    want = run_step_with_health(actor, layout, random_samples(LENGTHS, seed=80 + mtp_layers), mtp_layers, mtp_training)
    assert [d["train/step"] for d in sar.LOGGED] == [0, 1]
    for d, w in zip(sar.LOGGED, want):
        check_logged(d, w, layout)


def _dp_rank(rank: int, port: int, results, checkpoint: str) -> None:
    import sys
    import traceback
    from pathlib import Path

    try:
        sys.path.insert(0, str(Path(__file__).parent))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ENABLE_ROUTING_REPLAY="1",
                          SGLANG_R3_HEALTH="1")
        from megatron_cpu import init_megatron_cpu

        init_megatron_cpu(rank=rank, world_size=2)  # data parallel 2
        import slime_actor_reference
        import slime_reference
        import test_slime_install as t

        slime_reference.install()
        slime_actor_reference.install_actor()
        actor = t.start_actor({1: checkpoint}, 1, seed=72, enable_mtp_training=True)  # same weights: DP replicas
        layout = layout_from_model_path(checkpoint)
        want = t.run_step_with_health(actor, layout, t.random_samples(t.LENGTHS, seed=300 + rank), 5 + rank, True)
        results.put((rank, want, list(slime_actor_reference.LOGGED)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def test_health_is_summed_over_data_parallel_ranks_in_the_logging_ranks_dict(hf_checkpoints):
    """2 gloo ranks, data parallel 2, each with its own samples: the dict slime logs (data-parallel rank 0)
    holds both ranks' counts; the other rank logs nothing (slime's logging-rank condition)."""
    import socket

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [ctx.Process(target=_dp_rank, args=(r, port, results, hf_checkpoints[1])) for r in range(2)]
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
    (want0, logged0), (want1, logged1) = got[0], got[1]
    assert logged1 == [] and len(logged0) == 2
    layout = layout_from_model_path(hf_checkpoints[1])
    for d, a, b in zip(logged0, want0, want1):
        assert a["flips"] != b["flips"] or a["tokens_flipped"] != b["tokens_flipped"]  # the ranks differ
        total = {"rows": a["rows"] + b["rows"], "tokens_flipped": a["tokens_flipped"] + b["tokens_flipped"],
                 "flips": {lid: a["flips"][lid] + b["flips"][lid] for lid in a["flips"]},
                 "mtp_rows": a["mtp_rows"] + b["mtp_rows"]}
        check_logged(d, total, layout)


# -- records with token digests (slime forwarding "metadata": docs/slime-forward-metadata.patch) -----------

def test_records_in_forwarded_metadata_are_checked_and_replayed(slime_trainer, hf_checkpoints, cursors_at_clear_all):
    """With the one-line upstream change (ray/rollout.py forwards "metadata"), each sample's record arrives in
    ``metadata[i]["r3_routing"]`` and the installed fill replays it, digest checked; swapped records fail."""
    actor = start_actor(hf_checkpoints, 1)
    layout = layout_from_model_path(hf_checkpoints[1])
    tokens = random_samples(LENGTHS, seed=90)
    records, _ = _upstream_arrays(layout, tokens, seed=90)
    metadata = [{"r3_routing": r.to_wire()} for r in records]
    data = rollout_data(tokens, None, metadata=metadata)
    spy = phased_spy(actor)
    try:
        actor.train_actor(0, data)  # through log_rollout_data too: the fill took the records out
    finally:
        spy.close()
    assert "metadata" not in data
    mbs = list(zip(in_slime_order(records), in_slime_order(tokens)))
    from sglang_r3.trainer.diagnostics import find_routers

    for s in (s for s in find_routers(actor.model, layout.num_hidden_layers) if not s.is_mtp):
        forward = [c for c in spy.calls[(s.chunk, s.path)] if c["phase"] == "train" and not c["recompute"]]
        assert len(forward) == len(mbs)
        for c, mb in zip(forward, mbs):
            assert np.array_equal(chosen(c), slime_rows(layout, mb, s.layer_id))
    assert cursors_at_clear_all[0][:3] == [(3, 3, 3)] * 3

    other = list(tokens)
    other[4] = tokens[4].flip(0)  # same length, other ids: sample 4's record does not belong to them
    with pytest.raises(RecordError, match=r"microbatch 1: sample 0: record was produced for a different token sequence"):
        actor.train_actor(1, rollout_data(other, None, metadata=metadata))
    # A user's own metadata stays, without the records.
    kept = rollout_data(tokens, None, metadata=[{**m, "source": i} for i, m in enumerate(metadata)])
    with pytest.raises(TypeError):  # slime 624b824's log_rollout_data cannot average dicts: the patch ignores the key
        actor.train_actor(1, kept)
    assert kept["metadata"] == [{"source": i} for i in range(len(tokens))]
    half = [dict(m) for m in metadata]
    del half[3]["r3_routing"]
    with pytest.raises(RecordError, match=r"4 of 5 samples carry a record in metadata\['r3_routing'\]"):
        actor.train_actor(1, rollout_data(tokens, None, metadata=half))


# -- what install does nothing for, and what it refuses --------------------------------------------------------

def test_nothing_is_installed_when_r3_is_off_or_the_actor_does_not_replay(slime_trainer, hf_checkpoints, monkeypatch):
    slimes_own = sar.MegatronTrainRayActor.fill_routing_replay
    assert install(sar.default_args(use_rollout_routing_replay=False, hf_checkpoint=None)) is None
    monkeypatch.delenv("ENABLE_ROUTING_REPLAY")  # slime's critic role
    assert install(sar.default_args(hf_checkpoint=hf_checkpoints[1], mtp_num_layers=1)) is None
    assert sar.MegatronTrainRayActor.fill_routing_replay is slimes_own


def _slime_log(capsys, start) -> str:
    """What slime's log shows (its configure_logger: the root logger at INFO, on stderr) while ``start`` runs."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    capsys.readouterr()
    try:
        sar.configure_logger()
        start()
    finally:
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
    return capsys.readouterr().err


def test_slimes_log_says_r3_is_off_and_nothing_was_installed(slime_trainer, hf_checkpoints, capsys, monkeypatch):
    slimes_own = sar.MegatronTrainRayActor.fill_routing_replay
    log = _slime_log(capsys, lambda: start_actor(hf_checkpoints, 1, use_rollout_routing_replay=False))
    ours = [line for line in log.splitlines() if "R3 (slime)" in line]
    assert len(ours) == 1, log
    assert re.search(r"\] installer\.py:\d+$", ours[0].split(" - ", 1)[0]), ours[0]  # slime's format
    assert ours[0].split(" - ", 1)[1] == (
        "R3 (slime): off, --use-rollout-routing-replay was not given: sglang-r3 installed nothing and slime trains "
        "without routing replay. Add --use-rollout-routing-replay to replay the rollout's routing (or drop "
        "--custom-megatron-init-path sglang_r3.trainer.slime.install)")
    assert sar.MegatronTrainRayActor.fill_routing_replay is slimes_own
    # Installed: slime's log says what replays (and the critic, which slime does not replay in, says why not).
    log = _slime_log(capsys, lambda: start_actor(hf_checkpoints, 1))
    assert re.search(r"R3 \(slime\): MegatronTrainRayActor\.fill_routing_replay replays \d+ decoder MoE layers", log)
    monkeypatch.delenv("ENABLE_ROUTING_REPLAY")  # slime's critic role
    log = _slime_log(capsys, lambda: install(sar.default_args(hf_checkpoint=hf_checkpoints[1], mtp_num_layers=1)))
    assert "R3 (slime): ENABLE_ROUTING_REPLAY is not 1 in this actor" in log and "nothing installed here" in log


@pytest.mark.parametrize("case", [
    "router_fusion", "sinkhorn", "capacity_factor", "no_hf_checkpoint", "mtp_count", "no_class", "no_method",
    "other_signature", "no_slime", "health_without_train_one_step", "health_without_compute_topk",
])
def test_install_refuses_naming_what_is_missing(slime_trainer, hf_checkpoints, monkeypatch, case):
    kw = dict(hf_checkpoint=hf_checkpoints[1], mtp_num_layers=1)
    if case == "router_fusion":
        kw["moe_router_fusion"] = True
        match = r"--moe-router-fusion: megatron-core's fused top-k .* returns before compute_topk"
    elif case == "sinkhorn":
        kw["moe_router_load_balancing_type"] = "sinkhorn"
        match = r"--moe-router-load-balancing-type sinkhorn"
    elif case == "capacity_factor":
        kw["moe_expert_capacity_factor"] = 1.0
        match = r"--moe-expert-capacity-factor: token dropping"
    elif case == "no_hf_checkpoint":
        kw["hf_checkpoint"] = None
        match = r"--hf-checkpoint is not set"
    elif case == "mtp_count":
        kw["mtp_num_layers"] = None
        match = r"--mtp-num-layers 0: slime builds 0 MTP layer\(s\), but --hf-checkpoint .* has 1"
    elif case == "no_class":
        monkeypatch.delattr(sar, "MegatronTrainRayActor")
        match = r"slime\.backends\.megatron_utils\.actor has no MegatronTrainRayActor"
    elif case == "no_method":
        monkeypatch.delattr(sar.MegatronTrainRayActor, "fill_routing_replay")
        match = r"MegatronTrainRayActor has no fill_routing_replay\('self', 'data_iterator'"
    elif case == "other_signature":
        monkeypatch.setattr(sar.MegatronTrainRayActor, "fill_routing_replay", lambda self, rollout_data: None)
        match = r"MegatronTrainRayActor\.fill_routing_replay takes \('self', 'rollout_data'\)"
    elif case == "no_slime":
        for name in sar.MODULE_NAMES + ("slime", "slime.utils", "slime.utils.routing_replay"):
            monkeypatch.setitem(sys_modules(), name, None)  # None in sys.modules: the import fails
        match = r"slime\.backends\.megatron_utils\.actor does not import"
    elif case == "health_without_train_one_step":
        monkeypatch.setenv(r3_slime.HEALTH_ENV, "1")
        monkeypatch.delattr(sar, "train_one_step")
        match = r"slime\.backends\.megatron_utils\.model has no train_one_step"
    else:
        monkeypatch.setenv(r3_slime.HEALTH_ENV, "1")
        monkeypatch.delattr(slime, "get_routing_replay_compute_topk")
        match = r"SGLANG_R3_HEALTH=1: measure=True needs slime\.utils\.routing_replay\.get_routing_replay_compute_topk"
    before = getattr(sar, "MegatronTrainRayActor", None)
    before_fill = getattr(before, "fill_routing_replay", None)
    with pytest.raises(SlimeInstallError, match=r"^sglang-r3 cannot install its R3 fill into slime \(" + r".*" + match):
        install(sar.default_args(**kw))
    if before is not None:
        assert getattr(before, "fill_routing_replay", None) is before_fill  # nothing half-installed
    assert not hasattr(sar.train_one_step, "_r3_slime_health") if hasattr(sar, "train_one_step") else True
    factory = getattr(slime, "get_routing_replay_compute_topk", None)
    assert not getattr(factory, "_r3_measuring", False)  # slime's compute_topk factory is not wrapped either


def test_several_problems_are_named_together(slime_trainer, hf_checkpoints):
    with pytest.raises(SlimeInstallError) as e:
        install(sar.default_args(hf_checkpoint=hf_checkpoints[1], mtp_num_layers=3, moe_router_fusion=True))
    assert "--moe-router-fusion" in str(e.value) and "--mtp-num-layers 3" in str(e.value)


def sys_modules():
    import sys

    return sys.modules
