"""Find Megatron's routers in model chunks and name the layout layer each routes, by place in the module
tree, never ``layer_number`` alone: megatron-core 0.16 and 0.19 number the MTP layer differently, but a
router under the MTP block is an MTP router either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from sglang_r3.trainer.errors import ModelMismatchError

_MTP_CLASS_PREFIX = "MultiTokenPrediction"  # MultiTokenPredictionBlock / MultiTokenPredictionLayer


@dataclass(frozen=True)
class RouterSite:
    chunk: int  # index of the model chunk (virtual pipeline stage) holding the router
    path: str  # module path inside that chunk, for messages
    router: Any  # the megatron TopKRouter module
    is_mtp: bool
    layer_id: int  # layout id: decoder 0..L-1, MTP depth d at L + d - 1
    depth: Optional[int]  # MTP depth (1-based); None for decoder routers
    megatron_number: Optional[int]  # the layer_number megatron gave the enclosing layer

    def describe(self) -> str:
        kind = f"MTP depth {self.depth}" if self.is_mtp else "decoder"
        return f"chunk {self.chunk} {self.path} ({kind}, layer {self.layer_id})"


def as_chunks(model_or_chunks: Any) -> List[Any]:
    if isinstance(model_or_chunks, (list, tuple)):
        return list(model_or_chunks)
    return [model_or_chunks]


def _topk_router_class():
    from megatron.core.transformer.moe.router import TopKRouter

    return TopKRouter


def _ancestors(name: str, modules: Dict[str, Any]) -> List[Any]:
    """Enclosing modules, nearest first (the root chunk last)."""
    parts = name.split(".") if name else []
    return [modules[".".join(parts[:i])] for i in range(len(parts) - 1, -1, -1)]


def _is_mtp_container(module: Any, path_segment: str) -> bool:
    return type(module).__name__.startswith(_MTP_CLASS_PREFIX) or path_segment == "mtp"


def _mtp_flag(*modules: Any) -> Optional[bool]:
    for m in modules:
        flag = getattr(m, "is_mtp_layer", None)
        if flag is not None:
            return bool(flag)
    return None


def find_routers(model_or_chunks: Any, num_hidden_layers: int) -> List[RouterSite]:
    """Every TopKRouter in the chunks, in module order, with its layout layer id."""
    TopKRouter = _topk_router_class()
    sites: List[RouterSite] = []
    for chunk_idx, chunk in enumerate(as_chunks(model_or_chunks)):
        modules = dict(chunk.named_modules())
        for name, module in modules.items():
            if isinstance(module, TopKRouter):
                sites.append(_site(chunk_idx, name, module, modules, num_hidden_layers))
    seen: Dict[int, RouterSite] = {}
    for s in sites:
        if s.layer_id in seen:
            raise ModelMismatchError(
                f"two routers map to layer {s.layer_id}: {seen[s.layer_id].describe()} and {s.describe()}"
            )
        seen[s.layer_id] = s
    return sites


def _site(chunk_idx: int, name: str, router: Any, modules: Dict[str, Any], L: int) -> RouterSite:
    parts = name.split(".")
    ancestors = _ancestors(name, modules)
    # ancestors[i] is the module at path parts[: len(parts) - 1 - i]; its own segment is the last of those.
    segments = [parts[len(parts) - 2 - i] if len(parts) - 2 - i >= 0 else "" for i in range(len(ancestors))]
    in_mtp = any(_is_mtp_container(a, seg) for a, seg in zip(ancestors, segments))
    layer = next((a for a in ancestors if hasattr(a, "layer_number") and hasattr(a, "mlp")), None)
    if layer is None:
        raise ModelMismatchError(f"router {name} (chunk {chunk_idx}) is not inside a transformer layer")
    number = getattr(layer, "layer_number", None)
    flag = _mtp_flag(layer, router)
    if flag is not None and flag != in_mtp:
        where = "inside" if in_mtp else "outside"
        raise ModelMismatchError(
            f"router {name} (chunk {chunk_idx}) has is_mtp_layer={flag} but sits {where} the MTP block"
        )
    if in_mtp:
        mtp_layer = next((a for a in ancestors if type(a).__name__ == "MultiTokenPredictionLayer"), None)
        depth = getattr(mtp_layer, "layer_number", None) if mtp_layer is not None else None
        if depth is None:
            depth = _index_after(parts, "layers") + 1
        return RouterSite(chunk_idx, name, router, True, L + int(depth) - 1, int(depth), number)
    if number is None or not 1 <= int(number) <= L:
        raise ModelMismatchError(
            f"decoder router {name} (chunk {chunk_idx}) has layer_number={number}, outside 1..{L} "
            f"for a {L}-layer decoder"
        )
    return RouterSite(chunk_idx, name, router, False, int(number) - 1, None, int(number))


def _index_after(parts: Sequence[str], key: str) -> int:
    for i, p in enumerate(parts[:-1]):
        if p == key and parts[i + 1].isdigit():
            return int(parts[i + 1])
    raise ModelMismatchError(f"cannot tell the MTP depth of router {'.'.join(parts)}")


def decoder_layer_ids(model_or_chunks: Any) -> List[int]:
    """Global ids of the decoder TransformerLayers these chunks hold (dense ones included)."""
    ids: List[int] = []
    for chunk in as_chunks(model_or_chunks):
        modules = dict(chunk.named_modules())
        for name, m in modules.items():
            if not (hasattr(m, "layer_number") and hasattr(m, "mlp")) or not name:
                continue
            parts = name.split(".")
            segs = [".".join(parts[:i]) for i in range(len(parts))]
            in_mtp = _is_mtp_container(m, parts[-1]) or any(
                _is_mtp_container(modules[p], p.split(".")[-1] if p else "") for p in segs
            )
            if not in_mtp:
                ids.append(int(m.layer_number) - 1)
    return sorted(ids)
