"""Trainer side of R3: replay SGLang routing records into megatron-core's routers."""

from sglang_r3.trainer.discovery import RouterSite, find_routers
from sglang_r3.trainer.errors import ModelMismatchError, ReplayError
from sglang_r3.trainer.fidelity import FidelityReport, LayerFidelity, fidelity_report, topk_set_agreement
from sglang_r3.trainer.filler import FillSummary, ReplayFiller
from sglang_r3.trainer.model_check import check_model_against_layout
from sglang_r3.trainer.mtp_metrics import mtp_loss_metrics
from sglang_r3.trainer.packing import PackedRows, TokenLayout, pack_rows
from sglang_r3.trainer.slime_adapter import SlimeFillResult, fill_slime_replays
from sglang_r3.trainer.validate import check_record, check_records

__all__ = [
    "FidelityReport",
    "FillSummary",
    "LayerFidelity",
    "ModelMismatchError",
    "PackedRows",
    "ReplayError",
    "ReplayFiller",
    "RouterSite",
    "SlimeFillResult",
    "TokenLayout",
    "check_model_against_layout",
    "check_record",
    "check_records",
    "fidelity_report",
    "fill_slime_replays",
    "find_routers",
    "mtp_loss_metrics",
    "pack_rows",
    "topk_set_agreement",
]
