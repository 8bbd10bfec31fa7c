"""How well the trainer's own routing agrees with the rollout's, per layer.

Run a forward with ``ReplayFiller.record()`` (the trainer computes routing and
megatron's RouterReplay keeps it), then compare with the records laid out the
same way. A token agrees when its top-k *set* is equal; order within top-k is
not meaningful (SGLang and Megatron may sort differently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from sglang_r3.layout import ModelLayout
from sglang_r3.record import RoutingRecord
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.packing import TokenLayout, pack_rows
from sglang_r3.trainer.validate import check_records


@dataclass(frozen=True)
class LayerFidelity:
    layer: int
    tokens: int
    agreeing: int

    @property
    def fraction(self) -> float:
        return self.agreeing / self.tokens if self.tokens else 1.0


@dataclass(frozen=True)
class FidelityReport:
    layers: Tuple[LayerFidelity, ...]

    @property
    def per_layer(self) -> Dict[int, float]:
        return {l.layer: l.fraction for l in self.layers}

    @property
    def overall(self) -> float:
        tokens = sum(l.tokens for l in self.layers)
        return sum(l.agreeing for l in self.layers) / tokens if tokens else 1.0

    def metrics(self, prefix: str = "r3/") -> Dict[str, float]:
        out = {f"{prefix}topk_agree_layer_{l.layer}": l.fraction for l in self.layers}
        out[f"{prefix}topk_agree"] = self.overall
        return out


def topk_set_agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bool [rows]: whether row i of a and b ([rows, topk]) hold the same set of experts."""
    if a.shape != b.shape:
        raise ReplayError(f"cannot compare routing of shape {a.shape} with {b.shape}")
    return (np.sort(a, axis=1) == np.sort(b, axis=1)).all(axis=1)


def fidelity_report(
    records: Sequence[RoutingRecord],
    tokens: Sequence[Any],
    recomputed: Mapping[int, Any],
    layout: ModelLayout,
    token_layout: TokenLayout = TokenLayout(),
    weight_version: Optional[str] = None,
) -> FidelityReport:
    """recomputed: layer id -> [rows, topk] the trainer chose (ReplayFiller.recorded()); pad rows are ignored.

    tokens[i]: sample i's token ids; weight_version as in ``check_records``.
    """
    check_records(records, tokens, layout, weight_version)
    packed = pack_rows([r.experts for r in records], layout.num_experts, token_layout)
    columns = {lid: i for i, lid in enumerate(layout.moe_layer_ids)}
    out = []
    for lid in sorted(recomputed):
        if lid not in columns:
            raise ReplayError(f"layer {lid} is not a MoE layer of layout {layout.fingerprint}")
        mine = _as_numpy(recomputed[lid])
        if mine.shape[0] != packed.num_rows:
            raise ReplayError(
                f"layer {lid}: trainer routed {mine.shape[0]} rows, records lay out as {packed.num_rows}"
            )
        agree = topk_set_agreement(packed.experts[:, columns[lid], :], mine)[packed.real]
        out.append(LayerFidelity(lid, int(packed.real.sum()), int(agree.sum())))
    return FidelityReport(tuple(out))


def _as_numpy(rows: Any) -> np.ndarray:
    if hasattr(rows, "detach"):  # a torch tensor, possibly on the GPU
        rows = rows.detach().cpu().numpy()
    return np.asarray(rows, dtype=np.int64)
