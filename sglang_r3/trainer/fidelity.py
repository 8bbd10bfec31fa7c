"""How well the trainer's own routing and logprobs agree with the rollout's: per-layer top-k *set*
agreement (a "flip" is a (token, MoE layer) pair whose set differs), the k3 KL of the sampled tokens'
logprobs and the share of extreme ratios, and MTP draft agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RoutingRecord
from sglang_r3.trainer.errors import ReplayError
from sglang_r3.trainer.packing import TokenLayout, pack_rows
from sglang_r3.trainer.validate import check_records


@dataclass(frozen=True)
class LayerFidelity:
    layer: int
    tokens: int
    agreeing: int

    @property
    def fraction(self) -> float:
        return self.agreeing / self.tokens if self.tokens else 1.0


@dataclass(frozen=True)
class FidelityReport:
    layers: Tuple[LayerFidelity, ...]
    num_tokens: int = 0  # record rows compared (pad rows excluded)
    tokens_flipped: int = 0  # of those, rows where at least one layer's set differs

    @property
    def per_layer(self) -> Dict[int, float]:
        return {l.layer: l.fraction for l in self.layers}

    @property
    def overall(self) -> float:
        tokens = sum(l.tokens for l in self.layers)
        return sum(l.agreeing for l in self.layers) / tokens if tokens else 1.0

    @property
    def flip_rate(self) -> float:
        """Share of (token, layer) pairs whose expert set differs."""
        return 1.0 - self.overall

    @property
    def per_layer_flip_rate(self) -> Dict[int, float]:
        return {l.layer: 1.0 - l.fraction for l in self.layers}

    @property
    def token_flip_rate(self) -> float:
        """Share of tokens with a differing set in at least one layer."""
        return self.tokens_flipped / self.num_tokens if self.num_tokens else 0.0

    def metrics(self, prefix: str = "r3/") -> Dict[str, float]:
        out = {f"{prefix}topk_agree_layer_{l.layer}": l.fraction for l in self.layers}
        out[f"{prefix}topk_agree"] = self.overall
        out[f"{prefix}tokens_with_flip"] = self.token_flip_rate
        return out


def merge_reports(reports: Iterable[FidelityReport]) -> FidelityReport:
    """One report over several (e.g. one per microbatch or sample); layers must be the same."""
    reports = list(reports)
    if not reports:
        raise ReplayError("no fidelity reports to merge")
    layer_ids = [l.layer for l in reports[0].layers]
    for i, r in enumerate(reports[1:], 1):
        if [l.layer for l in r.layers] != layer_ids:
            raise ReplayError(f"report {i} covers layers {[l.layer for l in r.layers]}, report 0 covers {layer_ids}")
    layers = tuple(
        LayerFidelity(lid, sum(r.layers[j].tokens for r in reports), sum(r.layers[j].agreeing for r in reports))
        for j, lid in enumerate(layer_ids)
    )
    return FidelityReport(
        layers, sum(r.num_tokens for r in reports), sum(r.tokens_flipped for r in reports)
    )


@dataclass(frozen=True)
class LogprobDrift:
    """Trainer vs rollout logprobs of the sampled tokens (Δ = trainer − rollout)."""

    tokens: int
    k3_kl: float  # mean(e^Δ − 1 − Δ): k3 estimate of KL(rollout ‖ trainer)
    extreme_token_frac: float  # share with |Δ| > ln 2 (importance ratio beyond 2× either way)
    max_abs_diff: float
    mean_abs_diff: float

    def metrics(self, prefix: str = "r3/") -> Dict[str, float]:
        return {
            f"{prefix}k3_kl": self.k3_kl,
            f"{prefix}extreme_token_frac": self.extreme_token_frac,
            f"{prefix}logprob_max_abs_diff": self.max_abs_diff,
        }


def logprob_drift(trainer: Any, rollout: Any) -> LogprobDrift:
    """trainer, rollout: logprobs of the same sampled tokens (any shape, equal; one entry per token)."""
    a, b = np.asarray(_floats(trainer), np.float64).reshape(-1), np.asarray(_floats(rollout), np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ReplayError(f"trainer has {a.size} logprobs, rollout has {b.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ReplayError("logprobs contain NaN or infinity")
    if a.size == 0:
        return LogprobDrift(0, 0.0, 0.0, 0.0, 0.0)
    d = a - b
    return LogprobDrift(
        tokens=int(d.size),
        k3_kl=float(np.mean(np.expm1(d) - d)),
        extreme_token_frac=float(np.mean(np.abs(d) > math.log(2))),
        max_abs_diff=float(np.abs(d).max()),
        mean_abs_diff=float(np.abs(d).mean()),
    )


def _floats(x: Any) -> Any:
    if hasattr(x, "detach"):
        return x.detach().double().cpu().numpy()
    return x


def topk_set_agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bool [rows]: whether row i of a and b ([rows, topk]) hold the same set of experts."""
    if a.shape != b.shape:
        raise ReplayError(f"cannot compare routing of shape {a.shape} with {b.shape}")
    return (np.sort(a, axis=1) == np.sort(b, axis=1)).all(axis=1)


def fidelity_report(
    records: Sequence[RoutingRecord],
    tokens: Sequence[Any],
    recomputed: Mapping[int, Any],
    layout: ModelLayout,
    token_layout: TokenLayout = TokenLayout(),
    weight_version: Optional[str] = None,
) -> FidelityReport:
    """recomputed: layer id -> [rows, topk] the trainer chose (ReplayFiller.recorded()); pad rows are ignored.

    tokens[i]: sample i's token ids; weight_version as in ``check_records``.
    """
    check_records(records, tokens, layout, weight_version)
    packed = pack_rows([r.experts for r in records], layout.num_experts, token_layout)
    columns = {lid: i for i, lid in enumerate(layout.moe_layer_ids)}
    out = []
    flipped = np.zeros(int(packed.real.sum()), dtype=bool)
    for lid in sorted(recomputed):
        if lid not in columns:
            raise ReplayError(f"layer {lid} is not a MoE layer of layout {layout.fingerprint}")
        mine = _as_numpy(recomputed[lid])
        if mine.shape[0] != packed.num_rows:
            raise ReplayError(
                f"layer {lid}: trainer routed {mine.shape[0]} rows, records lay out as {packed.num_rows}"
            )
        agree = topk_set_agreement(packed.experts[:, columns[lid], :], mine)[packed.real]
        flipped |= ~agree
        out.append(LayerFidelity(lid, int(packed.real.sum()), int(agree.sum())))
    return FidelityReport(tuple(out), int(flipped.size), int(flipped.sum()))


def _as_numpy(rows: Any) -> np.ndarray:
    if hasattr(rows, "detach"):  # a torch tensor, possibly on the GPU
        rows = rows.detach().cpu().numpy()
    return np.asarray(rows, dtype=np.int64)


@dataclass(frozen=True)
class MtpDraftAgreement:
    """SGLang's MTP-draft routing at accepted depth-1 entries vs the trainer's live MTP router."""

    by_step: Tuple[Tuple[int, int, int], ...]  # (draft step, agreeing, compared), step ascending
    skipped_last_slot: int = 0

    @property
    def compared(self) -> int:
        return sum(n for _, _, n in self.by_step)

    @property
    def overall(self) -> float:
        n = self.compared
        return sum(a for _, a, _ in self.by_step) / n if n else 1.0

    @property
    def per_step(self) -> Dict[int, float]:
        return {s: a / n for s, a, n in self.by_step if n}


def mtp_draft_agreement(mtp: Any, tokens: Any, trainer_rows: Any) -> MtpDraftAgreement:
    """mtp: a record's ``MtpRouting``; tokens: the sample's token ids; trainer_rows: [T, topk] the
    trainer's depth-1 MTP router chose at each slot of the sample (R3 or not, MTP routers are live).

    A draft entry at position p routed token tokens[p + 1] (checked: a mismatch raises) with a
    hidden state for position p; Megatron's MTP layer at slot p embeds tokens[p + 1] and takes the
    decoder's hidden state at p. Step 0 entries (draft-extend over verified tokens) use the target's
    hidden state, as the trainer does; step >= 1 entries chain the draft's own. Only accepted
    entries are compared: a rejected draft token is not in the sample.
    """
    tokens = np.asarray(_as_numpy(tokens)).reshape(-1)
    mine = _as_numpy(trainer_rows)
    if mine.shape[0] != tokens.shape[0]:
        raise ReplayError(f"trainer MTP routing has {mine.shape[0]} rows for a sample of {tokens.shape[0]} tokens")
    counts: Dict[int, list] = {}
    skipped = 0
    for i in np.flatnonzero(np.asarray(mtp.accepted) & (np.asarray(mtp.depth) == 1)):
        p = int(mtp.positions[i])
        if p + 1 >= tokens.shape[0]:
            skipped += 1  # Megatron's last slot embeds a wrapped-around token
            continue
        if mtp.tokens is not None and int(mtp.tokens[i]) != int(tokens[p + 1]):
            raise ReplayError(
                f"MTP entry {i} at position {p} routed token {int(mtp.tokens[i])}, but the sample has "
                f"{int(tokens[p + 1])} at position {p + 1}; the entry does not belong to this sample"
            )
        c = counts.setdefault(int(mtp.step[i]), [0, 0])
        c[0] += int(set(np.asarray(mtp.experts[i]).tolist()) == set(mine[p].tolist()))
        c[1] += 1
    return MtpDraftAgreement(tuple((s, a, n) for s, (a, n) in sorted(counts.items())), skipped)


def merge_mtp_agreements(parts: Iterable[MtpDraftAgreement]) -> MtpDraftAgreement:
    counts: Dict[int, list] = {}
    skipped = 0
    for p in parts:
        skipped += p.skipped_last_slot
        for s, a, n in p.by_step:
            c = counts.setdefault(s, [0, 0])
            c[0] += a
            c[1] += n
    return MtpDraftAgreement(tuple((s, a, n) for s, (a, n) in sorted(counts.items())), skipped)
