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


def grouped_ratio_ci(groups: Sequence[tuple], n_boot: int = 2000, seed: int = 0) -> Dict[str, float]:
    """Median of the pooled paired ratios of several groups (num[i] / den[i] within each group: the
    interleaved rounds of one server pair), with a two-level bootstrap 95% interval: resample the
    groups, then the rounds within each. Rounds of one pair share its process starts, whose offset
    (a point or two either way, the same for SGLang against itself) no resampling of rounds alone
    shows; the interval then narrows with the number of pairs, not of rounds."""
    ratios = [np.asarray(n, dtype=float) / np.asarray(d, dtype=float) for n, d in groups]
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        picked = [ratios[g] for g in rng.integers(0, len(ratios), len(ratios))]
        boots[b] = np.median(np.concatenate([r[rng.integers(0, len(r), len(r))] for r in picked]))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    pooled = np.concatenate(ratios)
    return {"value": round(float(np.median(pooled)), 4), "lo": round(float(lo), 4), "hi": round(float(hi), 4),
            "n": int(len(pooled)), "groups": len(ratios)}


def worst_speedup(per_shape: Dict[str, Dict], key: str) -> float:
    """The smallest ``speedup_vs_slime[key]`` over the shapes measured: the figure a key reports."""
    return min(v["speedup_vs_slime"][key]["value"] for v in per_shape.values())
