"""Fill slime-style replay objects (``RoutingReplay.all_routing_replays``) from records.

slime registers one object per router in construction order: decoder MoE
routers first, MTP routers last (the MTP block is built after the decoder).
Only the decoder ones get rows; the MTP ones are left untouched and reported.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import torch

from sglang_r3.layout import ModelLayout
from sglang_r3.record import RoutingRecord
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.packing import TokenLayout, layer_major, pack_rows
from sglang_r3.trainer.validate import check_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlimeFillResult:
    filled: Tuple[int, ...]  # indices into the replay list that received rows
    skipped: Tuple[int, ...]  # indices left alone (MTP routers)
    layers: Tuple[int, ...]  # layer id filled into each of `filled`
    num_rows: int

    def describe(self) -> str:
        return (
            f"filled {len(self.filled)} decoder replay(s) for layers {list(self.layers)}; "
            f"skipped {len(self.skipped)} MTP replay(s) at positions {list(self.skipped)}"
        )


def fill_slime_replays(
    replays: Sequence[Any],
    records: Sequence[RoutingRecord],
    tokens: Sequence[Any],
    layout: ModelLayout,
    token_layout: TokenLayout = TokenLayout(),
    decoder_layer_ids: Optional[Sequence[int]] = None,
    weight_version: Optional[str] = None,
) -> SlimeFillResult:
    """tokens[i]: sample i's token ids (prompt + completion).

    decoder_layer_ids: the MoE layers this rank's replays belong to, in order (default: all of the layout's).
    weight_version: the weights the trainer holds; records routed with others are refused (None: unchecked).
    """
    decoder = tuple(decoder_layer_ids) if decoder_layer_ids is not None else tuple(layout.moe_layer_ids)
    unknown = [l for l in decoder if l not in layout.moe_layer_ids]
    if unknown:
        raise ReplayError(f"layers {unknown} are not MoE layers of layout {layout.fingerprint}")
    n_mtp = len(replays) - len(decoder)
    if n_mtp < 0 or n_mtp > layout.num_mtp_layers:
        raise ReplayError(
            f"{len(replays)} replay objects for {len(decoder)} decoder MoE layers and at most "
            f"{layout.num_mtp_layers} MTP layers; cannot tell which are which"
        )
    check_records(records, tokens, layout, weight_version)
    packed = pack_rows([r.experts for r in records], layout.num_experts, token_layout)
    columns = {lid: i for i, lid in enumerate(layout.moe_layer_ids)}
    per_layer = layer_major(packed.experts)  # each layer's rows one compact block, no per-layer gather
    for obj, lid in zip(replays, decoder):
        obj.record(torch.from_numpy(per_layer[columns[lid]]))
    result = SlimeFillResult(
        filled=tuple(range(len(decoder))),
        skipped=tuple(range(len(decoder), len(replays))),
        layers=decoder,
        num_rows=packed.num_rows,
    )
    if result.skipped:
        logger.info("R3 slime replay: %s (left live)", result.describe())
    return result
