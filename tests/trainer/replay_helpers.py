"""Test helpers: the embedded layout, layout variants, synthetic records."""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

import numpy as np

from sglang_r3.layout import ROLE_MTP, LayerInfo, ModelLayout
from sglang_r3.record import RoutingRecord


def embedded_layout() -> ModelLayout:
    from sglang_r3.embedded import ensure_embedded_model
    from sglang_r3.layout import layout_from_model_path

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


def synthetic_record(layout: ModelLayout, num_tokens: int, seed: int = 0) -> RoutingRecord:
    """Rows for a sample of num_tokens tokens: distinct random experts per row and layer."""
    rng = np.random.default_rng(seed)
    n, L, k, E = num_tokens - 1, len(layout.moe_layer_ids), layout.topk, layout.num_experts
    experts = np.stack([rng.permutation(E)[:k] for _ in range(n * L)]).reshape(n, L, k) if n else np.zeros((0, L, k))
    return RoutingRecord(
        layout=layout.fingerprint,
        start=0,
        layers=layout.moe_layer_ids,
        experts=experts.astype(layout.expert_dtype),
    )


def synthetic_batch(layout: ModelLayout, lengths: Sequence[int], seed: int = 0) -> List[RoutingRecord]:
    return [synthetic_record(layout, T, seed + i) for i, T in enumerate(lengths)]
