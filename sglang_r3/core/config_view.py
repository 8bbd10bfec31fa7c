"""A config's routing-relevant values as the config class SGLang builds resolves them (``view_of``).

The hub's config.json, transformers' ``save_pretrained``, a megatron-bridge export and SGLang's own config
object spell one model differently; read through the class's aliases, defaults and derivations (from the
family registry's ``Facts``, no transformers needed) they give one view, hence one fingerprint.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

from sglang_r3.core import families
from sglang_r3.core.families import ConfigError

# Keys that change what a router computes or the hidden states it sees: widths, attention and
# position encoding, norms, the routing function itself (grouping, scaling, normalisation, scoring),
# shared experts, which layers are sparse, MTP. Deliberately absent: numerics and packaging
# (torch_dtype/dtype, quantization_config), bookkeeping (transformers_version, _name_or_path,
# use_cache, token ids) and training-only knobs (aux-loss coefficients, dropout, router jitter).
# A bf16 and an fp32 copy of one checkpoint share a fingerprint; a weight change is caught by the
# record's weight_version, not here.
ROUTING_CONFIG_KEYS: Tuple[str, ...] = (
    # widths
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "vocab_size",
    "hidden_act",
    "tie_word_embeddings",
    # attention and positions
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "attention_bias",
    "use_qk_norm",
    "attn_output_gate",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rope_interleave",
    "partial_rotary_factor",
    "max_position_embeddings",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "full_attention_interval",
    "rms_norm_eps",
    "clip_qkv",
    # the router
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "topk_method",
    "scoring_func",
    "norm_topk_prob",
    "routed_scaling_factor",
    "n_shared_experts",
    # which layers are sparse, and MTP
    "num_hidden_layers",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "mlp_only_layers",
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    # Step-3.5 (SGLang's own Step3p5Config) spells its router, widths and per-layer settings its own way
    "moe_layers_enum",
    "moe_num_experts",
    "moe_top_k",
    "moe_router_scaling_factor",
    "use_moe_router_bias",
    "need_fp32_gate",
    "norm_expert_weight",
    "num_attention_groups",
    "attention_other_setting",
    "share_expert_dim",
    "partial_rotary_factors",
    "swiglu_limits",
    "swiglu_limits_shared",
    "use_head_wise_attn_gate",
    "yarn_only_types",
)
# Families spell whole groups with a prefix (Qwen3-Next/3.5 linear attention: linear_num_key_heads,
# linear_conv_kernel_dim, ...; Qwen3.5 MTP options: mtp_*).
ROUTING_CONFIG_PREFIXES: Tuple[str, ...] = ("linear_", "mtp_")


def is_routing_key(key: Any, model_type: str = "") -> bool:
    """Whether ``key`` is routing-relevant for every class, or for ``model_type``'s class alone
    (``families.Facts.routing_keys``)."""
    if not isinstance(key, str):
        return False
    if key in ROUTING_CONFIG_KEYS or key.startswith(ROUTING_CONFIG_PREFIXES):
        return True
    facts = families.facts_of(model_type) if model_type else None
    return facts is not None and key in facts.routing_keys


# What each config class says (aliases, defaults, derivations, its own routing keys) is in the one family
# registry, sglang_r3.core.families.
CONFIG_MODEL_TYPES: Tuple[str, ...] = families.CONFIG_MODEL_TYPES
facts_table = families.facts_table

_SCALED_ROPE = ("llama3", "yarn", "longrope")


@dataclass(frozen=True)
class ConfigView:
    """The routing-relevant values of one config, under the names its class stores them."""

    architecture: str  # "" when the config names none
    model_type: str  # "" when unknown
    values: Mapping[str, Any]  # routing-relevant keys only; None values dropped
    aliases: Mapping[str, str] = field(default_factory=dict)
    # Every key of the text model's config as given (aliases renamed, no defaults filled): what the families'
    # neutral-value checks read (``families.check_neutral``); not part of the digest.
    given: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        """The value under ``key`` or under the name the class stores ``key`` as."""
        return self.values.get(self.aliases.get(key, key), default)

    def stored_name(self, key: str) -> str:
        return self.aliases.get(key, key)


def view_of(config: Any) -> ConfigView:
    """The view of a config.json dict or a config object (transformers' or SGLang's own class)."""
    outer, inner = _as_dicts(config)
    archs = outer.get("architectures") or inner.get("architectures") or []
    arch = str(archs[0]) if archs else ""
    model_type = _model_type(outer, inner, arch)
    facts = families.facts_of(model_type)
    d = copy.deepcopy(inner)
    if facts is not None:
        _rename_aliases(d, facts.aliases)
    given = copy.deepcopy(d)
    if facts is not None:
        for k, v in facts.defaults.items():
            if k not in d:
                d[k] = copy.deepcopy(v)
        for step in facts.derive:
            step(d)
    _fold_rope(d)
    values = {k: _canonical(v) for k, v in d.items() if is_routing_key(k, model_type) and v is not None}
    return ConfigView(arch, model_type, values, dict(facts.aliases) if facts else {}, given)


def _as_dicts(config: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(outer, text-model) dicts. Multimodal wrappers (Qwen3.5-MoE) keep the language model, MTP keys
    included, in text_config; omni wrappers (Qwen3-Omni-MoE) one level deeper, in thinker_config's
    text_config (SGLang's get_hf_text_config reads thinker_config first, and builds only the thinker). The
    architecture SGLang dispatches on is the outer one."""
    outer = _to_dict(config)
    holder = _sub_config(config, outer, "thinker_config")
    if holder is None:
        holder, holder_dict = config, outer
    else:
        holder_dict = _to_dict(holder)
    text = _sub_config(holder, holder_dict, "text_config")
    if text is not None:
        return outer, _to_dict(text)
    return outer, holder_dict


def _sub_config(config: Any, as_dict: Mapping[str, Any], name: str) -> Any:
    """``config``'s sub-config ``name`` (a dict or a config object), or None."""
    sub = as_dict.get(name)
    if sub is None and not isinstance(config, Mapping):
        sub = getattr(config, name, None)
    return sub if isinstance(sub, Mapping) or hasattr(sub, "to_dict") else None


def _to_dict(config: Any) -> Dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(vars(config))


def _model_type(outer: Mapping[str, Any], inner: Mapping[str, Any], arch: str) -> str:
    if inner is not outer:
        mt = inner.get("model_type") or families.text_model_type_of(str(outer.get("model_type") or ""))
    else:
        mt = inner.get("model_type")
    return str(mt or families.model_type_of(arch))


def _rename_aliases(d: Dict[str, Any], aliases: Mapping[str, str]) -> None:
    for alias, stored in aliases.items():
        if alias not in d:
            continue
        value = d.pop(alias)
        if stored in d and d[stored] is not None and value is not None and d[stored] != value:
            raise ConfigError(
                f"config gives {alias!r}={value!r} and {stored!r}={d[stored]!r}, which its class reads as one "
                f"field ({alias!r} is an alias of {stored!r})"
            )
        if d.get(stored) is None:
            d[stored] = value


def _rope_spellings_agree(scaling: Any, params: Any) -> None:
    """Both spellings given: transformers 5 takes rope_scaling, SGLang's models may read rope_parameters (Qwen3.5's
    config maps them onto each other, its rotary embedding prefers rope_parameters). Given apart, refused."""
    if not (isinstance(scaling, Mapping) and isinstance(params, Mapping) and scaling and params):
        return
    a, b = ({"rope_type" if k == "type" else k: v for k, v in x.items()} for x in (scaling, params))
    apart = sorted(k for k in a.keys() & b.keys() if _canonical(a[k]) != _canonical(b[k]))
    if apart:
        pairs = ", ".join(f"{k}: {a[k]!r} and {b[k]!r}" for k in apart)
        raise ConfigError(
            f"config gives rope_scaling and rope_parameters apart ({pairs}), "
            "and the two frameworks read different ones (transformers 5 rope_scaling, SGLang's Qwen3.5 "
            "rope_parameters); give one")


def _fold_rope(d: Dict[str, Any]) -> None:
    """One ``rope_parameters`` dict, as transformers 5 standardizes it (modeling_rope_utils.py
    ``convert_rope_params_to_dict`` / ``standardize_rope_params``): rope_scaling (4.x spelling) wins
    over rope_parameters, rope_theta and partial_rotary_factor move in unless already there, ``type``
    is ``rope_type``, scaled types carry original_max_position_embeddings."""
    _rope_spellings_agree(d.get("rope_scaling"), d.get("rope_parameters"))
    params = d.pop("rope_scaling", None) or d.get("rope_parameters") or {}
    theta = d.pop("rope_theta", None)
    partial = d.pop("partial_rotary_factor", None)
    if not isinstance(params, Mapping):
        raise ConfigError(f"rope_parameters/rope_scaling must be a dict, got {params!r}")
    inside = params.get("partial_rotary_factor")
    for name, value in (("partial_rotary_factor", partial), ("rope_parameters.partial_rotary_factor", inside)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{name} must be a number, got {value!r}")
    if partial is not None and inside is not None and float(partial) != float(inside):
        # transformers 5.19 saves both, the attribute at its class default when only rope_parameters was given
        # (Qwen3.5: 0.25): SGLang's models read the attribute, transformers' rotary embedding rope_parameters'.
        raise ConfigError(
            f"config gives partial_rotary_factor={partial!r} and rope_parameters.partial_rotary_factor={inside!r}, "
            "and the two frameworks read different ones (SGLang's qwen3_5.py the first, transformers' rotary "
            "embedding the second)"
        )
    if not params and theta is None:
        d.pop("rope_parameters", None)
        return
    params = copy.deepcopy(dict(params))
    legacy_type = params.pop("type", None)
    params.setdefault("rope_type", legacy_type or "default")
    if theta is not None:
        params.setdefault("rope_theta", theta)
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    if params["rope_type"] in _SCALED_ROPE:
        if d.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        elif d.get("max_position_embeddings") is not None:
            params.setdefault("original_max_position_embeddings", d["max_position_embeddings"])
    d["rope_parameters"] = params


def _canonical(value: Any) -> Any:
    """Integral floats as ints (a class default 10000.0 and a file's 10000 are one value)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value
