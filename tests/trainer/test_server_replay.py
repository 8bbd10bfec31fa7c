"""End to end: records from the real embedded SGLang server replayed into a Megatron model shaped like it.

Uses the session fixture ``routing_server`` (base URL of the embedded server) from tests/conftest.py.
"""

from __future__ import annotations

import numpy as np
import torch

from megatron_cpu import RouterSpy, forward_loss
from sglang_r3.client import RoutingClient
from sglang_r3.trainer import ReplayFiller, pack_rows


def test_seed_001_real_server_records_replay_into_megatron(routing_server, gpt_mtp1, glm_layout):
    with RoutingClient(routing_server) as client:
        layout = client.layout()
        assert layout == glm_layout and layout.fingerprint == glm_layout.fingerprint
        prompts = [[1, 5, 9, 13, 17, 21], [2, 4, 6, 8]]
        results = client.generate(input_ids=prompts, sampling_params={"max_new_tokens": 5, "temperature": 0})

    records = [r.record for r in results]
    tokens = [torch.tensor(r.tokens) % 128 for r in results]  # the Megatron test model has a 128-token vocab
    for r in results:
        assert r.record.num_tokens == r.num_tokens - 1 and r.record.layout == layout.fingerprint

    filler = ReplayFiller(gpt_mtp1, layout)
    filler.fill(records, tokens)
    spy = RouterSpy(gpt_mtp1)
    try:
        loss = forward_loss(gpt_mtp1, torch.cat(tokens), train=True)
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
