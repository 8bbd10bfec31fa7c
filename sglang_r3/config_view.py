"""A model config's routing-relevant values, as the config class SGLang builds resolves them.

The same model reaches us spelled several ways: the hub's config.json, the file transformers 5
``save_pretrained`` writes for it (attribute-mapped names such as Qwen3-MoE's ``num_local_experts``,
every default written out, ``rope_theta`` folded into ``rope_parameters``), a megatron-bridge export
(which saves through the same config class), or the config object SGLang itself holds
(``model_config.hf_config``). SGLang reads all of them through the config class, so a layout rule
or a fingerprint that read raw keys would see different models where SGLang sees one.

``view_of(config)`` resolves any of those into one canonical view: attribute-map aliases renamed to
the names the class stores, absent keys given the class's defaults, the values its ``__post_init__``
derives derived, RoPE settings folded into one ``rope_parameters`` dict, integral floats written as
ints. It needs no transformers: ``_FACTS`` holds what the config classes of transformers 5.19 (and
SGLang 0.5.23's own, for Qwen3-Next/3.5) say, and tests/test_config_view.py checks that table
against the installed classes and that the view of a raw file equals the view of the object
transformers and SGLang build from it. A trainer without transformers and a server with it
therefore compute the same view, whatever transformers version the trainer has.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Tuple

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


def is_routing_key(key: Any) -> bool:
    return isinstance(key, str) and (key in ROUTING_CONFIG_KEYS or key.startswith(ROUTING_CONFIG_PREFIXES))


class ConfigError(ValueError):
    """A config whose spellings contradict each other."""


@dataclass(frozen=True)
class _Facts:
    """What one config class says: ``attribute_map`` (alias -> stored name) and the defaults of its
    routing-relevant fields (``rope_theta``: the class's ``default_theta``)."""

    aliases: Mapping[str, str]
    defaults: Mapping[str, Any]
    derive: Tuple[Callable[[Dict[str, Any]], None], ...] = ()


# --- what each class's __post_init__ / __init__ derives (same order as there) ------------------------


def _kv_heads_default_to_heads(d: Dict[str, Any]) -> None:
    if d.get("num_key_value_heads") is None and d.get("num_attention_heads") is not None:
        d["num_key_value_heads"] = d["num_attention_heads"]


def _deepseek_v3_head_dim(d: Dict[str, Any]) -> None:
    # configuration_deepseek_v3.py: head_dim = qk_rope_head_dim, whatever the file says.
    d["head_dim"] = d.get("qk_rope_head_dim")


def _deepseek_v2_head_dim(d: Dict[str, Any]) -> None:
    # configuration_deepseek_v2.py: head_dim = qk_rope_head_dim, else hidden_size // heads.
    d["head_dim"] = d.get("qk_rope_head_dim")
    if d["head_dim"] is None and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]


def _mlp_only_layers_list(d: Dict[str, Any]) -> None:
    if d.get("mlp_only_layers") is None:
        d["mlp_only_layers"] = []


def _qwen3_moe_sliding_window(d: Dict[str, Any]) -> None:
    # configuration_qwen3_moe.py: a window only when use_sliding_window.
    if not d.get("use_sliding_window"):
        d["sliding_window"] = None


def _qwen2_moe_window_and_layer_types(d: Dict[str, Any]) -> None:
    # configuration_qwen2_moe.py __post_init__.
    use = bool(d.get("use_sliding_window"))
    if not use:
        d["sliding_window"] = 0
    if d.get("layer_types") is None and d.get("num_hidden_layers") is not None:
        window_layers = d.get("max_window_layers")
        d["layer_types"] = [
            "sliding_attention" if (i + 1) % 2 and use and window_layers is not None and i < window_layers
            else "full_attention"
            for i in range(int(d["num_hidden_layers"]))
        ]


def _glm4_moe_partial_rotary(d: Dict[str, Any]) -> None:
    # configuration_glm4_moe.py: kwargs.setdefault("partial_rotary_factor", 0.5).
    d.setdefault("partial_rotary_factor", 0.5)


def _qwen_hybrid_layer_types(d: Dict[str, Any]) -> None:
    # SGLang's Qwen3NextConfig (and Qwen3.5's, its subclass) keeps full_attention_interval and builds
    # layers_block_type from it; layer_types it drops. transformers' Qwen3-Next writes layer_types
    # instead. Both describe the same attention pattern: keep it once, as layer_types.
    interval = d.pop("full_attention_interval", None)
    if interval is None or d.get("num_hidden_layers") is None:
        return
    derived = [
        "full_attention" if (i + 1) % int(interval) == 0 else "linear_attention"
        for i in range(int(d["num_hidden_layers"]))
    ]
    given = d.get("layer_types")
    if given is not None and list(given) != derived:
        raise ConfigError(
            f"layer_types {list(given)} disagree with full_attention_interval={interval} "
            f"(SGLang builds the layers from full_attention_interval)"
        )
    d["layer_types"] = derived


def _step3p5_fields(d: Dict[str, Any]) -> None:
    # SGLang's configs/step3p5.py: the share_expert_dims keyword is stored as share_expert_dim (default
    # 1280); yarn_only_types None becomes []. moe_layers_enum is a "3,4,..." string in published files
    # and a tuple of ints as the class default; SGLang's _is_moe_layer splits the string. One spelling: a
    # list of ints.
    dims = d.pop("share_expert_dims", None)
    if d.get("share_expert_dim") is None:
        d["share_expert_dim"] = 1280 if dims is None else dims
    if d.get("yarn_only_types") is None:
        d["yarn_only_types"] = []
    enum = d.get("moe_layers_enum")
    if isinstance(enum, str):
        try:
            d["moe_layers_enum"] = [int(x) for x in enum.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"moe_layers_enum must be comma-separated layer ids, got {enum!r}") from None
    elif enum is not None:
        d["moe_layers_enum"] = [int(x) for x in enum]


# Generated from the config classes SGLang 0.5.23 builds (transformers 5.19.0's, and SGLang's own for
# qwen3_next / qwen3_5_moe_text); tests/test_config_view.py regenerates it and compares. Only
# routing-relevant fields, None defaults left out (a None is never hashed).
_QWEN_HYBRID_FACTS = _Facts(
    aliases={},
    defaults={"attention_bias": False, "decoder_sparse_step": 1, "head_dim": 256, "hidden_act": "silu",
              "hidden_size": 2048, "intermediate_size": 5632, "linear_conv_kernel_dim": 4,
              "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_value_head_dim": 128, "max_position_embeddings": 32768, "mlp_only_layers": [],
              "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
              "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
              "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "vocab_size": 151936},
    derive=(_qwen_hybrid_layer_types,),
)

_FACTS: Dict[str, _Facts] = {
    "glm4_moe": _Facts(
        aliases={"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
        defaults={"attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 4096,
                  "intermediate_size": 10944, "max_position_embeddings": 131072, "moe_intermediate_size": 1408,
                  "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
                  "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
                  "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05,
                  "rope_theta": 10000.0, "routed_scaling_factor": 1.0, "tie_word_embeddings": False,
                  "topk_group": 1, "use_qk_norm": False, "vocab_size": 151552},
        derive=(_glm4_moe_partial_rotary,),
    ),
    "deepseek_v3": _Facts(
        aliases={"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
        defaults={"attention_bias": False, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
                  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 4096,
                  "moe_intermediate_size": 2048, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
                  "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
                  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
                  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
                  "rope_interleave": True, "rope_theta": 10000.0, "routed_scaling_factor": 2.5,
                  "tie_word_embeddings": False, "topk_group": 4, "v_head_dim": 128, "vocab_size": 129280},
        derive=(_kv_heads_default_to_heads, _deepseek_v3_head_dim),
    ),
    "deepseek_v2": _Facts(
        aliases={"num_experts": "n_routed_experts"},
        defaults={"attention_bias": False, "first_k_dense_replace": 0, "hidden_act": "silu", "hidden_size": 4096,
                  "intermediate_size": 11008, "kv_lora_rank": 512, "max_position_embeddings": 2048,
                  "moe_intermediate_size": 1407, "n_routed_experts": 64, "n_shared_experts": 2,
                  "norm_topk_prob": False, "num_attention_heads": 32, "num_hidden_layers": 32, "q_lora_rank": 1536,
                  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                  "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_method": "greedy",
                  "v_head_dim": 128, "vocab_size": 102400},
        derive=(_deepseek_v2_head_dim, _kv_heads_default_to_heads),
    ),
    "qwen3_moe": _Facts(
        aliases={"num_experts": "num_local_experts"},
        defaults={"attention_bias": False, "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048,
                  "intermediate_size": 6144, "max_position_embeddings": 32768, "moe_intermediate_size": 768,
                  "norm_topk_prob": False, "num_attention_heads": 32, "num_experts_per_tok": 8,
                  "num_hidden_layers": 24, "num_key_value_heads": 4, "num_local_experts": 128, "rms_norm_eps": 1e-06,
                  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
                  "use_sliding_window": False, "vocab_size": 151936},
        derive=(_qwen3_moe_sliding_window, _mlp_only_layers_list),
    ),
    "qwen2_moe": _Facts(
        aliases={},
        defaults={"decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
                  "max_position_embeddings": 32768, "max_window_layers": 28, "moe_intermediate_size": 1408,
                  "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
                  "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                  "shared_expert_intermediate_size": 5632, "sliding_window": 4096, "tie_word_embeddings": False,
                  "use_sliding_window": False, "vocab_size": 151936},
        derive=(_mlp_only_layers_list, _qwen2_moe_window_and_layer_types),
    ),
    # Qwen3.5-MoE's text config is Qwen3-Next's (same class defaults in transformers 5.19).
    "qwen3_next": _QWEN_HYBRID_FACTS,
    "qwen3_5_moe_text": _QWEN_HYBRID_FACTS,
    "mixtral": _Facts(
        aliases={"num_experts": "num_local_experts"},
        defaults={"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
                  "max_position_embeddings": 131072, "num_attention_heads": 32, "num_experts_per_tok": 2,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
                  "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 32000},
        derive=(_kv_heads_default_to_heads,),
    ),
    # SGLang's own class (configs/step3p5.py); __init__ keyword defaults.
    "step3p5": _Facts(
        aliases={},
        defaults={"head_dim": 128, "hidden_size": 4096, "intermediate_size": 11264,
                  "max_position_embeddings": 128000, "moe_intermediate_size": 1280,
                  "moe_layers_enum": tuple(range(3, 45)), "moe_num_experts": 288, "moe_top_k": 8,
                  "norm_expert_weight": True, "num_attention_groups": 8, "num_attention_heads": 64,
                  "num_hidden_layers": 45, "rms_norm_eps": 1e-05, "rope_theta": 10000, "vocab_size": 128815},
        derive=(_step3p5_fields,),
    ),
    "olmoe": _Facts(
        aliases={"num_local_experts": "num_experts"},
        defaults={"attention_bias": False, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 2048,
                  "max_position_embeddings": 4096, "norm_topk_prob": False, "num_attention_heads": 16,
                  "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16, "rms_norm_eps": 1e-05,
                  "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 50304},
        derive=(_kv_heads_default_to_heads,),
    ),
}
CONFIG_MODEL_TYPES: Tuple[str, ...] = tuple(_FACTS)

# A config dict without model_type (hand-written, tests) is read as its architecture's class.
_ARCH_MODEL_TYPE = {
    "Glm4MoeForCausalLM": "glm4_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
    "Step3p5ForCausalLM": "step3p5",
}
# Multimodal wrappers whose text_config carries no model_type of its own in some files.
_TEXT_MODEL_TYPE = {"qwen3_5_moe": "qwen3_5_moe_text"}

_SCALED_ROPE = ("llama3", "yarn", "longrope")


@dataclass(frozen=True)
class ConfigView:
    """The routing-relevant values of one config, under the names its class stores them."""

    architecture: str  # "" when the config names none
    model_type: str  # "" when unknown
    values: Mapping[str, Any]  # routing-relevant keys only; None values dropped
    aliases: Mapping[str, str] = field(default_factory=dict)

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
    facts = _FACTS.get(model_type)
    d = copy.deepcopy(inner)
    if facts is not None:
        _rename_aliases(d, facts.aliases)
        for k, v in facts.defaults.items():
            if k not in d:
                d[k] = copy.deepcopy(v)
        for step in facts.derive:
            step(d)
    _fold_rope(d)
    values = {k: _canonical(v) for k, v in d.items() if is_routing_key(k) and v is not None}
    return ConfigView(arch, model_type, values, dict(facts.aliases) if facts else {})


def _as_dicts(config: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(outer, text-model) dicts. Multimodal wrappers (Qwen3.5-MoE) keep the language model, MTP keys
    included, in text_config; the architecture SGLang dispatches on is the outer one."""
    outer = _to_dict(config)
    text = outer.get("text_config")
    if text is None and not isinstance(config, Mapping):
        text = getattr(config, "text_config", None)
    if isinstance(text, Mapping) or hasattr(text, "to_dict"):
        return outer, _to_dict(text)
    return outer, outer


def _to_dict(config: Any) -> Dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(vars(config))


def _model_type(outer: Mapping[str, Any], inner: Mapping[str, Any], arch: str) -> str:
    if inner is not outer:
        mt = inner.get("model_type") or _TEXT_MODEL_TYPE.get(str(outer.get("model_type") or ""))
    else:
        mt = inner.get("model_type")
    return str(mt or _ARCH_MODEL_TYPE.get(arch, ""))


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


def _fold_rope(d: Dict[str, Any]) -> None:
    """One ``rope_parameters`` dict, as transformers 5 standardizes it (modeling_rope_utils.py
    ``convert_rope_params_to_dict`` / ``standardize_rope_params``): rope_scaling (4.x spelling) wins
    over rope_parameters, rope_theta and partial_rotary_factor move in unless already there, ``type``
    is ``rope_type``, scaled types carry original_max_position_embeddings."""
    params = d.pop("rope_scaling", None) or d.get("rope_parameters") or {}
    theta = d.pop("rope_theta", None)
    partial = d.pop("partial_rotary_factor", None)
    if not isinstance(params, Mapping):
        raise ConfigError(f"rope_parameters/rope_scaling must be a dict, got {params!r}")
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


def facts_table() -> Dict[str, Tuple[Dict[str, str], Dict[str, Any]]]:
    """(aliases, defaults) per model type, for the test that compares them with the live classes."""
    return {mt: (dict(f.aliases), dict(f.defaults)) for mt, f in _FACTS.items()}
