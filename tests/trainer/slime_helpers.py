"""A slime training process on real megatron-core for the slime tests (test_slime_integration.py,
test_slime_health.py, test_slime_install.py): GLM-style models built as slime's actor builds them with
ENABLE_ROUTING_REPLAY=1 (the ``slime_process`` fixture, and ``clean_slime_state``, autouse where imported), records
in upstream SGLang's int32 form and slime's own preparation of them, a spy on every router call, megatron's own
top-k of what a router saw, and records with flips planted against a model's own routing.
"""

from __future__ import annotations

import os
from typing import Dict, List

import numpy as np
import pytest
import torch

import slime_reference as slime
from health_helpers import chosen_experts, count_flips, perturb_rows, records_from_rows
from megatron_cpu import TinyMoeSpec, build_gpt, causal_mask, routers
from sglang_r3.trainer.diagnostics import find_routers

STAGE = "ROUTING_REPLAY_STAGE"
GLM_STYLE = dict(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                 moe_router_topk_scaling_factor=2.5)
RECOMPUTE = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def build_slime_model(mtp_layers: int, recompute: bool, seed: int, virtual: int = None, **overrides):
    """A GLM-style model built as slime's actor builds it; returns (model, the replays it registered).
    virtual: that many model chunks (virtual pipeline stages), returned as slime's list of chunks."""
    slime.RoutingReplay.all_routing_replays = []
    spec = TinyMoeSpec(mtp_layers=mtp_layers, routing_replay=False)
    kw = {**GLM_STYLE, **(RECOMPUTE if recompute else {}), **overrides}
    if virtual:
        model = [build_gpt(spec, seed=seed, vp_stage=v, virtual_pipeline_model_parallel_size=virtual, **kw)
                 for v in range(virtual)]
    else:
        model = build_gpt(spec, seed=seed, **kw)
    g = torch.Generator().manual_seed(seed)
    for chunk in chunks_of(model):
        for _, r in routers(chunk):  # a trained GLM's bias moves the top-k; zeros would hide a missing bias
            r.expert_bias.copy_(torch.randn(r.expert_bias.shape, generator=g) * 0.05)
    return model, list(slime.RoutingReplay.all_routing_replays)


@pytest.fixture(scope="module")
def slime_process(megatron_cpu):
    undo = slime.install()
    saved = {k: os.environ.get(k) for k in ("ENABLE_ROUTING_REPLAY", STAGE)}
    os.environ["ENABLE_ROUTING_REPLAY"] = "1"  # slime/ray/actor_group.py sets it for R3 actors
    models: Dict[tuple, tuple] = {}

    def get(mtp_layers: int, recompute: bool = False):
        key = (mtp_layers, recompute)
        if key not in models:
            models[key] = build_slime_model(mtp_layers, recompute, seed=31 + 10 * mtp_layers + recompute)
        model, replays = models[key]
        slime.RoutingReplay.all_routing_replays = replays  # one model per slime process
        return model

    try:
        yield get
    finally:
        undo()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(autouse=True)
def clean_slime_state():
    """Each test ends with no replay stage set, slime's replays cleared and Megatron's layer-wise tracker empty."""
    yield
    os.environ.pop(STAGE, None)
    if slime.RoutingReplay.all_routing_replays:
        slime.RoutingReplay.clear_all()
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    get_moe_layer_wise_logging_tracker().clear()


def upstream(record, layout) -> torch.Tensor:
    """The record as upstream SGLang returns it and slime stores it: int32 [T-1, num_layers, topk], dense 0."""
    out = torch.zeros((record.num_tokens, layout.num_hidden_layers, layout.topk), dtype=torch.int32)
    out[:, list(record.layers)] = torch.from_numpy(record.experts.astype(np.int32))
    return out


def slime_rows(layout, microbatch, layer_id) -> np.ndarray:
    """slime's own preparation of the microbatch (cp_utils.py), the layer's column, ids sorted per row."""
    records, tokens = microbatch
    x = slime.prepare_routed_experts_for_routing_replay(
        [upstream(r, layout) for r in records], tokens, num_experts=layout.num_experts
    )
    return np.sort(x[:, layer_id].numpy(), axis=1)


def chunks_of(model) -> list:
    return list(model) if isinstance(model, (list, tuple)) else [model]


class Spy:
    """Per router call, keyed by (chunk, path): pass, whether it ran inside autograd's backward (a
    recompute), input, output."""

    def __init__(self, model):
        self.phase = None
        self.calls: Dict[tuple, List[dict]] = {}
        self._handles = [
            r.register_forward_hook(self._hook((c, n)))
            for c, chunk in enumerate(chunks_of(model)) for n, r in routers(chunk)
        ]

    def _hook(self, name):
        def hook(module, args, output):
            probs, routing_map = output
            self.calls.setdefault(name, []).append({
                "phase": self.phase,
                "recompute": torch._C._current_graph_task_id() != -1,
                "x": args[0].detach().clone(),
                "probs": probs.detach().clone(),
                "map": routing_map.detach().clone(),
            })

        return hook

    def close(self):
        for h in self._handles:
            h.remove()


def chosen(call) -> np.ndarray:
    m = call["map"]
    k = int(m.sum(dim=1)[0])
    return torch.sort(torch.nonzero(m)[:, 1].reshape(-1, k), dim=1).values.numpy()


def mtp_oracle(router, call):
    """megatron's own routing (before slime's patch) of the input this MTP router saw in that forward."""
    cfg = router.config
    with torch.no_grad():
        logits = router.gating(call["x"]).view(-1, cfg.num_moe_experts)
        probs, routing_map = slime.ORIGINAL_TOPK_ROUTING(
            logits, router.topk, use_pre_softmax=cfg.moe_router_pre_softmax, num_groups=cfg.moe_router_num_groups,
            group_topk=cfg.moe_router_group_topk, scaling_factor=cfg.moe_router_topk_scaling_factor,
            score_function=router.score_function, expert_bias=router.expert_bias, fused=False, router_replay=None,
        )
    return probs, routing_map


def packed_inputs(tokens):
    """One microbatch as slime feeds it with THD packing: samples back to back, each attending to itself
    (positions from 0 per sample), so a sample's pad row reaches no other row's router."""
    ids = torch.cat(tokens).reshape(1, -1)
    S = ids.shape[1]
    sample = torch.repeat_interleave(torch.arange(len(tokens)), torch.tensor([len(t) for t in tokens]))
    mask = causal_mask(S) | (sample[:, None] != sample[None, :])[None, None]
    pos = torch.cat([torch.arange(len(t)) for t in tokens]).reshape(1, S)
    return ids, pos, mask


def decoder_sites(model, layout):
    return [s for s in find_routers(model, layout.num_hidden_layers) if not s.is_mtp]


def own_routing(model, layout, batches):
    """Per microbatch: layer id -> [S, topk], what each decoder router picks in a train-mode forward
    with nothing replayed (slime's fallthrough stage)."""
    sites = decoder_sites(model, layout)
    out = []
    os.environ[STAGE] = "fallthrough"
    spy = Spy(model)
    try:
        model.train()
        with torch.no_grad():
            for tokens in batches:
                ids, pos, mask = packed_inputs(tokens)
                model(ids, pos, mask, labels=torch.roll(ids, -1, 1))
    finally:
        spy.close()
        os.environ.pop(STAGE, None)
    for m in range(len(batches)):
        out.append({s.layer_id: chosen_experts(spy.calls[(s.chunk, s.path)][m]["map"], layout.topk) for s in sites})
    return out


def planted(model, layout, batches, seed, per_layer=4):
    """Records equal to the model's own routing but in ``per_layer`` record rows of every MoE layer, where
    one expert is swapped for one outside the set (a flip planted in each layer of each microbatch)."""
    rng = np.random.default_rng(seed)
    out = []
    for tokens, own in zip(batches, own_routing(model, layout, batches)):
        offs = np.cumsum([0] + [len(t) for t in tokens[:-1]])
        record_rows = np.concatenate([np.arange(o, o + len(t) - 1) for o, t in zip(offs, tokens)])
        changed = {lid: perturb_rows(rows, rng.choice(record_rows, per_layer, replace=False), layout.num_experts)
                   for lid, rows in own.items()}
        out.append((records_from_rows(layout, tokens, changed), tokens))
    return out


def plain_counts(model, layout, microbatches, spy):
    """Per microbatch (flips per layer, tokens with a flip), by megatron's own top-k of what each decoder
    router was given in the training forward (not its recompute), against the records, counted with sets."""
    out = []
    for m, (records, tokens) in enumerate(microbatches):
        own = {}
        for s in decoder_sites(model, layout):
            calls = [c for c in spy.calls[(s.chunk, s.path)] if c["phase"] == "train" and not c["recompute"]]
            _, routing_map = mtp_oracle(s.router, calls[m])  # megatron's own routing of that input
            own[s.layer_id] = chosen_experts(routing_map, layout.topk)
        out.append(count_flips(records, tokens, own, layout))
    return out
