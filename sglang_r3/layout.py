"""The layout of a model's layers, by role, from its HF config.

Every decoder layer is ``dense`` or ``moe``; every MTP/NextN layer is ``mtp``
with a 1-based ``depth`` (and ``num_experts``/``topk`` > 0 when it is MoE).
Layer ids follow the HF checkpoint: decoder layers ``0..L-1``, MTP depth
``d`` at ``L + d - 1``. The fingerprint hashes this structure and the
``config_digest`` (every routing-relevant value of the config as its class
resolves it, see ``sglang_r3.config_view``), so a record can prove which model it
belongs to: two configs of the same shape that route differently get different
fingerprints, and one model spelled two ways (the hub's config.json, a
transformers-5 ``save_pretrained``, a megatron-bridge export, the config object
SGLang holds) gets one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang_r3.config_view import ConfigError, ConfigView, view_of

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
# From HF configs
#
# Each family's rule mirrors what SGLang 0.5.23 builds (sglang/srt/models/...),
# not what transformers would build: a routing record comes from SGLang, so its
# rows must be the layers SGLang actually routes. Where the two disagree on a
# config we refuse it rather than guess.
# ---------------------------------------------------------------------------

_ABSENT = object()


def _architecture(view: ConfigView) -> str:
    if not view.architecture:
        raise LayoutError(
            f"config has no 'architectures' (model_type={view.model_type or None!r}); "
            f"cannot tell which layout rule applies"
        )
    return view.architecture


def _int(view: ConfigView, key: str, arch: str, default: Any = _ABSENT) -> int:
    """A required (or defaulted) integer field, read under any spelling its config class accepts,
    with an error that names it."""
    value = view.get(key)
    if value is None:
        if default is _ABSENT:
            stored = view.stored_name(key)
            spelled = f" (stored as {stored!r})" if stored != key else ""
            raise LayoutError(f"{arch} config is missing {key!r}{spelled}, which its layout rule needs")
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise LayoutError(f"{arch} config has a non-integer {key!r}: {value!r}") from None


def _mtp_count(view: ConfigView, arch: str, default: int) -> int:
    # DeepSeek/GLM/MiMo spell it num_nextn_predict_layers (transformers' alias: num_mtp_layers),
    # Qwen3.5 spells it mtp_num_hidden_layers (in text_config); Qwen3-Next's published config has
    # neither (see _QWEN_MTP_DEFAULT). A present 0 means "no MTP".
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if view.get(key) is not None:
            return _int(view, key, arch)
    return default


def _stack(L: int, is_moe, E: int, k: int, n_mtp: int, mtp_moe: bool) -> List[LayerInfo]:
    layers = [LayerInfo(i, ROLE_MOE, None, E, k) if is_moe(i) else LayerInfo(i, ROLE_DENSE) for i in range(L)]
    e, t = (E, k) if mtp_moe else (0, 0)
    return layers + [LayerInfo(L + j, ROLE_MTP, j + 1, e, t) for j in range(n_mtp)]


def _first_k_dense(v, arch, freq: int) -> List[LayerInfo]:
    # MoE iff layer >= first_k_dense_replace and layer % freq == 0; NextN
    # layers are always sparse (`_is_layer_sparse`: `is_nextn or ...`).
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "n_routed_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    first_dense = _int(v, "first_k_dense_replace", arch)
    n_mtp = _mtp_count(v, arch, default=0)
    return _stack(L, lambda i: i >= first_dense and i % freq == 0, E, k, n_mtp, mtp_moe=True)


def _deepseek(v, arch) -> List[LayerInfo]:
    """DeepSeek-V2/V3 (deepseek_v2.py `_is_layer_sparse`). moe_layer_freq
    defaults to 1 as in DeepseekV2Config; V3 publishes 1."""
    return _first_k_dense(v, arch, freq=_int(v, "moe_layer_freq", arch, default=1))


def _glm4_moe(v, arch) -> List[LayerInfo]:
    """GLM-4.5/4.7 (glm4_moe.py `_is_layer_sparse`): SGLang, like
    transformers, ignores moe_layer_freq for Glm4Moe, so we do too."""
    return _first_k_dense(v, arch, freq=1)


# Qwen3-Next checkpoints ship one MTP layer (mtp.* tensors) but their config
# declares no count; SGLang's draft sets num_nextn_predict_layers = 1 for it
# (configs/model_config.py `_config_draft_model`).
_QWEN_MTP_DEFAULT = {"Qwen3NextForCausalLM": 1}


def _qwen_moe(v, arch) -> List[LayerInfo]:
    """Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE: SGLang builds every
    decoder layer (linear- or full-attention alike) and the MTP layer sparse
    (`stage_facts`: "all layers are sparse"; `_qwen3_5_is_moe`). transformers
    would honour decoder_sparse_step / mlp_only_layers, SGLang does not, so a
    config that uses them has no layout SGLang can serve."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    step = _int(v, "decoder_sparse_step", arch, default=1)
    dense_only = list(v.get("mlp_only_layers") or [])
    if step != 1 or dense_only:
        raise LayoutError(
            f"{arch}: decoder_sparse_step={step}, mlp_only_layers={dense_only} put dense MLPs in some "
            f"layers, but SGLang builds every {arch} layer as MoE; refusing a layout SGLang would not serve"
        )
    n_mtp = _mtp_count(v, arch, default=_QWEN_MTP_DEFAULT.get(arch, 0))
    return _stack(L, lambda i: True, E, k, n_mtp, mtp_moe=True)


def _mimo(v, arch) -> List[LayerInfo]:
    """MiMo-7B: a dense Qwen2-style model; its MTP layers are dense Qwen2
    decoder layers too (mimo_mtp.py), so they carry no router."""
    L = _int(v, "num_hidden_layers", arch)
    return _stack(L, lambda i: False, 0, 0, _mtp_count(v, arch, default=0), mtp_moe=False)


def _every_layer_moe(v, arch) -> List[LayerInfo]:
    """Mixtral (block_sparse_moe), OLMoE: every layer is MoE; no MTP. Both classes accept
    num_local_experts (OLMoE stores it as num_experts)."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_local_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    return _stack(L, lambda i: True, E, k, 0, mtp_moe=True)


# step3p5_mtp.py builds every MTP layer's block as Step3p5DecoderLayer(layer_id=45) ("FIXME"): each
# depth reads layer 45's entries of moe_layers_enum / layer_types / swiglu_limits.
_STEP3P5_MTP_LAYER_ID = 45


def _step3p5(v, arch) -> List[LayerInfo]:
    """Step-3.5 (step3p5.py `_is_moe_layer`): a decoder layer is MoE iff its id is in moe_layers_enum;
    moe_num_experts experts, moe_top_k. Its K = num_nextn_predict_layers MTP layers (step3p5_mtp.py,
    one per draft step under multi-layer EAGLE) are all built as layer 45, so each is MoE iff 45 is in
    moe_layers_enum. A config whose MTP layers would be built otherwise than it says (decoder count
    not 45, or ids 45..45+K-1 not all MoE or all dense) is refused."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "moe_num_experts", arch)
    k = _int(v, "moe_top_k", arch)
    enum = v.get("moe_layers_enum")
    if enum is None:
        raise LayoutError(f"{arch} config is missing 'moe_layers_enum', which its layout rule needs")
    sparse = {int(x) for x in enum}
    n_mtp = _mtp_count(v, arch, default=0)
    if n_mtp:
        if L != _STEP3P5_MTP_LAYER_ID:
            raise LayoutError(
                f"{arch}: num_hidden_layers={L}, but SGLang 0.5.23 builds every Step-3.5 MTP layer as layer "
                f"{_STEP3P5_MTP_LAYER_ID} (step3p5_mtp.py); refusing a layout SGLang would not serve"
            )
        says = {L + j: (L + j) in sparse for j in range(n_mtp)}
        if len(set(says.values())) > 1:
            raise LayoutError(
                f"{arch}: moe_layers_enum makes MTP layers {sorted(i for i, s in says.items() if s)} MoE and "
                f"{sorted(i for i, s in says.items() if not s)} dense, but SGLang 0.5.23 builds all of them as "
                f"layer {_STEP3P5_MTP_LAYER_ID}; refusing a layout SGLang would not serve"
            )
    return _stack(L, lambda i: i in sparse, E, k, n_mtp, mtp_moe=_STEP3P5_MTP_LAYER_ID in sparse)


_FAMILIES = {
    "Glm4MoeForCausalLM": _glm4_moe,
    "DeepseekV3ForCausalLM": _deepseek,
    "DeepseekV2ForCausalLM": _deepseek,
    "Qwen3MoeForCausalLM": _qwen_moe,
    "Qwen2MoeForCausalLM": _qwen_moe,
    "Qwen3NextForCausalLM": _qwen_moe,
    "Qwen3_5MoeForConditionalGeneration": _qwen_moe,
    "Qwen3_5MoeForCausalLM": _qwen_moe,
    "MiMoForCausalLM": _mimo,
    "MixtralForCausalLM": _every_layer_moe,
    "OlmoeForCausalLM": _every_layer_moe,
    "Step3p5ForCausalLM": _step3p5,
}

SUPPORTED_ARCHITECTURES: Sequence[str] = tuple(_FAMILIES)


def _view(config: Any) -> ConfigView:
    try:
        return view_of(config)
    except ConfigError as e:
        raise LayoutError(str(e)) from None


def layout_from_hf_config(config: Any) -> ModelLayout:
    """The layout of a config.json dict, or of a config object (transformers', or the one SGLang
    resolved: ``model_config.hf_config``, overrides included).

    Both are read as the config class resolves them (``sglang_r3.config_view``): aliases, defaults,
    derived values, RoPE folded. So the hub's config.json, a transformers-5 ``save_pretrained`` of it,
    a megatron-bridge export and the object SGLang built from any of them give one layout and one
    fingerprint.
    """
    view = _view(config)
    arch = _architecture(view)
    family = _FAMILIES.get(arch)
    if family is None:
        raise LayoutError(
            f"no layout rule for architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    layers = family(view, arch)
    return ModelLayout(
        architecture=arch,
        num_hidden_layers=_int(view, "num_hidden_layers", arch),
        layers=tuple(layers),
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
    resolves them (``sglang_r3.config_view.view_of``).

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
