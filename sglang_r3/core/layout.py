"""The layout of a model's layers by role (``dense``/``moe``/``mtp`` with depth), from its HF config through
its family's rule. Ids follow the checkpoint: decoder ``0..L-1``, MTP depth ``d`` at ``L + d - 1``. The
fingerprint hashes the structure and every routing-relevant config value (``config_view``), so a record
proves which model it belongs to, however the config was spelled.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang_r3.core import families
from sglang_r3.core.config_view import ConfigError, ConfigView, view_of

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
    # config_digest() of the resolved config; "" for layouts built by hand (then only structure is covered).
    config_digest: str = ""

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        if not isinstance(self.config_digest, str):
            raise LayoutError(f"config_digest must be a string, got {type(self.config_digest).__name__}")
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

    # Views (cached: the response path reads them per record; the layout is frozen) --------------------
    @cached_property
    def moe_layers(self) -> Tuple[LayerInfo, ...]:
        """Main-model MoE layers, in row order of a routing record."""
        return tuple(l for l in self.layers if l.role == ROLE_MOE)

    @cached_property
    def moe_layer_ids(self) -> Tuple[int, ...]:
        return tuple(l.id for l in self.moe_layers)

    @cached_property
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

    @cached_property
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
            "config_digest": self.config_digest,
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
                config_digest=str(d.get("config_digest") or ""),
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
            "config_digest": layout.config_digest,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------
# From HF configs: the family's rule (sglang_r3.core.families) says what SGLang 0.5.23 builds.
# ---------------------------------------------------------------------------

SUPPORTED_ARCHITECTURES: Sequence[str] = families.SUPPORTED_ARCHITECTURES


def _architecture(view: ConfigView) -> str:
    if not view.architecture:
        raise LayoutError(
            f"config has no 'architectures' (model_type={view.model_type or None!r}); "
            f"cannot tell which layout rule applies"
        )
    return view.architecture


def layers_of(stack: families.Stack) -> List[LayerInfo]:
    """The layers a family rule's ``Stack`` describes: decoder layers 0..L-1, then MTP depth d at L+d-1."""
    L, E, k = stack.num_hidden_layers, stack.num_experts, stack.topk
    moe = set(stack.moe)
    layers = [LayerInfo(i, ROLE_MOE, None, E, k) if i in moe else LayerInfo(i, ROLE_DENSE) for i in range(L)]
    e, t = (E, k) if stack.mtp_moe else (0, 0)
    return layers + [LayerInfo(L + j, ROLE_MTP, j + 1, e, t) for j in range(stack.num_mtp)]


def _view(config: Any) -> ConfigView:
    try:
        return view_of(config)
    except ConfigError as e:
        raise LayoutError(str(e)) from None


def layout_from_hf_config(config: Any) -> ModelLayout:
    """The layout of a config.json dict, or of a config object (transformers', or the one SGLang
    resolved: ``model_config.hf_config``, overrides included).

    Both are read as the config class resolves them (``sglang_r3.core.config_view``): aliases, defaults,
    derived values, RoPE folded. So the hub's config.json, a transformers-5 ``save_pretrained`` of it,
    a megatron-bridge export and the object SGLang built from any of them give one layout and one
    fingerprint.
    """
    view = _view(config)
    arch = _architecture(view)
    family = families.family_of(arch)
    if family is None or family.rule is None:
        why = (f"{family.name}: {family.refusal}" if family is not None
               else "sglang-r3 has no rule for it (not proven against the module tree SGLang builds)")
        raise LayoutError(
            f"no layout rule for architecture {arch!r} ({why}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        families.check_head(view, arch)
        families.check_neutral(view, arch)
        stack = family.rule(view, arch)
    except families.RuleError as e:
        raise LayoutError(str(e)) from None
    return ModelLayout(
        architecture=arch,
        num_hidden_layers=stack.num_hidden_layers,
        layers=tuple(layers_of(stack)),
        config_digest=_digest(view),
    )


def layout_from_model_path(model_path: str) -> ModelLayout:
    with open(os.path.join(model_path, "config.json")) as f:
        return layout_from_hf_config(json.load(f))


# ---------------------------------------------------------------------------
# Config digest
# ---------------------------------------------------------------------------


def config_digest(config: Any) -> str:
    """Digest of the routing-relevant values of a config (``config_view.ROUTING_CONFIG_KEYS``), as its class
    resolves them (``sglang_r3.core.config_view.view_of``).

    A config.json dict and the config object loaded from it give the same digest; so do the spellings
    of one model that transformers and megatron-bridge write. Multimodal wrappers are read in their
    text_config, as the layout is. Absent keys take the class default, null values are skipped;
    values are hashed as JSON (sorted keys), integral floats as ints.
    """
    if config is None or isinstance(config, (str, bytes, int, float, list, tuple)):
        raise LayoutError(f"config_digest needs a config dict or object, got {type(config).__name__}")
    return _digest(_view(config))


def _digest(view: ConfigView) -> str:
    try:
        blob = json.dumps(dict(view.values), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise LayoutError(f"config has a routing-relevant value that is not plain JSON: {e}") from e
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
