"""A fleet of sglang-r3 engines on Ray with routing records by reference (see docs/serving.md, "Fleet: engines on Ray, records by reference").

Trainer side: ``fetch(handles)`` resolves handles to RoutingRecords from any process connected to
the fleet's Ray cluster. Driver side: ``Fleet(FleetConfig(...)).start()``.
"""

from sglang_r3.serving.fleet.handle import NAMESPACE, RecordHandle, RecordUnavailableError
from sglang_r3.serving.fleet.fetch_records import fetch

__all__ = ["NAMESPACE", "RecordHandle", "RecordUnavailableError", "fetch", "Fleet", "FleetConfig", "StoreBounds"]


def __getattr__(name):  # the driver side needs server/ (sglang); the trainer side only handles and fetch
    if name in ("Fleet", "FleetConfig"):
        from sglang_r3.serving.fleet import fleet

        return getattr(fleet, name)
    if name == "StoreBounds":
        from sglang_r3.serving.fleet.store import StoreBounds

        return StoreBounds
    raise AttributeError(name)
