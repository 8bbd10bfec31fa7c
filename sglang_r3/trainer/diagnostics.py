"""What R3 tells about a run, beside the replay itself: live health (flips of replayed routers), fidelity
of the trainer's routing and logprobs to the rollout's, the model against the layout, per-head MTP losses."""

from sglang_r3.trainer.routers import current_meter, live_router, measure_router, measured_compute_topk
from sglang_r3.trainer.discovery import RouterSite, find_routers
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
from sglang_r3.trainer.health import HealthBook, HealthCounts, LiveMeter, RouterMeter, merge_counts
from sglang_r3.trainer.model_check import check_model_against_layout
from sglang_r3.trainer.mtp_metrics import mtp_loss_metrics

__all__ = [
    "FidelityReport",
    "HealthBook",
    "HealthCounts",
    "LayerFidelity",
    "LiveMeter",
    "LogprobDrift",
    "MtpDraftAgreement",
    "RouterMeter",
    "RouterSite",
    "check_model_against_layout",
    "current_meter",
    "fidelity_report",
    "find_routers",
    "live_router",
    "logprob_drift",
    "measure_router",
    "measured_compute_topk",
    "merge_counts",
    "merge_mtp_agreements",
    "merge_reports",
    "mtp_draft_agreement",
    "mtp_loss_metrics",
    "topk_set_agreement",
]
