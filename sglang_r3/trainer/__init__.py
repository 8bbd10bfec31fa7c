"""The trainer wing's replay API: check SGLang routing records and replay them into megatron-core's routers.
Diagnostics (health, fidelity, model check, MTP losses) are in ``sglang_r3.trainer.diagnostics``; the
rollout client in ``sglang_r3.trainer.client``. Names load on first use, so the client and the records
work in an image without torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelMismatchError": "errors", "ReplayError": "errors",
    "FillSummary": "megatron", "ReplayFiller": "megatron",
    "JoinedRecord": "join", "RecordPart": "join", "Segment": "join", "join_records": "join",
    "PackedRows": "packing", "TokenLayout": "packing", "pack_rows": "packing",
    "check_record": "validate", "check_records": "validate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sglang_r3.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sglang_r3.trainer.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
