"""Live R3 health: how often a replayed router would have routed otherwise, counted on its device.

Meters (flips of a replaying router, rows of a live MTP router) and the book that binds each
microbatch's pad mask and reads a step's counts in one device->host copy. Inside a router only device
ops run (no ``.item()``, no branch on tensor values); ``routers.py`` attaches meters to routers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch


def in_backward() -> bool:
    """True inside autograd's backward: a router forward there is an activation recompute."""
    return torch._C._current_graph_task_id() != -1


@dataclass
class MeterBinding:
    """One microbatch as the routers see it: which rows are record rows, and per-token flip flags.

    Made before the forward (host work and one host->device copy there), read by routers on the device.
    """

    num_rows: int
    num_real: int  # record rows among them (pad rows excluded), known on the host
    real: Optional[torch.Tensor]  # bool [num_rows] on the router's device; None: every row is real
    flags: torch.Tensor  # bool [num_rows]: set where some measured layer flipped (tokens with a flip)
    observed: bool = False  # some router measured it (host flag, set outside any tensor op)


class RouterMeter:
    """Flip counters of one replaying router, on its device.

    ``flipped`` (int64 scalar, device): pairs whose own expert set differs from the replayed one;
    ``compared`` (host int): record rows measured. Both accumulate until ``reset``.
    """

    def __init__(self, layer_id: int, device: torch.device):
        self.layer_id = int(layer_id)
        self.device = torch.device(device)
        self.flipped = torch.zeros((), dtype=torch.int64, device=self.device)  # allocated once
        self.compared = 0
        self.armed = False  # measure only for a fill that asked to
        self.training = False  # the router's nn.Module.training in the forward now running (host flag)
        self._bindings: Deque[MeterBinding] = deque()

    # -- bindings (host side, before the forward) ---------------------------
    def push(self, binding: MeterBinding) -> None:
        self._bindings.append(binding)

    def drop_bindings(self) -> None:
        self._bindings.clear()

    def _next_binding(self) -> Optional[MeterBinding]:
        # One binding per forward, in order; the last one stays (a single fill serves every forward
        # until the next fill, as Megatron's RouterReplay keeps its one target).
        if len(self._bindings) > 1:
            return self._bindings.popleft()
        return self._bindings[0] if self._bindings else None

    # -- inside the router: device ops only ----------------------------------
    def observe(self, replayed: torch.Tensor, own: torch.Tensor) -> None:
        """replayed, own: [rows, topk] expert ids (distinct per row). Counts rows whose sets differ."""
        b = self._next_binding()
        with torch.no_grad():
            # Row r flips when its sets differ; ids are distinct per row (records are validated, top-k
            # picks distinct experts), so sorted rows are equal exactly when the sets are.
            flip = (torch.sort(own, dim=1).values != torch.sort(replayed, dim=1).values).any(dim=1)
            if b is not None and b.real is not None:
                flip = flip.logical_and_(b.real)
            self.flipped.add_(flip.sum())
            if b is not None:
                b.flags.logical_or_(flip)
        if b is not None:
            self.compared += b.num_real
            b.observed = True
        else:
            self.compared += int(replayed.shape[0])

    def reset(self) -> None:
        self.flipped.zero_()
        self.compared = 0


class LiveMeter:
    """Rows an MTP router routes live (host count from tensor shapes: no device work at all).

    counting: host test of the router module, read at each forward (e.g. "a training forward under
    slime's replay_forward stage"); None counts every forward outside autograd's backward."""

    def __init__(self, layer_id: int, counting: Optional[Callable[[Any], bool]] = None):
        self.layer_id = int(layer_id)
        self.rows = 0
        self.armed = False
        self.counting = counting

    def count(self, module: Any, args: Any) -> None:
        """Before the router's forward: its input rows, when this forward counts."""
        if self.armed and args and not in_backward() and (self.counting is None or self.counting(module)):
            x = args[0]
            self.rows += x.numel() // x.shape[-1]

    def reset(self) -> None:
        self.rows = 0


# -- one binding's book: bindings per microbatch, read once per step ------------------------------


@dataclass(frozen=True)
class HealthCounts:
    """One step's counts on this rank (sum them across data-parallel ranks for global rates)."""

    layers: Tuple[int, ...]
    compared: Tuple[int, ...]  # record rows measured, per layer
    flipped: Tuple[int, ...]  # of those, rows whose own set differs from the replayed one
    rows: int  # record rows replayed (pad rows excluded)
    tokens_flipped: int  # of those, rows with a flip in at least one measured layer
    mtp_layers: Tuple[int, ...] = ()
    mtp_rows: Tuple[int, ...] = ()  # rows each MTP router routed live (pad rows included)

    def metrics(self, prefix: str = "r3/") -> Dict[str, float]:
        pairs, flips = sum(self.compared), sum(self.flipped)
        out: Dict[str, float] = {
            f"{prefix}flip_rate": flips / pairs if pairs else 0.0,
            f"{prefix}tokens_with_flip": self.tokens_flipped / self.rows if self.rows else 0.0,
            f"{prefix}rows_replayed": float(self.rows),
            f"{prefix}pairs_replayed": float(pairs),
            f"{prefix}pairs_flipped": float(flips),
            f"{prefix}tokens_flipped": float(self.tokens_flipped),
        }
        for lid, n, f in zip(self.layers, self.compared, self.flipped):
            out[f"{prefix}flip_rate/layer_{lid}"] = f / n if n else 0.0
        out[f"{prefix}mtp/rows_routed"] = float(sum(self.mtp_rows))
        for lid, n in zip(self.mtp_layers, self.mtp_rows):
            out[f"{prefix}mtp/rows_routed/layer_{lid}"] = float(n)
        return out


def merge_counts(parts: Iterable[HealthCounts]) -> HealthCounts:
    """Sum counts of several ranks or steps (same layers)."""
    parts = list(parts)
    if not parts:
        raise ValueError("no health counts to merge")
    first = parts[0]
    for p in parts[1:]:
        if p.layers != first.layers or p.mtp_layers != first.mtp_layers:
            raise ValueError(f"counts cover layers {p.layers}/{p.mtp_layers}, not {first.layers}/{first.mtp_layers}")

    def total(name):
        return tuple(int(sum(col)) for col in zip(*(getattr(p, name) for p in parts)))

    return HealthCounts(
        first.layers, total("compared"), total("flipped"), sum(p.rows for p in parts),
        sum(p.tokens_flipped for p in parts), first.mtp_layers, total("mtp_rows"),
    )


class HealthBook:
    """The meters of one binding, the bindings of the microbatches filled since the last read."""

    def __init__(self, meters: Sequence[RouterMeter], live: Sequence[LiveMeter] = ()):
        self.meters = list(meters)
        self.live = list(live)
        self._open: List[MeterBinding] = []  # bindings whose flags are not folded yet
        self._rows = 0
        self._tokens_flipped: Dict[torch.device, torch.Tensor] = {}  # device scalar per device, allocated once
        for m in self.meters:
            self._tokens_flipped.setdefault(m.device, torch.zeros((), dtype=torch.int64, device=m.device))
        # Meters belong to routers, which outlive fillers: a new book starts from zero.
        for m in [*self.meters, *self.live]:
            m.reset()
            if isinstance(m, RouterMeter):
                m.drop_bindings()

    def arm(self, on: bool) -> None:
        for m in [*self.meters, *self.live]:
            m.armed = on

    def binding(self, real: np.ndarray, device: torch.device) -> MeterBinding:
        """A microbatch's binding from its pad mask (``PackedRows.real``); made before the forward."""
        device = torch.device(device)
        n, n_real = int(real.shape[0]), int(real.sum())
        mask = None
        if n_real != n:
            mask = torch.from_numpy(np.ascontiguousarray(real, dtype=bool))
            if device.type == "cuda":  # pinned: the copy is asynchronous and the host never waits
                mask = mask.pin_memory().to(device, non_blocking=True)
            else:
                mask = mask.to(device)
        b = MeterBinding(n, n_real, mask, torch.zeros(n, dtype=torch.bool, device=device))
        if b.flags.device not in self._tokens_flipped:
            self._tokens_flipped[b.flags.device] = torch.zeros((), dtype=torch.int64, device=b.flags.device)
        self._open.append(b)
        return b

    def bind_microbatch(self, real: np.ndarray) -> None:
        """Push one microbatch's binding onto every meter of the book (one binding per device), in
        the order the counted forwards will take them; made before the forward."""
        made: Dict[torch.device, MeterBinding] = {}
        for m in self.meters:
            if m.device not in made:
                made[m.device] = self.binding(real, m.device)
            m.push(made[m.device])

    def start_fill(self) -> None:
        """A new fill: fold the previous microbatches' flags (device ops) and drop their bindings."""
        self._fold()
        self._open = []
        for m in self.meters:
            m.drop_bindings()

    def _fold(self) -> None:
        # Device ops only; a binding still current (a single fill serves later forwards too) starts over.
        for b in self._open:
            if b.observed:
                self._rows += b.num_real
                self._tokens_flipped[b.flags.device].add_(b.flags.sum())
                b.flags.zero_()
                b.observed = False

    def read(self, reset: bool = True) -> HealthCounts:
        """Every counter to the host in one copy per device (call once per step, after the forwards)."""
        self._fold()
        flipped: Dict[int, int] = {}
        tokens_flipped = 0
        for dev, acc in self._tokens_flipped.items():
            mine = [i for i, m in enumerate(self.meters) if m.device == dev]
            values = torch.stack([acc] + [self.meters[i].flipped for i in mine]).cpu().tolist()  # the one copy
            tokens_flipped += int(values[0])
            flipped.update({i: int(v) for i, v in zip(mine, values[1:])})
        counts = HealthCounts(
            layers=tuple(m.layer_id for m in self.meters),
            compared=tuple(m.compared for m in self.meters),
            flipped=tuple(flipped[i] for i in range(len(self.meters))),
            rows=self._rows,
            tokens_flipped=tokens_flipped,
            mtp_layers=tuple(m.layer_id for m in self.live),
            mtp_rows=tuple(m.rows for m in self.live),
        )
        if reset:
            for m in [*self.meters, *self.live]:
                m.reset()
            for acc in self._tokens_flipped.values():
                acc.zero_()
            self._rows = 0
        return counts
