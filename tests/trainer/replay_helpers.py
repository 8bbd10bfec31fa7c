"""Test helpers: the embedded layout, layout variants, synthetic records."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang_r3.core.layout import ROLE_MTP, LayerInfo, ModelLayout
from sglang_r3.core.record import RoutingRecord, token_digest


def embedded_layout() -> ModelLayout:
    from sglang_r3.dev.embedded import ensure_embedded_model
    from sglang_r3.core.layout import layout_from_model_path

    return layout_from_model_path(str(ensure_embedded_model()))


def with_mtp(layout: ModelLayout, n: int) -> ModelLayout:
    """The same decoder with n MoE MTP layers (like MiMo's 3 heads, but routed)."""
    decoder = [l for l in layout.layers if l.role != ROLE_MTP]
    E, k = layout.num_experts, layout.topk
    L = layout.num_hidden_layers
    mtp = [LayerInfo(L + j, ROLE_MTP, j + 1, E, k) for j in range(n)]
    return ModelLayout(layout.architecture, L, tuple(decoder + mtp))


def replace_layer(layout: ModelLayout, layer_id: int, **changes) -> ModelLayout:
    layers = [dataclasses.replace(l, **changes) if l.id == layer_id else l for l in layout.layers]
    return ModelLayout(layout.architecture, layout.num_hidden_layers, tuple(layers))


def synthetic_tokens(num_tokens: int, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    """A sample's token ids (prompt + completion), inside the Megatron test model's 128-token vocab."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, vocab, (num_tokens,), generator=g)


def synthetic_record(
    layout: ModelLayout,
    num_tokens: int,
    seed: int = 0,
    tokens: Optional[torch.Tensor] = None,
    weight_version: Optional[str] = None,
) -> RoutingRecord:
    """Rows for a sample of num_tokens tokens: distinct random experts per row and layer.

    The record carries the digest of ``tokens`` (default: ``synthetic_tokens(num_tokens, seed)``), as
    the server's records carry the digest of the sample they were routed for.
    """
    rng = np.random.default_rng(seed)
    n, L, k, E = num_tokens - 1, len(layout.moe_layer_ids), layout.topk, layout.num_experts
    experts = np.stack([rng.permutation(E)[:k] for _ in range(n * L)]).reshape(n, L, k) if n else np.zeros((0, L, k))
    ids = synthetic_tokens(num_tokens, seed) if tokens is None else tokens
    return RoutingRecord(
        layout=layout.fingerprint,
        start=0,
        layers=layout.moe_layer_ids,
        experts=experts.astype(layout.expert_dtype),
        weight_version=weight_version,
        tokens_digest=token_digest(ids),
    )


def synthetic_sample(layout: ModelLayout, num_tokens: int, seed: int = 0, **kw) -> Tuple[RoutingRecord, torch.Tensor]:
    """(record, token ids) of one sample."""
    return synthetic_record(layout, num_tokens, seed, **kw), synthetic_tokens(num_tokens, seed)


def synthetic_batch(
    layout: ModelLayout, lengths: Sequence[int], seed: int = 0, **kw
) -> Tuple[List[RoutingRecord], List[torch.Tensor]]:
    """(records, token ids) of a microbatch: sample i has lengths[i] tokens."""
    pairs = [synthetic_sample(layout, T, seed + i, **kw) for i, T in enumerate(lengths)]
    return [r for r, _ in pairs], [t for _, t in pairs]
