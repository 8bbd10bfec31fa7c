"""sglang-r3 counters on SGLang's Prometheus ``/metrics`` (only with ``--enable-metrics``).

SGLang serves ``/metrics`` from its multiprocess registry, so counters created in the
scheduler (rows captured) and in the HTTP process (records served, refusals, bytes)
both show up there.
"""

from __future__ import annotations

from typing import Optional

_metrics = None
_checked = False


class R3Metrics:
    def __init__(self):
        # prometheus_client must be imported after SGLang has set PROMETHEUS_MULTIPROC_DIR.
        from prometheus_client import Counter

        self.rows_captured = Counter(
            "sglang_r3:rows_captured_total", "Routing rows written by target forwards (one per token)"
        )
        self.rows_invalidated = Counter(
            "sglang_r3:rows_invalidated_total",
            "KV slots computed by a forward that captured no routing for them (capture off or incomplete)",
        )
        self.records_served = Counter(
            "sglang_r3:records_served_total", "Routing records returned", labelnames=["form"]
        )
        self.refusals = Counter(
            "sglang_r3:routing_refusals_total",
            "Finished requests that asked for routing and got none, by reason",
            labelnames=["code"],
        )
        self.record_bytes = Counter(
            "sglang_r3:record_bytes_total", "Bytes of routing arrays returned", labelnames=["form"]
        )


def metrics() -> Optional[R3Metrics]:
    """The counters, or None when the server runs without --enable-metrics."""
    global _metrics, _checked
    if not _checked:
        _checked = True
        from sglang.srt.runtime_context import get_observability

        try:
            enabled = bool(get_observability().enable_metrics)
        except Exception:  # runtime context not published in this process (e.g. a bare import)
            enabled = False
        if enabled:
            _metrics = R3Metrics()
    return _metrics
