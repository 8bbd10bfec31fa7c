"""sglang-r3 counters on SGLang's Prometheus ``/metrics`` (only with ``--enable-metrics``).

SGLang serves ``/metrics`` from its multiprocess registry, so counters created in the
scheduler (rows captured) and in the HTTP process (records served, refusals, bytes)
both show up there. Whether the server runs with ``--enable-metrics`` is SGLang's to say: the
adapter hands in a probe at install (``use_probe``); without one (no server) there are no counters.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

# Rows of one record counted into the load gauges: evenly spaced, so a long record costs a bounded
# share of the response builder's time (counted whole, a 32k-token record's histogram would cost more
# than building its response); records up to this many tokens are counted exactly.
LOAD_ROWS_PER_RECORD = 512

_metrics = None
_checked = False
_probe: Optional[Callable[[], bool]] = None


class R3Metrics:
    def __init__(self):
        # prometheus_client must be imported after SGLang has set PROMETHEUS_MULTIPROC_DIR.
        from prometheus_client import Counter, Gauge

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
        # One series per MoE layer (never per expert): the busiest expert's routed slots over the
        # layer's mean, over the records served since start (sglang_r3.core.load). Set by the one HTTP
        # process (multi-tokenizer setups are refused at start-up), so its most recent value is the value.
        self.expert_load_imbalance = Gauge(
            "sglang_r3:expert_load_imbalance",
            "Busiest expert's routed slots over the layer mean, records served since start (1 = balanced)",
            labelnames=["layer"], multiprocess_mode="mostrecent",
        )
        self._load = None  # sglang_r3.core.load.LoadCounter, made with the first record
        self._load_lock = threading.Lock()

    def observe_load(self, record: Any, num_experts: int) -> None:
        """Count a served record's routing into the per-layer load-imbalance gauges."""
        from sglang_r3.core.load import LoadCounter

        rows = record.experts
        if rows.shape[0] > LOAD_ROWS_PER_RECORD:
            rows = rows[:: -(-rows.shape[0] // LOAD_ROWS_PER_RECORD)]
        with self._load_lock:
            if self._load is None or self._load.layers != tuple(record.layers):
                self._load = LoadCounter(record.layers, num_experts)
            self._load.add(rows)
            for layer in self._load.result().per_layer():
                self.expert_load_imbalance.labels(layer=str(layer.layer)).set(layer.max_over_mean)


def use_probe(probe: Callable[[], bool]) -> None:
    """``probe()`` says whether this process serves --enable-metrics; asked once, at the first count
    (SGLang publishes its runtime context after our patches are installed)."""
    global _probe
    _probe = probe


def metrics() -> Optional[R3Metrics]:
    """The counters, or None when the server runs without --enable-metrics."""
    global _metrics, _checked
    if not _checked and _probe is not None:
        _checked = True
        if _probe():
            _metrics = R3Metrics()
    return _metrics
