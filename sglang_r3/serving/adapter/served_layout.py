"""The routers of the model SGLang built, read from its module tree (each ``TopK``'s layer id and routed top-k,
fused shared-expert columns apart; the layer's ``FusedMoE`` experts), and the start-up check that they are
the layout's: a mismatch names the architecture and the first layer that does not fit. The registry sweep
(tests/test_sweep.py) reads every MoE architecture the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple


class LayoutMismatch(RuntimeError):
    """The model SGLang built routes other layers, experts or top-k than the layout says."""


@dataclass(frozen=True)
class ServedRouter:
    layer_id: int
    topk: int  # routed columns (fused shared-expert columns not counted)
    num_experts: Optional[int]  # routed experts of the layer's FusedMoE; None: no FusedMoE found
    shared_columns: int = 0  # fused shared-expert columns SGLang appends after the routed ones
    capture: bool = True  # topk_config.allow_routed_experts_capture


_LAYER_IN_PATH = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def router_layers(model) -> Dict[int, int]:
    """id(TopK) -> the layer it routes. Its own ``layer_id``; where SGLang built it without one (0.5.15: 20 of
    its 39 TopK constructions, Mixtral, OLMoE, Llama 4, MiniMax-M2, Granite-MoE, ... pass none, and its
    capture site then gets None), the ``layer_id`` of the FusedMoE beside it, or the decoder index in its
    module path. A router none of these numbers stops start-up."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import TopK

    out: Dict[int, int] = {}
    for name, m in model.named_modules():
        router = getattr(m, "topk", None)
        for r in ([m] if isinstance(m, TopK) else []) + ([router] if isinstance(router, TopK) else []):
            if id(r) in out:
                continue
            if r.layer_id is not None:
                out[id(r)] = int(r.layer_id)
                continue
            beside = getattr(m, "experts", None) if r is router else None
            found = _LAYER_IN_PATH.findall(name)
            if isinstance(beside, FusedMoE) and beside.layer_id is not None:
                out[id(r)] = int(beside.layer_id)
            elif r is router and found:
                out[id(r)] = int(found[-1])
    for name, m in model.named_modules():
        if isinstance(m, TopK) and id(m) not in out:
            found = _LAYER_IN_PATH.findall(name)
            if not found:
                raise LayoutMismatch(f"sglang-r3: the router {name} has no layer id, no FusedMoE beside it and no "
                                     "layer index in its module path: its rows cannot be filed by layer")
            out[id(m)] = int(found[-1])
    return out


def routers_of(model) -> Dict[int, ServedRouter]:
    """Per layer id, the router SGLang built there (one per layer; two different ones refuse)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import TopK
    from torch.nn import ModuleList

    from sglang_r3.seam.release import shared_topk_slots

    layer_of = router_layers(model)
    experts: Dict[int, set] = {}
    topks: Dict[int, set] = {}
    for name, m in model.named_modules():
        router, listed = getattr(m, "topk", None), getattr(m, "experts", None)
        if isinstance(router, TopK) and isinstance(listed, ModuleList) and not isinstance(m, FusedMoE):
            # experts as a list of expert MLPs next to the router (AFMoE's AfmoeMoE), not a FusedMoE
            experts.setdefault(layer_of[id(router)], set()).add(len(listed))
        if isinstance(m, FusedMoE):
            lid = m.layer_id if m.layer_id is not None else int(_LAYER_IN_PATH.findall(name)[-1])
            experts.setdefault(int(lid), set()).add(
                int(m.num_experts) - int(getattr(m, "num_fused_shared_experts", 0) or 0)
            )
        elif isinstance(m, TopK):
            cfg = m.topk_config
            shared = shared_topk_slots(cfg)
            topks.setdefault(layer_of[id(m)], set()).add(
                (int(cfg.top_k) - shared, shared, bool(cfg.allow_routed_experts_capture))
            )
    out: Dict[int, ServedRouter] = {}
    for lid, ks in sorted(topks.items()):
        es = experts.get(lid, set())
        if len(ks) > 1 or len(es) > 1:
            raise LayoutMismatch(
                f"layer {lid} has {len(ks)} routers {sorted(ks)} and experts {sorted(es)}: one router per layer "
                "is what a routing record's row can hold"
            )
        (k, shared, capture), = ks
        out[lid] = ServedRouter(lid, k, next(iter(es)) if es else None, shared, capture)
    return out


def _compare(arch: str, what: str, want: Iterable[Tuple[int, int, int]], got: Dict[int, ServedRouter],
             by_id: bool = True) -> None:
    for lid, e, k in want:
        r = got.get(lid)
        if r is None:
            raise LayoutMismatch(f"sglang-r3: {arch}: the layout says {what} layer {lid} routes (top-{k} of {e}), "
                                 f"but SGLang built no router there (routers at {sorted(got)})")
        if r.topk != k or (r.num_experts is not None and r.num_experts != e):
            raise LayoutMismatch(
                f"sglang-r3: {arch}: {what} layer {lid}: the layout says top-{k} of {e} experts, SGLang built "
                f"top-{r.topk} of {r.num_experts} (fused shared columns: {r.shared_columns}); refusing to capture "
                "mislabelled routing"
            )


def check_main(model, layout) -> Dict[int, ServedRouter]:
    """The target model's routers are exactly the layout's main MoE layers, with its experts and top-k."""
    got = {lid: r for lid, r in routers_of(model).items() if r.capture}
    want = [(l.id, l.num_experts, l.topk) for l in layout.moe_layers]
    extra = sorted(set(got) - {l.id for l in layout.moe_layers})
    if extra:
        raise LayoutMismatch(
            f"sglang-r3: {layout.architecture}: the layout says main MoE layers are {list(layout.moe_layer_ids)}, "
            f"but SGLang built routers at layers {sorted(got)} (layer {extra[0]} is not in the layout); refusing "
            "to capture mislabelled routing"
        )
    _compare(layout.architecture, "main MoE", want, got)
    return got


def check_draft(routers: Dict[int, ServedRouter], layout) -> None:
    """The draft (MTP) model's routers fit the layout's MTP layers: none where they are dense, and each with
    the experts and top-k of the MTP layers where they route. A layout without MTP layers (a separate EAGLE
    draft model) is not checked here."""
    mtp = layout.mtp_layers
    if not mtp:
        return
    routed = [l for l in mtp if l.has_router]
    if not routed:
        if routers:
            lid = min(routers)
            raise LayoutMismatch(
                f"sglang-r3: {layout.architecture}: the layout's MTP layers {[l.id for l in mtp]} are dense, but "
                f"SGLang's draft model has a router at layer {lid}; refusing to capture unlabelled MTP routing"
            )
        return
    shapes = {(l.num_experts, l.topk) for l in routed}
    for lid, r in sorted(routers.items()):
        if not any(r.topk == k and (r.num_experts is None or r.num_experts == e) for e, k in shapes):
            raise LayoutMismatch(
                f"sglang-r3: {layout.architecture}: draft (MTP) router at layer {lid} is top-{r.topk} of "
                f"{r.num_experts} experts, but the layout's MTP layers route (experts, top-k) {sorted(shapes)}; "
                "refusing to capture mislabelled MTP routing"
            )
