"""What every family module shares: the registry's dataclasses (``Facts``, ``Stack``, ``Family``), the errors,
the MTP kinds, and the helpers more than one family's derivations or layout rule call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


class ConfigError(ValueError):
    """A config whose spellings contradict each other."""


class RuleError(ValueError):
    """A config a family's layout rule cannot describe (``layout`` raises it as a LayoutError)."""


# A family module's Facts tables are generated from the config classes SGLang 0.5.23 builds (transformers 5.19.0's,
# or SGLang's own); tests/test_config_view.py regenerates them and compares. Only routing-relevant fields, None
# defaults left out (a None is never hashed).
@dataclass(frozen=True)
class Facts:
    """What one config class says: ``attribute_map`` (alias -> stored name), the defaults of its
    routing-relevant fields (``rope_theta``: the class's ``default_theta``), what its ``__post_init__``
    derives, and ``routing_keys``: routing-relevant keys only this class names (added to
    ``config_view.ROUTING_CONFIG_KEYS`` for it alone, so another family's fingerprint never moves)."""

    aliases: Mapping[str, str]
    defaults: Mapping[str, Any]
    derive: Tuple[Callable[[Dict[str, Any]], None], ...] = ()
    routing_keys: Tuple[str, ...] = ()


MTP_NONE = "none"

MTP_NEXTN = "nextn"

MTP_MULTI_LAYER = "multi_layer"


@dataclass(frozen=True)
class Stack:
    """What a rule says SGLang builds: ``num_hidden_layers`` decoder layers, those in ``moe`` with a
    router over ``num_experts`` experts picking ``topk``; then ``num_mtp`` MTP layers (routed iff
    ``mtp_moe``)."""

    num_hidden_layers: int
    moe: Tuple[int, ...]
    num_experts: int
    topk: int
    num_mtp: int = 0
    mtp_moe: bool = False


@dataclass(frozen=True)
class Family:
    name: str  # how the README's table names it
    architectures: Mapping[str, str]  # architecture -> model_type of the config class SGLang builds
    facts: Mapping[str, Facts] = field(default_factory=dict)  # model_type -> what its class says
    rule: Optional[Callable[[Any, str], Stack]] = None
    refusal: str = ""  # why there is no rule (start-up refusal text); "" when there is one
    mtp: str = MTP_NONE
    multi_layer_capture: bool = False  # multi-layer EAGLE captured (proven: tests/test_multi_layer_mtp.py)
    # Multimodal wrappers: outer model_type -> model_type of their text_config, for files whose
    # text_config names none.
    text_model_types: Mapping[str, str] = field(default_factory=dict)
    # Keys SGLang's model file reads unconditionally (``config.key``, no default) that transformers' config class
    # neither defines nor saves: key -> (the value the releases publish, where SGLang reads it). A checkpoint saved
    # by transformers lacks them
    # and SGLang's scheduler stops on an AttributeError while building the model. Start-up refuses such a
    # checkpoint naming --model-path, the key and the value to add (serving/refusals/startup.py).
    required_keys: Mapping[str, Tuple[Any, str]] = field(default_factory=dict)

    def __post_init__(self):
        if (self.rule is None) == (not self.refusal):
            raise ValueError(f"family {self.name!r}: exactly one of rule / refusal")


# --- shared derivations (what a config class's __post_init__ / __init__ derives) -----------------------


def _kv_heads_default_to_heads(d: Dict[str, Any]) -> None:
    if d.get("num_key_value_heads") is None and d.get("num_attention_heads") is not None:
        d["num_key_value_heads"] = d["num_attention_heads"]


# --- rules -------------------------------------------------------------------------------------------------
#
# Each rule mirrors what SGLang 0.5.23 builds (sglang/srt/models/...), not what transformers would build: a
# routing record comes from SGLang, so its rows must be the layers SGLang actually routes. Where the two
# disagree on a config the rule refuses it rather than guess.

_ABSENT = object()


def _int(view, key: str, arch: str, default: Any = _ABSENT) -> int:
    """A required (or defaulted) integer field, read under any spelling its config class accepts,
    with an error that names it."""
    value = view.get(key)
    if value is None:
        if default is _ABSENT:
            stored = view.stored_name(key)
            spelled = f" (stored as {stored!r})" if stored != key else ""
            raise RuleError(f"{arch} config is missing {key!r}{spelled}, which its layout rule needs")
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RuleError(f"{arch} config has a non-integer {key!r}: {value!r}") from None


def _mtp_count(view, arch: str, default: int) -> int:
    # DeepSeek/GLM/MiMo spell it num_nextn_predict_layers (transformers' alias: num_mtp_layers),
    # Qwen3.5 spells it mtp_num_hidden_layers (in text_config); Qwen3-Next's published config has
    # neither (see _QWEN_MTP_DEFAULT). A present 0 means "no MTP".
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if view.get(key) is not None:
            return _int(view, key, arch)
    return default


def _stack(L: int, is_moe, E: int, k: int, n_mtp: int = 0, mtp_moe: bool = False) -> Stack:
    return Stack(L, tuple(i for i in range(L) if is_moe(i)), E, k, n_mtp, mtp_moe)


def _first_k_dense(v, arch, freq: int) -> Stack:
    # MoE iff layer >= first_k_dense_replace and layer % freq == 0; NextN
    # layers are always sparse (`_is_layer_sparse`: `is_nextn or ...`).
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "n_routed_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    first_dense = _int(v, "first_k_dense_replace", arch)
    n_mtp = _mtp_count(v, arch, default=0)
    return _stack(L, lambda i: i >= first_dense and i % freq == 0, E, k, n_mtp, mtp_moe=True)


def _mlp_layer_types_agree(v, arch, stack: Stack, sglang_reads: str) -> Stack:
    """transformers' newer MLA classes build each layer from mlp_layer_types; SGLang from ``sglang_reads``.
    A config where the two disagree has no layout both would serve."""
    types = v.get("mlp_layer_types")
    if types is None:
        return stack
    moe = set(stack.moe)
    want = ["sparse" if i in moe else "dense" for i in range(stack.num_hidden_layers)]
    if list(types) != want:
        raise RuleError(
            f"{arch}: mlp_layer_types={list(types)} (what transformers builds each layer from) disagree with "
            f"{sglang_reads} (what SGLang 0.5.23 builds them from: MoE layers {sorted(moe)}); refusing a layout "
            f"one of them would not serve"
        )
    return stack


def _head_dim_derived(v, arch, sglang_file: str) -> None:
    """Refuse a head_dim other than hidden_size // num_attention_heads where SGLang's model file sizes its heads
    from the latter whatever head_dim says and transformers' class reads head_dim (getattr(config, "head_dim"))."""
    hidden, heads = _int(v, "hidden_size", arch), _int(v, "num_attention_heads", arch)
    head_dim = v.given.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise RuleError(
            f"{arch}: head_dim={head_dim} is not hidden_size // num_attention_heads = {hidden // heads}: SGLang 0.5.23 "
            f"({sglang_file}) sizes its attention heads from the latter, transformers from head_dim; refusing")


def _every_layer_moe(v, arch) -> Stack:
    """Mixtral (block_sparse_moe), OLMoE: every layer is MoE; no MTP. Both classes accept
    num_local_experts (OLMoE stores it as num_experts)."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_local_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    return _stack(L, lambda i: True, E, k)


# deepseek_v2.py's DeepseekV2AttentionMLA (DeepSeek's, GLM-5's and GLM-4.7-Flash's attention) rotates with its
# deepseek_yarn embedding whatever scaled rope_type the config names, and drops YaRN's attention factor where
# rope_scaling says apply_yarn_scaling: false (SGLang's own sub-key); transformers' classes compute the type named,
# the factor always.
_MLA_ROPE_TYPES = (None, "default", "yarn", "deepseek_yarn")


def mla_rope(v, arch) -> None:
    """The RoPE an MLA attention rotates as transformers' class does: none, default or YaRN (with its factor)."""
    rope = v.get("rope_parameters") if isinstance(v.get("rope_parameters"), dict) else {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind not in _MLA_ROPE_TYPES:
        raise RuleError(f"{arch}: rope_parameters.rope_type={kind!r}: SGLang's MLA attention (deepseek_v2.py) rotates "
                        f"with its YaRN embedding for every scaled type, transformers with {kind!r}; refusing")
    if rope.get("apply_yarn_scaling", True) is not True:
        raise RuleError(f"{arch}: rope_parameters.apply_yarn_scaling={rope['apply_yarn_scaling']!r}: SGLang's MLA "
                        f"attention then drops YaRN's attention factor, transformers' YaRN always applies it; "
                        f"refusing")
