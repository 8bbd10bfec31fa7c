"""Drive megatron-core's per-router RouterReplay from SGLang routing records.

Decoder MoE routers replay the record (forward, and backward recomputation);
MTP routers are left live: SGLang's MTP-draft routing comes from a different
forward (draft tokens, draft steps) than the trainer's MTP loss, so there is
no row to replay for them and their routing is computed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang_r3.layout import ModelLayout
from sglang_r3.record import RoutingRecord
from sglang_r3.trainer.discovery import RouterSite, as_chunks, find_routers
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.model_check import check_model_against_layout, model_config
from sglang_r3.trainer.packing import PackedRows, TokenLayout, pack_rows
from sglang_r3.trainer.validate import check_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FillSummary:
    num_samples: int
    num_rows: int  # rows handed to each decoder router on this rank
    replayed_layers: Tuple[int, ...]
    live_mtp_layers: Tuple[int, ...]


class ReplayFiller:
    """Binds once to a model; ``fill`` before each microbatch's forward, ``clear`` after the step."""

    def __init__(
        self,
        model_or_chunks: Any,
        layout: ModelLayout,
        token_layout: Optional[TokenLayout] = None,
        weight_version: Optional[str] = None,
    ):
        """weight_version: the version of the weights the trainer holds (SGLang's weight version string
        of the policy that generated the rollouts). When set, records routed with other weights are
        refused; update it with ``filler.weight_version = v`` after each weight sync."""
        self.chunks = as_chunks(model_or_chunks)
        self.layout = layout
        self.weight_version = weight_version
        self.sites: List[RouterSite] = find_routers(self.chunks, layout.num_hidden_layers)
        check_model_against_layout(self.chunks, self.sites, layout)
        self.decoder_sites = [s for s in self.sites if not s.is_mtp]
        self.mtp_sites = [s for s in self.sites if s.is_mtp]
        self._token_layout = token_layout
        self._columns = {lid: i for i, lid in enumerate(layout.moe_layer_ids)}
        for s in self.decoder_sites:
            _ensure_replay(s)
            if not getattr(s.router, "_r3_row_guard", False):  # one guard per router, however many fillers
                s.router.register_forward_pre_hook(_row_guard(s))
                s.router._r3_row_guard = True
        logger.info(
            "R3 replay: %d decoder MoE routers replay records (layers %s); %d MTP router(s) left live "
            "(routing computed by the trainer)",
            len(self.decoder_sites),
            [s.layer_id for s in self.decoder_sites],
            len(self.mtp_sites),
        )
        self._live_mtp()

    @property
    def weight_version(self) -> Optional[str]:
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: Optional[str]) -> None:
        if version is not None and not isinstance(version, str):
            raise ReplayError(f"weight_version must be a string or None, got {type(version).__name__}")
        self._weight_version = version

    # -- token layout ----------------------------------------------------------
    def token_layout(self) -> TokenLayout:
        if self._token_layout is None:
            self._token_layout = TokenLayout.from_megatron(config=model_config(self.chunks, self.sites))
        return self._token_layout

    def pack(self, records: Sequence[RoutingRecord], tokens: Sequence[Any]) -> PackedRows:
        """Check every record, then lay the rows out as this rank's packed microbatch.

        tokens[i]: sample i's token ids (prompt + completion; 1-D tensor, array or list of ints).
        """
        check_records(records, tokens, self.layout, self.weight_version)
        return pack_rows([r.experts for r in records], self.layout.num_experts, self.token_layout())

    # -- actions ---------------------------------------------------------------
    def fill(self, records: Sequence[RoutingRecord], tokens: Sequence[Any]) -> FillSummary:
        """Replay one microbatch: records[i] holds the routing of sample i, whose token ids are tokens[i]."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        packed = self.pack(records, tokens)  # raises before any router is touched
        per_layer = packed.layer_tensors()
        targets = [per_layer[self._columns[s.layer_id]] for s in self.decoder_sites]
        for s, t in zip(self.decoder_sites, targets):
            rr = s.router.router_replay
            rr.set_target_indices(t)  # also queued for backward recomputation
            rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        self._live_mtp()
        return FillSummary(
            num_samples=len(records),
            num_rows=packed.num_rows,
            replayed_layers=tuple(s.layer_id for s in self.decoder_sites),
            live_mtp_layers=tuple(s.layer_id for s in self.mtp_sites),
        )

    def replay_backward(self) -> None:
        """After the forward: recomputed router forwards (activation recompute) pop the queued rows."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for s in self.decoder_sites:
            s.router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        self._live_mtp()

    def record(self) -> None:
        """Let decoder routers compute their routing and keep it (for the fidelity report)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for s in self.decoder_sites:
            s.router.router_replay.clear_indices()
            s.router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
        self._live_mtp()

    def recorded(self) -> Dict[int, torch.Tensor]:
        """layer id -> [rows, topk] the trainer chose in the last RECORD forward."""
        out = {}
        for s in self.decoder_sites:
            idx = s.router.router_replay.get_recorded_indices()
            if idx is None:
                raise ReplayError(f"{s.describe()}: nothing recorded; call record() and run a forward first")
            out[s.layer_id] = idx.detach().cpu()
        return out

    def clear(self) -> None:
        """Drop targets, queued backward rows and actions: routers compute their own routing again."""
        for s in self.decoder_sites:
            s.router.router_replay.clear_indices()
            s.router.router_replay.clear_router_replay_action()

    def _live_mtp(self) -> None:
        # A global RouterReplay.set_global_router_replay_action would reach MTP routers too.
        for s in self.mtp_sites:
            rr = getattr(s.router, "router_replay", None)
            if rr is not None:
                rr.clear_router_replay_action()


def _ensure_replay(site: RouterSite) -> None:
    """Give a router built without moe_enable_routing_replay its own RouterReplay instance."""
    if getattr(site.router, "router_replay", None) is None:
        from megatron.core.transformer.moe.router_replay import RouterReplay

        site.router.router_replay = RouterReplay()


def _row_guard(site: RouterSite):
    """Name the layer when the replayed rows do not match the tokens reaching the router."""

    def hook(module, args):
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        rr = module.router_replay
        if rr is None or rr.router_replay_action != RouterReplayAction.REPLAY_FORWARD:
            return None
        x = args[0] if args else None
        if x is None or rr.target_topk_idx is None:
            return None
        tokens = x.numel() // x.shape[-1]
        rows = int(rr.target_topk_idx.shape[0])
        if rows != tokens:
            raise ReplayError(
                f"{site.describe()}: {tokens} tokens reach the router but {rows} rows were filled; "
                f"the packed microbatch and the records disagree (check padding, CP/SP slicing)"
            )
        return None

    return hook
