"""Refuse a trainer model whose structure differs from the layout its records belong to.

Replaying rows onto a model that merely has the same number of routers would
silently route the wrong layers; every difference is named instead.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from sglang_r3.core.layout import ModelLayout
from sglang_r3.trainer.discovery import RouterSite, as_chunks, decoder_layer_ids
from sglang_r3.trainer.errors import ModelMismatchError


def model_config(model_or_chunks: Any, sites: Sequence[RouterSite] = ()) -> Any:
    """The TransformerConfig the chunks were built with."""
    for s in sites:
        cfg = getattr(s.router, "config", None)
        if cfg is not None:
            return cfg
    for chunk in as_chunks(model_or_chunks):
        for m in chunk.modules():
            cfg = getattr(m, "config", None)
            if cfg is not None and hasattr(cfg, "num_layers"):
                return cfg
    raise ModelMismatchError("cannot find a megatron TransformerConfig (.config with num_layers) in the model")


def moe_layers_of_config(cfg: Any) -> List[int]:
    """Decoder layer ids megatron builds as MoE, from num_moe_experts and moe_layer_freq."""
    if not getattr(cfg, "num_moe_experts", None):
        return []
    freq = getattr(cfg, "moe_layer_freq", 1)
    n = int(cfg.num_layers)
    if isinstance(freq, int):
        return [i for i in range(n) if i % freq == 0]
    pattern = list(freq)
    if len(pattern) != n:
        raise ModelMismatchError(f"moe_layer_freq has {len(pattern)} entries for num_layers={n}")
    return [i for i, v in enumerate(pattern) if v]


def _router_topk(router: Any) -> Optional[int]:
    k = getattr(router, "topk", None)
    return int(k) if k is not None else None


def _router_experts(router: Any) -> Optional[int]:
    cfg = getattr(router, "config", None)
    n = getattr(cfg, "num_moe_experts", None)
    if n is None and getattr(router, "weight", None) is not None:
        n = router.weight.shape[0]
    return int(n) if n is not None else None


def check_model_against_layout(model_or_chunks: Any, sites: Sequence[RouterSite], layout: ModelLayout) -> None:
    cfg = model_config(model_or_chunks, sites)
    problems: List[str] = []

    if int(cfg.num_layers) != layout.num_hidden_layers:
        problems.append(f"decoder layers: trainer has {cfg.num_layers}, layout has {layout.num_hidden_layers}")
    trainer_moe = moe_layers_of_config(cfg)
    if trainer_moe != list(layout.moe_layer_ids):
        problems.append(f"MoE layers: trainer has {trainer_moe}, layout has {list(layout.moe_layer_ids)}")
    trainer_mtp = int(getattr(cfg, "mtp_num_layers", None) or 0)
    if trainer_mtp != layout.num_mtp_layers:
        problems.append(f"MTP layers: trainer has {trainer_mtp}, layout has {layout.num_mtp_layers}")

    # The layers these chunks actually hold (a pipeline stage holds a slice).
    with_router = {s.layer_id for s in sites if not s.is_mtp}
    for lid in decoder_layer_ids(model_or_chunks):
        if lid >= layout.num_hidden_layers:
            continue  # already reported as a layer-count difference
        role = layout.layer(lid).role
        if (lid in with_router) != (role == "moe"):
            has = "has a router" if lid in with_router else "has no router"
            problems.append(f"layer {lid}: trainer {has}, layout calls it {role}")

    for s in sites:
        try:
            info = layout.layer(s.layer_id)
        except KeyError:
            problems.append(f"{s.describe()}: the layout has no layer {s.layer_id}")
            continue
        if s.is_mtp and info.role != "mtp":
            problems.append(f"{s.describe()}: layout layer {s.layer_id} is {info.role}, not mtp")
            continue
        if not info.has_router:
            continue  # reported above (decoder) or a dense MTP layer in the layout vs MoE in the trainer
        k, e = _router_topk(s.router), _router_experts(s.router)
        if k is not None and k != info.topk:
            problems.append(f"{s.describe()}: trainer top-{k}, layout top-{info.topk}")
        if e is not None and e != info.num_experts:
            problems.append(f"{s.describe()}: trainer has {e} experts, layout has {info.num_experts}")

    if problems:
        raise ModelMismatchError(
            f"trainer model does not match layout {layout.fingerprint} ({layout.summary()}): " + "; ".join(problems)
        )
