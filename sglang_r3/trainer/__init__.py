"""Trainer side of R3, the replay API: check SGLang routing records and replay them into megatron-core's
routers. Health, fidelity and model checks are in ``sglang_r3.trainer.diagnostics``."""

from sglang_r3.trainer.errors import ModelMismatchError, ReplayError
from sglang_r3.trainer.filler import FillSummary, ReplayFiller
from sglang_r3.trainer.join import JoinedRecord, RecordPart, Segment, join_records
from sglang_r3.trainer.packing import PackedRows, TokenLayout, pack_rows
from sglang_r3.trainer.validate import check_record, check_records

__all__ = [
    "FillSummary",
    "JoinedRecord",
    "ModelMismatchError",
    "PackedRows",
    "RecordPart",
    "ReplayError",
    "ReplayFiller",
    "Segment",
    "TokenLayout",
    "check_record",
    "check_records",
    "join_records",
    "pack_rows",
]
