"""The converter gives Megatron SGLang's weights: same logprobs, same routing, token for token.

Oracle: the real fp32 SGLang server (``nospec_server``) serving the embedded checkpoint. Megatron's
side is the checkpoint loaded by ``tests/trainer/convert.py`` with no replay active, so its routers
compute their own top-k; a forward hook reads what they chose.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from megatron_cpu import RouterSpy, causal_mask, converted_embedded_model
from sglang_r3.trainer.client import RoutingClient
from sglang_r3.trainer import ReplayFiller
from sglang_r3.trainer.diagnostics import merge_mtp_agreements, mtp_draft_agreement
from tests.trainer.convert import ConversionError, GlmMoeConfig, megatron_state_from_hf, read_safetensors

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

PROMPTS = [[1, 5, 9, 13, 17, 21], [2, 4, 6, 8, 10], [200, 3, 77, 140, 9, 31, 64]]
NEW_TOKENS = 10
LOGPROB_TOL = 1e-4


def sglang_logprobs(result) -> np.ndarray:
    """log p(token t | tokens < t) for t = 1..T-1, as SGLang computed them while serving."""
    meta = result.meta_info
    prompt = [lp for lp, *_ in meta["input_token_logprobs"]]
    assert prompt[0] is None  # the first token has no context
    return np.array(prompt[1:] + [lp for lp, *_ in meta["output_token_logprobs"]], dtype=np.float64)


def megatron_logprobs(model, tokens: torch.Tensor) -> np.ndarray:
    """Teacher-forced log p(token t | tokens < t), t = 1..T-1, from Megatron's per-token loss."""
    ids = tokens.reshape(1, -1)
    S = ids.shape[1]
    model.eval()
    with torch.no_grad():
        loss = model(ids, torch.arange(S)[None], causal_mask(S), labels=torch.roll(ids, -1, 1))
    return -loss[0, :-1].double().numpy()  # the last position's label wrapped around


@pytest.fixture(scope="module")
def served(nospec_server, glm_layout):
    with RoutingClient(nospec_server) as client:
        assert client.layout() == glm_layout
        return client.generate(
            input_ids=PROMPTS,
            sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 1.0},
            extra={"return_logprob": True, "logprob_start_len": 0},
        )


def test_megatron_fp32_forward_reproduces_sglang_fp32_logprobs(served):
    model = converted_embedded_model()
    worst = 0.0
    for r in served:
        mine, theirs = megatron_logprobs(model, torch.tensor(r.tokens)), sglang_logprobs(r)
        assert mine.shape == theirs.shape == (r.num_tokens - 1,)
        worst = max(worst, float(np.abs(mine - theirs).max()))
    assert worst <= LOGPROB_TOL, f"max |logprob difference| {worst:.3g} > {LOGPROB_TOL}"


def test_megatron_routers_without_replay_choose_sglangs_captured_experts(served, glm_layout):
    model = converted_embedded_model()
    filler = ReplayFiller(model, glm_layout, weight_version=served[0].weight_version)
    filler.clear()  # no replay: routers compute their own routing
    for r in served:
        spy = RouterSpy(model)
        try:
            megatron_logprobs(model, torch.tensor(r.tokens))
        finally:
            spy.close()
        rows = r.record.num_tokens
        for site in filler.decoder_sites:
            col = glm_layout.moe_layer_ids.index(site.layer_id)
            mine = spy.chosen(site.path).numpy()[:rows]  # the last token's routing is not captured
            theirs = np.sort(r.record.experts[:, col, :].astype(np.int64), axis=1)
            differ = np.flatnonzero((mine != theirs).any(axis=1))
            assert differ.size == 0, (
                f"layer {site.layer_id}: Megatron routed rows {differ.tolist()} differently from SGLang"
            )


def test_mtp_drafts_over_verified_tokens_route_as_the_trainers_live_mtp_router(routing_server, glm_layout):
    """Step-0 drafts (draft-extend over verified tokens, on the target's hidden states) have exactly the
    inputs of Megatron's MTP layer; with the same weights they must pick the same experts."""
    with RoutingClient(routing_server) as client:
        results = client.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 12, "temperature": 0}, mtp=True)
    model = converted_embedded_model()
    filler = ReplayFiller(model, glm_layout)
    (mtp_site,) = filler.mtp_sites
    parts = []
    for r in results:
        filler.fill([r.record], [r.tokens])  # decoder replayed, as in training; the MTP router is live
        spy = RouterSpy(model)
        try:
            megatron_logprobs(model, torch.tensor(r.tokens))
        finally:
            spy.close()
            filler.clear()
        parts.append(mtp_draft_agreement(r.record.mtp, r.tokens, spy.chosen(mtp_site.path)))
    agreement = merge_mtp_agreements(parts)
    steps = {s: n for s, _, n in agreement.by_step}
    assert steps.get(0, 0) >= sum(r.prompt_len for r in results) - len(results)  # every verified prompt slot
    assert agreement.per_step[0] == 1.0, agreement


def test_converter_refuses_a_checkpoint_megatron_cannot_represent(tmp_path):
    from sglang_r3.dev.embedded import ensure_embedded_model

    path = ensure_embedded_model()
    cfg = json.loads((path / "config.json").read_text())
    with pytest.raises(ConversionError, match="norm_topk_prob false"):
        GlmMoeConfig.from_hf({**cfg, "norm_topk_prob": False})
    with pytest.raises(ConversionError, match="n_group 8 / topk_group 4"):
        GlmMoeConfig.from_hf({**cfg, "n_group": 8, "topk_group": 4})
    glm = GlmMoeConfig.from_hf(cfg)
    weights = read_safetensors(path)
    # GLM's NextN layer keeps its own copy of the embedding; Megatron's MTP shares the main one.
    changed = {**weights, "model.layers.4.embed_tokens.weight": weights["model.embed_tokens.weight"] + 1}
    with pytest.raises(ConversionError, match=r"model\.layers\.4\.embed_tokens\.weight differs"):
        megatron_state_from_hf(glm, changed)
    with pytest.raises(ConversionError, match=r"no place in the Megatron model: \['model\.layers\.9\.extra'\]"):
        megatron_state_from_hf(glm, {**weights, "model.layers.9.extra": torch.zeros(1)})
    missing = {k: v for k, v in weights.items() if k != "model.layers.2.mlp.gate.e_score_correction_bias"}
    with pytest.raises(ConversionError, match="e_score_correction_bias"):
        megatron_state_from_hf(glm, missing)
