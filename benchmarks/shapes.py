"""Real MoE model shapes and synthetic routing of those shapes (random valid top-k ids)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from sglang_r3.core.layout import LayerInfo, ModelLayout
from sglang_r3.core.record import RoutingRecord, dtype_for


@dataclass(frozen=True)
class Shape:
    name: str
    num_hidden_layers: int
    first_dense: int  # leading dense layers (no router)
    num_experts: int
    topk: int
    num_mtp: int = 1

    @property
    def moe_layer_ids(self) -> Tuple[int, ...]:
        return tuple(range(self.first_dense, self.num_hidden_layers))

    @property
    def num_moe(self) -> int:
        return self.num_hidden_layers - self.first_dense

    def layout(self) -> ModelLayout:
        L, E, k = self.num_hidden_layers, self.num_experts, self.topk
        layers = [LayerInfo(i, "dense") if i < self.first_dense else LayerInfo(i, "moe", None, E, k) for i in range(L)]
        layers += [LayerInfo(L + d, "mtp", d + 1, E, k) for d in range(self.num_mtp)]
        return ModelLayout(architecture=self.name, num_hidden_layers=L, layers=tuple(layers))

    def bound_bits_per_layer_token(self) -> float:
        """log2(E! / (E-k)!): information in one ordered top-k choice."""
        return sum(math.log2(self.num_experts - i) for i in range(self.topk))


SHAPES = (
    Shape("GLM-4.5", 92, 3, 160, 8),
    Shape("DeepSeek-V3", 61, 3, 256, 8),
    Shape("Qwen3-30B-A3B", 48, 0, 128, 8, num_mtp=0),
)
GLM45 = SHAPES[0]
# More than 256 experts: ids travel as uint16 (bit-packed to 9 bits in msgpack). Kimi-K2's published config:
# 61 layers, first_k_dense_replace 1, n_routed_experts 384, num_experts_per_tok 8, no MTP layer.
WIDE_SHAPES = (Shape("Kimi-K2", 61, 1, 384, 8, num_mtp=0),)


def random_topk(rng: np.random.Generator, rows: int, num_experts: int, topk: int, dtype=np.uint8) -> np.ndarray:
    """[rows, topk] valid routing rows: ids distinct within each row, in shuffled order.

    Built from a random start and random gaps in [1, E // k] (their sum stays below E, so the ids are
    distinct), then each row's order is shuffled by one of 64 random permutations. Small dtypes
    throughout: 32k x 89 rows take well under a second.
    """
    step = max(1, num_experts // topk)
    work = np.int32
    gaps = rng.integers(1, step + 1, (rows, topk), dtype=work)
    gaps[:, 0] = rng.integers(0, num_experts, rows, dtype=work)
    ids = np.cumsum(gaps, axis=1, dtype=work) % num_experts
    perms = np.argsort(rng.random((64, topk)), axis=1)
    ids = np.take_along_axis(ids, perms[rng.integers(0, 64, rows)], axis=1)
    return ids.astype(dtype)


def synthetic_record(shape: Shape, rows: int, seed: int = 0) -> RoutingRecord:
    """A record of `rows` token rows over the shape's main MoE layers."""
    rng = np.random.default_rng(seed)
    ids = random_topk(rng, rows * shape.num_moe, shape.num_experts, shape.topk, dtype_for(shape.num_experts))
    return RoutingRecord(
        layout=shape.layout().fingerprint,
        start=0,
        layers=shape.moe_layer_ids,
        experts=ids.reshape(rows, shape.num_moe, shape.topk),
    )


def upstream_routed_experts(record: RoutingRecord, shape: Shape) -> np.ndarray:
    """Upstream SGLang's array: int32 [rows, num_hidden_layers, topk], zeros at dense layers."""
    out = np.zeros((record.num_tokens, shape.num_hidden_layers, shape.topk), dtype=np.int32)
    out[:, list(record.layers), :] = record.experts
    return out
