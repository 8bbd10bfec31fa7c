"""The layout of a model's layers, by role, from its HF config.

Every decoder layer is ``dense`` or ``moe``; every MTP/NextN layer is ``mtp``
with a 1-based ``depth`` (and ``num_experts``/``topk`` > 0 when it is MoE).
Layer ids follow the HF checkpoint: decoder layers ``0..L-1``, MTP depth
``d`` at ``L + d - 1``. The fingerprint hashes this structure, so a record can
prove which model it belongs to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ROLE_DENSE = "dense"
ROLE_MOE = "moe"
ROLE_MTP = "mtp"
ROLES = (ROLE_DENSE, ROLE_MOE, ROLE_MTP)


class LayoutError(ValueError):
    """A config or layout that sglang-r3 cannot describe."""


@dataclass(frozen=True)
class LayerInfo:
    id: int
    role: str
    depth: Optional[int] = None  # MTP depth, 1-based; None for decoder layers
    num_experts: int = 0  # 0: no router in this layer
    topk: int = 0

    def __post_init__(self):
        if self.role not in ROLES:
            raise LayoutError(f"layer {self.id}: unknown role {self.role!r} (expected one of {ROLES})")
        if (self.role == ROLE_MTP) != (self.depth is not None):
            raise LayoutError(f"layer {self.id}: depth is set exactly for role 'mtp'")
        if (self.num_experts > 0) != (self.topk > 0) or self.topk > self.num_experts:
            raise LayoutError(f"layer {self.id}: topk={self.topk} does not fit num_experts={self.num_experts}")
        if self.role == ROLE_MOE and self.num_experts == 0:
            raise LayoutError(f"layer {self.id}: role 'moe' needs num_experts > 0")
        if self.role == ROLE_DENSE and self.num_experts:
            raise LayoutError(f"layer {self.id}: role 'dense' cannot have experts")

    @property
    def has_router(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True)
class ModelLayout:
    architecture: str
    num_hidden_layers: int
    layers: Tuple[LayerInfo, ...]
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        decoder = [l for l in self.layers if l.role != ROLE_MTP]
        if [l.id for l in decoder] != list(range(self.num_hidden_layers)):
            raise LayoutError(
                f"decoder layers must be numbered 0..{self.num_hidden_layers - 1} in order, got {[l.id for l in decoder]}"
            )
        mtp = self.mtp_layers
        if [l.depth for l in mtp] != list(range(1, len(mtp) + 1)):
            raise LayoutError(f"MTP depths must be 1..{len(mtp)} in order, got {[l.depth for l in mtp]}")
        computed = _hash_structure(self)
        if self.fingerprint and self.fingerprint != computed:
            raise LayoutError(
                f"layout fingerprint {self.fingerprint!r} does not match its layers (computed {computed!r})"
            )
        object.__setattr__(self, "fingerprint", computed)

    # Views -----------------------------------------------------------------
    @property
    def moe_layers(self) -> Tuple[LayerInfo, ...]:
        """Main-model MoE layers, in row order of a routing record."""
        return tuple(l for l in self.layers if l.role == ROLE_MOE)

    @property
    def moe_layer_ids(self) -> Tuple[int, ...]:
        return tuple(l.id for l in self.moe_layers)

    @property
    def mtp_layers(self) -> Tuple[LayerInfo, ...]:
        return tuple(l for l in self.layers if l.role == ROLE_MTP)

    @property
    def num_mtp_layers(self) -> int:
        return len(self.mtp_layers)

    @property
    def topk(self) -> int:
        ks = {l.topk for l in self.layers if l.has_router}
        if len(ks) > 1:
            raise LayoutError(f"layers disagree on top-k: {sorted(ks)}")
        return ks.pop() if ks else 0

    @property
    def num_experts(self) -> int:
        return max((l.num_experts for l in self.layers), default=0)

    @property
    def expert_dtype(self) -> str:
        """Smallest unsigned dtype that holds every expert id."""
        return "uint8" if self.num_experts <= 256 else "uint16"

    def layer(self, layer_id: int) -> LayerInfo:
        for l in self.layers:
            if l.id == layer_id:
                return l
        raise KeyError(layer_id)

    # Wire form -------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "architecture": self.architecture,
            "num_hidden_layers": self.num_hidden_layers,
            "layers": [asdict(l) for l in self.layers],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelLayout":
        try:
            layers = tuple(
                LayerInfo(
                    id=int(l["id"]),
                    role=str(l["role"]),
                    depth=None if l.get("depth") is None else int(l["depth"]),
                    num_experts=int(l.get("num_experts") or 0),
                    topk=int(l.get("topk") or 0),
                )
                for l in d["layers"]
            )
            return cls(
                architecture=str(d["architecture"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                layers=layers,
                fingerprint=str(d.get("fingerprint") or ""),
            )
        except (KeyError, TypeError) as e:
            raise LayoutError(f"malformed layout: missing or bad field {e}") from e

    def summary(self) -> str:
        roles = [l.role for l in self.layers]
        return (
            f"{self.architecture}: {self.num_hidden_layers} decoder layers "
            f"({roles.count(ROLE_DENSE)} dense, {roles.count(ROLE_MOE)} MoE), "
            f"{self.num_mtp_layers} MTP, {self.num_experts} experts, top-{self.topk}"
        )


def _hash_structure(layout: ModelLayout) -> str:
    blob = json.dumps(
        {
            "architecture": layout.architecture,
            "num_hidden_layers": layout.num_hidden_layers,
            "layers": [asdict(l) for l in layout.layers],
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------
# From HF configs
# ---------------------------------------------------------------------------

def _cfg_dict(config: Any) -> Dict[str, Any]:
    if isinstance(config, Mapping):
        d = dict(config)
    elif hasattr(config, "to_dict"):
        d = config.to_dict()
    else:
        d = dict(vars(config))
    # Multimodal / wrapper configs (e.g. Qwen3.5-MoE) keep the LM in text_config.
    text = d.get("text_config")
    if isinstance(text, Mapping) or hasattr(text, "to_dict"):
        inner = _cfg_dict(text)
        inner.setdefault("architectures", d.get("architectures"))
        return {**d, **inner}
    return d


def _architecture(d: Mapping[str, Any]) -> str:
    archs = d.get("architectures") or []
    if archs:
        return str(archs[0])
    return str(d.get("model_type", "unknown"))


def _deepseek_style(d, arch) -> List[LayerInfo]:
    """GLM-4.5/4.7 (Glm4Moe) and DeepSeek-V2/V3: first_k_dense_replace + moe_layer_freq; MTP layers are MoE."""
    L = int(d["num_hidden_layers"])
    E = int(d.get("n_routed_experts") or 0)
    k = int(d.get("num_experts_per_tok") or 0)
    first_dense = int(d.get("first_k_dense_replace") or 0)
    freq = int(d.get("moe_layer_freq") or 1)
    layers = []
    for i in range(L):
        moe = E > 0 and i >= first_dense and i % freq == 0
        layers.append(LayerInfo(i, ROLE_MOE, None, E, k) if moe else LayerInfo(i, ROLE_DENSE))
    n_mtp = int(d.get("num_nextn_predict_layers") or 0)
    layers += [LayerInfo(L + j, ROLE_MTP, j + 1, E, k) for j in range(n_mtp)]
    return layers


def _qwen_moe_style(d, arch) -> List[LayerInfo]:
    """Qwen2/3-MoE, Qwen3-Next, Qwen3.5-MoE: decoder_sparse_step + mlp_only_layers; MTP layers are MoE."""
    L = int(d["num_hidden_layers"])
    E = int(d.get("num_experts") or 0)
    k = int(d.get("num_experts_per_tok") or 0)
    step = int(d.get("decoder_sparse_step") or 1)
    dense_only = set(d.get("mlp_only_layers") or [])
    layers = []
    for i in range(L):
        moe = E > 0 and i not in dense_only and (i + 1) % step == 0
        layers.append(LayerInfo(i, ROLE_MOE, None, E, k) if moe else LayerInfo(i, ROLE_DENSE))
    n_mtp = int(d.get("num_nextn_predict_layers") or d.get("mtp_num_hidden_layers") or 0)
    layers += [LayerInfo(L + j, ROLE_MTP, j + 1, E, k) for j in range(n_mtp)]
    return layers


def _mimo_style(d, arch) -> List[LayerInfo]:
    """MiMo: a dense model whose MTP layers are dense too."""
    L = int(d["num_hidden_layers"])
    n_mtp = int(d.get("num_nextn_predict_layers") or 0)
    return [LayerInfo(i, ROLE_DENSE) for i in range(L)] + [
        LayerInfo(L + j, ROLE_MTP, j + 1) for j in range(n_mtp)
    ]


def _mixtral_style(d, arch) -> List[LayerInfo]:
    L = int(d["num_hidden_layers"])
    E = int(d["num_local_experts"])
    k = int(d["num_experts_per_tok"])
    return [LayerInfo(i, ROLE_MOE, None, E, k) for i in range(L)]


_FAMILIES = {
    "Glm4MoeForCausalLM": _deepseek_style,
    "DeepseekV3ForCausalLM": _deepseek_style,
    "DeepseekV2ForCausalLM": _deepseek_style,
    "Qwen3MoeForCausalLM": _qwen_moe_style,
    "Qwen2MoeForCausalLM": _qwen_moe_style,
    "Qwen3NextForCausalLM": _qwen_moe_style,
    "Qwen3_5MoeForConditionalGeneration": _qwen_moe_style,
    "Qwen3_5MoeForCausalLM": _qwen_moe_style,
    "MiMoForCausalLM": _mimo_style,
    "MixtralForCausalLM": _mixtral_style,
}

SUPPORTED_ARCHITECTURES: Sequence[str] = tuple(_FAMILIES)


def layout_from_hf_config(config: Any) -> ModelLayout:
    d = _cfg_dict(config)
    arch = _architecture(d)
    family = _FAMILIES.get(arch)
    if family is None:
        raise LayoutError(
            f"no layout rule for architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        layers = family(d, arch)
    except KeyError as e:
        raise LayoutError(f"{arch} config is missing {e}") from e
    return ModelLayout(architecture=arch, num_hidden_layers=int(d["num_hidden_layers"]), layers=tuple(layers))


def layout_from_model_path(model_path: str) -> ModelLayout:
    import os

    with open(os.path.join(model_path, "config.json")) as f:
        return layout_from_hf_config(json.load(f))
