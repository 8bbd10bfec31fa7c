"""Expert load from routing records, per MoE layer: counts, max/mean, coefficient of variation, entropy.
numpy only, so it runs in a trainer image, in the server's ``/metrics`` gauges and in the report tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np


class LoadError(ValueError):
    """Rows that cannot be counted as given (wrong shape, ids outside the experts, mixed layers)."""


@dataclass(frozen=True)
class LayerLoad:
    layer: int
    counts: np.ndarray  # int64 [num_experts]

    @property
    def slots(self) -> int:
        return int(self.counts.sum())

    @property
    def mean(self) -> float:
        return self.slots / self.counts.size

    @property
    def max_over_mean(self) -> float:
        return float(self.counts.max()) / self.mean if self.slots else 0.0

    @property
    def cv(self) -> float:
        return float(self.counts.std()) / self.mean if self.slots else 0.0

    @property
    def entropy_bits(self) -> float:
        if not self.slots:
            return 0.0
        p = self.counts[self.counts > 0] / self.slots
        return float(-(p * np.log2(p)).sum())

    @property
    def entropy_norm(self) -> float:
        return self.entropy_bits / np.log2(self.counts.size) if self.counts.size > 1 else 1.0

    @property
    def idle_experts(self) -> int:
        return int((self.counts == 0).sum())


@dataclass(frozen=True)
class ExpertLoad:
    layers: Tuple[int, ...]
    counts: np.ndarray  # int64 [len(layers), num_experts]
    rows: int  # token rows counted

    @property
    def num_experts(self) -> int:
        return int(self.counts.shape[1])

    def layer(self, layer_id: int) -> LayerLoad:
        return LayerLoad(layer_id, self.counts[self.layers.index(layer_id)])

    def per_layer(self) -> List[LayerLoad]:
        return [LayerLoad(lid, self.counts[i]) for i, lid in enumerate(self.layers)]

    def metrics(self, prefix: str = "load/") -> Dict[str, float]:
        """Flat dict for any logger: per layer max/mean, cv, normalized entropy."""
        out: Dict[str, float] = {}
        for l in self.per_layer():
            out[f"{prefix}max_over_mean/layer_{l.layer}"] = l.max_over_mean
            out[f"{prefix}cv/layer_{l.layer}"] = l.cv
            out[f"{prefix}entropy_norm/layer_{l.layer}"] = l.entropy_norm
        return out

    def table(self) -> str:
        head = ("layer", "slots", "max/mean", "cv", "entropy(bits)", "entropy/max", "idle", "busiest")
        rows = [head]
        for l in self.per_layer():
            rows.append((str(l.layer), str(l.slots), f"{l.max_over_mean:.3f}", f"{l.cv:.3f}", f"{l.entropy_bits:.3f}",
                         f"{l.entropy_norm:.3f}", str(l.idle_experts), str(int(l.counts.argmax()))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"{self.rows} token rows, {len(self.layers)} MoE layers, {self.num_experts} experts")
        return "\n".join(lines)


class LoadCounter:
    """Counts batches of rows into one histogram per layer (add as many batches as you like)."""

    def __init__(self, layers: Sequence[int], num_experts: int):
        if num_experts < 1:
            raise LoadError(f"num_experts must be >= 1, got {num_experts}")
        self.layers = tuple(int(x) for x in layers)
        self.num_experts = int(num_experts)
        self.counts = np.zeros((len(self.layers), self.num_experts), dtype=np.int64)
        self.rows = 0
        # Layer l's ids land in bins [l*E, (l+1)*E) of one flat bincount.
        width = np.uint16 if len(self.layers) * self.num_experts <= np.iinfo(np.uint16).max else np.int64
        self._offsets = (np.arange(len(self.layers), dtype=width) * self.num_experts)[None, :, None]

    def add(self, experts: Any, layers: Optional[Sequence[int]] = None) -> None:
        """experts: [tokens, layers, topk] ids (a record's ``experts``); layers: their ids, if given,
        must be the counter's."""
        if layers is not None and tuple(int(x) for x in layers) != self.layers:
            raise LoadError(f"rows cover layers {list(layers)}, the counter counts {list(self.layers)}")
        x = np.asarray(experts)
        if x.ndim != 3 or x.shape[1] != len(self.layers):
            raise LoadError(f"rows of shape {x.shape} are not [tokens, {len(self.layers)} layers, topk]")
        if x.size == 0:
            return
        if x.dtype.kind not in "iu":
            raise LoadError(f"expert ids must be integers, got {x.dtype}")
        hi, lo = int(x.max()), int(x.min())
        if lo < 0 or hi >= self.num_experts:
            raise LoadError(f"expert id {hi if hi >= self.num_experts else lo} outside 0..{self.num_experts - 1}")
        flat = (x.astype(self._offsets.dtype, copy=False) + self._offsets).reshape(-1)
        self.counts += np.bincount(flat, minlength=self.counts.size).reshape(self.counts.shape)
        self.rows += int(x.shape[0])

    def result(self) -> ExpertLoad:
        return ExpertLoad(self.layers, self.counts.copy(), self.rows)


def expert_load(records: Iterable[Any], num_experts: int, progress: Any = None) -> ExpertLoad:
    """Histograms of a batch of ``RoutingRecord``s (all over the same layers).

    progress: optional wrapper for the iterable (e.g. ``tqdm.tqdm``) on large batches."""
    it = progress(records) if progress is not None else records
    counter: Optional[LoadCounter] = None
    for r in it:
        if counter is None:
            counter = LoadCounter(r.layers, num_experts)
        counter.add(r.experts, r.layers)
    if counter is None:
        raise LoadError("no records to count")
    return counter.result()


def infer_num_experts(records: Iterable[Any]) -> int:
    """Largest expert id + 1: a lower bound when no layout says how many experts there are."""
    top = max((int(np.asarray(r.experts).max()) for r in records if np.asarray(r.experts).size), default=None)
    if top is None:
        raise LoadError("the records hold no rows: nothing tells how many experts there are")
    return top + 1
