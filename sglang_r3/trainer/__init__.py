"""Trainer side of R3: replay SGLang routing records into megatron-core's routers."""

from sglang_r3.trainer.discovery import RouterSite, find_routers
from sglang_r3.trainer.errors import ModelMismatchError, ReplayError
from sglang_r3.trainer.fidelity import (
    FidelityReport,
    LayerFidelity,
    LogprobDrift,
    MtpDraftAgreement,
    fidelity_report,
    logprob_drift,
    merge_mtp_agreements,
    merge_reports,
    mtp_draft_agreement,
    topk_set_agreement,
)
from sglang_r3.trainer.filler import FillSummary, ReplayFiller
from sglang_r3.trainer.join import JoinedRecord, RecordPart, Segment, join_records
from sglang_r3.trainer.model_check import check_model_against_layout
from sglang_r3.trainer.mtp_metrics import mtp_loss_metrics
from sglang_r3.trainer.packing import PackedRows, TokenLayout, pack_rows
from sglang_r3.trainer.validate import check_record, check_records

__all__ = [
    "FidelityReport",
    "FillSummary",
    "JoinedRecord",
    "LayerFidelity",
    "LogprobDrift",
    "MtpDraftAgreement",
    "ModelMismatchError",
    "PackedRows",
    "ReplayError",
    "RecordPart",
    "ReplayFiller",
    "RouterSite",
    "Segment",
    "TokenLayout",
    "check_model_against_layout",
    "check_record",
    "check_records",
    "fidelity_report",
    "find_routers",
    "join_records",
    "logprob_drift",
    "merge_mtp_agreements",
    "merge_reports",
    "mtp_draft_agreement",
    "mtp_loss_metrics",
    "pack_rows",
    "topk_set_agreement",
]
