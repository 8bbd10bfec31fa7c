"""Spread for every timed comparison: medians with bootstrap 95% intervals (numpy only)."""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np


def bootstrap_ci(values: Sequence[float], stat=np.median, n_boot: int = 2000, seed: int = 0) -> Dict[str, float]:
    """{"value", "lo", "hi", "n"}: ``stat`` of the values and its percentile-bootstrap 95% interval."""
    v = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    boots = stat(v[rng.integers(0, len(v), (n_boot, len(v)))], axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"value": float(stat(v)), "lo": float(lo), "hi": float(hi), "n": int(len(v))}


def ratio_ci(num: Sequence[float], den: Sequence[float], n_boot: int = 2000, seed: int = 0) -> Dict[str, float]:
    """Median of paired per-repeat ratios num[i] / den[i] (interleaved repeats), with its bootstrap 95% interval."""
    r = np.asarray(num, dtype=float) / np.asarray(den, dtype=float)
    out = bootstrap_ci(r, n_boot=n_boot, seed=seed)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}
