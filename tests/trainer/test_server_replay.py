"""End to end: records from the real embedded SGLang server replayed into a Megatron model shaped like it.

Uses the session fixture ``routing_server`` (base URL of the embedded server) from tests/conftest.py.
"""

from __future__ import annotations

import numpy as np
import torch

from megatron_cpu import RouterSpy, forward_loss
from sglang_r3.client import RoutingClient
from sglang_r3.record import token_digest
from sglang_r3.trainer import ReplayFiller, pack_rows


def test_seed_001_real_server_records_replay_into_megatron(routing_server, gpt_mtp1, glm_layout):
    with RoutingClient(routing_server) as client:
        layout = client.layout()
        assert layout == glm_layout and layout.fingerprint == glm_layout.fingerprint
        prompts = [[1, 5, 9, 13, 17, 21], [2, 4, 6, 8]]
        results = client.generate(input_ids=prompts, sampling_params={"max_new_tokens": 5, "temperature": 0})

    records = [r.record for r in results]
    tokens = [torch.tensor(r.tokens) for r in results]
    for r in results:
        assert r.record.num_tokens == r.num_tokens - 1 and r.record.layout == layout.fingerprint
        # The server tags each record with the sample it routed and the weights that routed it.
        assert r.record.tokens_digest == token_digest(r.tokens)
        assert r.record.weight_version is not None and r.record.weight_version == r.weight_version

    # The records prove they belong to these samples and these weights; the filler checks both.
    filler = ReplayFiller(gpt_mtp1, layout, weight_version=results[0].weight_version)
    filler.fill(records, tokens)
    spy = RouterSpy(gpt_mtp1)
    try:
        # The Megatron test model has a 128-token vocab; the records' digests are of the real ids.
        loss = forward_loss(gpt_mtp1, torch.cat(tokens) % 128, train=True)
        filler.replay_backward()
        loss.mean().backward()
    finally:
        spy.close()
        filler.clear()

    packed = pack_rows([r.experts for r in records], layout.num_experts)
    for site in filler.decoder_sites:
        col = layout.moe_layer_ids.index(site.layer_id)
        assert np.array_equal(spy.chosen(site.path).numpy(), np.sort(packed.experts[:, col, :], axis=1))
    (mtp,) = filler.mtp_sites
    assert mtp.router.router_replay.router_replay_action is None
