"""End to end: records from the real embedded SGLang server replayed into a Megatron model shaped like it.

Uses the session fixture ``routing_server`` (base URL of the embedded server) from tests/conftest.py. The
expected routes come from outside the record path: SGLang's own upstream ``routed_experts`` of the same
responses, decoded here by its published contract (base64 of int32 ``[T-1, num_hidden_layers, topk]``),
against what megatron-core's own routers chose (forward hooks on its ``TopKRouter``s).
"""

from __future__ import annotations

import base64
import re

import numpy as np
import torch

from megatron_cpu import RouterSpy, forward_loss
from sglang_r3.trainer.client import RoutingClient
from sglang_r3.dev.embedded import EMBEDDED_CONFIG
from sglang_r3.core.record import token_digest
from sglang_r3.trainer import ReplayFiller


def _upstream_rows(meta_info, num_tokens: int) -> np.ndarray:
    """SGLang's ``meta_info["routed_experts"]`` by its published contract: [T-1, num_hidden_layers, topk] int32."""
    flat = np.frombuffer(base64.b64decode(meta_info["routed_experts"]), dtype=np.int32)
    return flat.reshape(num_tokens - 1, EMBEDDED_CONFIG["num_hidden_layers"], EMBEDDED_CONFIG["num_experts_per_tok"])


def test_megatron_decoder_routers_replay_the_servers_upstream_rows_and_mtp_routes_live(routing_server, gpt_mtp1, glm_layout):
    # JSON, so upstream's field is exactly what SGLang publishes (base64), beside our records.
    with RoutingClient(routing_server, binary=False) as client:
        layout = client.layout()
        assert layout == glm_layout and layout.fingerprint == glm_layout.fingerprint
        prompts = [[1, 5, 9, 13, 17, 21], [2, 4, 6, 8]]
        results = client.generate(input_ids=prompts, sampling_params={"max_new_tokens": 5, "temperature": 0},
                                  extra={"return_routed_experts": True})

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

    # Expected: upstream's rows of every MoE layer (layers from first_k_dense_replace on), the samples packed
    # one after the other, as the microbatch is; the last token of each sample has no row (it routed
    # nothing SGLang returned), and the forward routes it anyway: its row is not compared.
    upstream = [_upstream_rows(r.meta_info, r.num_tokens) for r in results]
    moe_layers = list(range(EMBEDDED_CONFIG["first_k_dense_replace"], EMBEDDED_CONFIG["num_hidden_layers"]))
    decoder = {int(m.group(1)): path for path in spy.seen if (m := re.fullmatch(r"decoder\.layers\.(\d+)\.mlp\.router", path))}
    assert sorted(decoder) == moe_layers
    starts = np.cumsum([0] + [r.num_tokens for r in results])
    for layer, path in decoder.items():
        chosen = spy.chosen(path).numpy()
        for i, rows in enumerate(upstream):
            got = chosen[starts[i]:starts[i] + len(rows)]
            assert np.array_equal(got, np.sort(rows[:, layer, :], axis=1)), (path, i)
    # MTP routers are not replayed: Megatron's own replay of each says no action.
    mtp = [m for n, m in gpt_mtp1.named_modules() if n.startswith("mtp.") and n.endswith(".router")]
    assert mtp and all(m.router_replay.router_replay_action is None for m in mtp)
