"""The one registry of model families sglang-r3 describes: one entry per family.

Each ``Family`` says everything sglang-r3 knows about it, in one place:

* ``architectures``: the ``architectures[0]`` values SGLang dispatches on, each with the ``model_type`` of the
  config class SGLang builds for it (a config dict without ``model_type`` is read as that class);
* ``facts``: per model type, what that config class says (attribute-map aliases, routing-relevant defaults,
  the values its ``__post_init__`` derives, keys only this class names) -- read by ``config_view``;
* ``rule``: which decoder layers SGLang 0.5.23 builds with a router, their experts and top-k, and its MTP
  layers -- read by ``layout``; ``None`` with a ``refusal``: a family SGLang serves whose routing sglang-r3
  cannot describe exactly, refused at start-up with that reason;
* ``mtp``: how SGLang drafts with its MTP layers (``none``, ``nextn``: one NextN/MTP layer reused per step,
  ``multi_layer``: one layer per draft step, ``MultiLayerEagleWorkerV2``), and whether multi-layer capture is
  proven (``multi_layer_capture``, read by the start-up checks).

No SGLang, no transformers: the trainer computes layouts and fingerprints from this table.
tests/test_config_view.py checks ``facts`` against the installed config classes, tests/test_layout.py the
rules against published configs, and tests/test_sweep.py every MoE architecture in SGLang's registry
against the module tree SGLang (and transformers, where it has the class) builds from a tiny config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple


class ConfigError(ValueError):
    """A config whose spellings contradict each other."""


class RuleError(ValueError):
    """A config a family's layout rule cannot describe (``layout`` raises it as a LayoutError)."""


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
    # checkpoint naming --model-path, the key and the value to add (serving/patches/startup_checks.py).
    required_keys: Mapping[str, Tuple[Any, str]] = field(default_factory=dict)

    def __post_init__(self):
        if (self.rule is None) == (not self.refusal):
            raise ValueError(f"family {self.name!r}: exactly one of rule / refusal")


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


def _glm4_moe_lite_mlp_layer_types(d: Dict[str, Any]) -> None:
    # configuration_glm4_moe_lite.py __post_init__: the first layer dense, the rest sparse (whatever
    # first_k_dense_replace says -- the class has no such field; SGLang reads it from the file).
    if d.get("mlp_layer_types") is None and d.get("num_hidden_layers") is not None:
        d["mlp_layer_types"] = ["dense"] + ["sparse"] * (int(d["num_hidden_layers"]) - 1)


def _mlp_layer_types_first_k_dense(d: Dict[str, Any]) -> None:
    # configuration_glm_moe_dsa.py / configuration_deepseek_v32.py __post_init__: the first
    # first_k_dense_replace layers dense, the rest sparse. (SGLang builds DeepSeek-V3.2 with a DeepSeek-V3
    # config class, which has no mlp_layer_types; transformers' DeepseekV32Config writes it: one spelling.)
    if d.get("mlp_layer_types") is None and d.get("num_hidden_layers") is not None \
            and d.get("first_k_dense_replace") is not None:
        L = int(d["num_hidden_layers"])
        n_dense = min(int(d["first_k_dense_replace"]), L)
        d["mlp_layer_types"] = ["dense"] * n_dense + ["sparse"] * (L - n_dense)


def _dsa_layer_types(d: Dict[str, Any]) -> None:
    # configuration_glm_moe_dsa.py / configuration_deepseek_v32.py: every layer is DSA.
    if d.get("layer_types") is None and d.get("num_hidden_layers") is not None:
        d["layer_types"] = ["indexed_attention"] * int(d["num_hidden_layers"])


def _glm_moe_dsa_fields(d: Dict[str, Any]) -> None:
    # configuration_glm_moe_dsa.py __post_init__, in its order: indexer_types from index_topk_pattern, else
    # from index_topk_freq / index_skip_topk_offset (the keywords stay too); head_dim is qk_rope_head_dim;
    # mlp_layer_types from first_k_dense_replace; layer_types; a num_experts keyword (BC) becomes
    # n_routed_experts.
    if d.get("indexer_types") is None and d.get("num_hidden_layers") is not None:
        pattern = d.get("index_topk_pattern")
        if pattern is not None:
            d["indexer_types"] = ([{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str)
                                  else list(pattern))
        else:
            freq = max(d.get("index_topk_freq", 1), 1)
            offset = d.get("index_skip_topk_offset", 2)
            d["indexer_types"] = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared"
                                  for i in range(int(d["num_hidden_layers"]))]
    if d.get("qk_rope_head_dim") is not None:
        d["head_dim"] = d["qk_rope_head_dim"]
    _mlp_layer_types_first_k_dense(d)
    _dsa_layer_types(d)
    experts = d.pop("num_experts", None)
    if experts is not None:
        d["n_routed_experts"] = experts


def _gpt_oss_fields(d: Dict[str, Any]) -> None:
    # configuration_gpt_oss.py __post_init__, in its order: kv heads default to heads, head_dim to
    # hidden_size // heads, layer_types alternate sliding / full (layer 0 sliding), and a YaRN rope when
    # the file gives none.
    _kv_heads_default_to_heads(d)
    if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])
    if d.get("layer_types") is None and d.get("num_hidden_layers") is not None:
        d["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                            for i in range(int(d["num_hidden_layers"]))]
    if d.get("rope_parameters") is None and d.get("rope_scaling") is None:
        d["rope_parameters"] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": 4096}


def _gemma4_text_fields(d: Dict[str, Any]) -> None:
    # configuration_gemma4.py Gemma4TextConfig.__post_init__ (layer types 5 sliding : 1 full, the last forced full;
    # per-type RoPE; full-attention layers' head_dim / kv heads as a per_layer_config, from global_head_dim and, with
    # attention_k_eq_v, num_global_key_value_heads), then SGLang's get_config flattening it
    # (hf_transformers/config.py _apply_gemma4_attention_overrides: head_dim and kv heads are the full-attention
    # layers', swa_* the sliding ones'; any other per-layer key, or two shapes within one layer type, it refuses).
    L = d.get("num_hidden_layers")
    if d.get("layer_types") is None and L is not None:
        d["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(int(L))]
    types = list(d.get("layer_types") or [])
    if types and types[-1] != "full_attention":
        types[-1] = "full_attention"
        d["layer_types"] = types
    if d.get("rope_parameters") is None:
        d["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}}
    global_head_dim = d.pop("global_head_dim", None) or 512
    global_kv_heads = d.pop("num_global_key_value_heads", None)
    per_layer = d.pop("per_layer_config", None)
    if d.get("swa_head_dim") is not None:  # SGLang's config object: flattened already
        return
    if per_layer is None:
        overrides = {"head_dim": global_head_dim}
        if d.get("attention_k_eq_v") and global_kv_heads is not None:
            overrides["num_key_value_heads"] = global_kv_heads
        per_layer = {i: overrides for i, t in enumerate(types) if t == "full_attention"}
    per_layer = {int(i): dict(o) for i, o in per_layer.items()}
    extra = sorted({k for o in per_layer.values() for k in o} - {"head_dim", "num_key_value_heads"})
    if extra:
        raise ConfigError(f"Gemma-4 config declares per-layer {extra}, which SGLang 0.5.23 refuses (it flattens "
                          "only head_dim and num_key_value_heads)")
    shapes: Dict[str, set] = {}
    for i, t in enumerate(types):
        o = per_layer.get(i, {})
        shapes.setdefault(t, set()).add((o.get("head_dim", d.get("head_dim")),
                                         o.get("num_key_value_heads", d.get("num_key_value_heads"))))
    for t, got in shapes.items():
        if len(got) > 1:
            raise ConfigError(f"Gemma-4 config gives its {t!r} layers more than one (head_dim, num_key_value_heads): "
                              f"{sorted(got, key=str)}, which SGLang 0.5.23 refuses")
    if "full_attention" in shapes:
        full = next(iter(shapes["full_attention"]))
        swa = next(iter(shapes.get("sliding_attention", shapes["full_attention"])))
        d["head_dim"], d["num_key_value_heads"] = full
        d["swa_head_dim"], d["swa_num_key_value_heads"] = swa
        d["swa_v_head_dim"] = swa[0]
        if d.get("v_head_dim") is None:
            d["v_head_dim"] = full[0]


def _llama4_text_fields(d: Dict[str, Any]) -> None:
    # configuration_llama4.py Llama4TextConfig.__post_init__, in its order.
    _kv_heads_default_to_heads(d)
    L = d.get("num_hidden_layers")
    if L is None:
        return
    L = int(L)
    if not d.get("no_rope_layers"):
        interval = int(d.get("no_rope_layer_interval", 4))
        d["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(L)]
    if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])
    step = int(d.get("interleave_moe_layer_step", 1))
    if d.get("moe_layers") is None and step:  # transformers: range(step - 1, L, step); step 0 it cannot build
        d["moe_layers"] = list(range(step - 1, L, step))
    if d.get("layer_types") is None:
        d["layer_types"] = ["chunked_attention" if no_rope else "full_attention" for no_rope in d["no_rope_layers"]]


def _qwen3_vl_moe_text_fields(d: Dict[str, Any]) -> None:
    # configuration_qwen3_vl_moe.py Qwen3VLMoeTextConfig.__post_init__: no sliding window, whatever the file says.
    _kv_heads_default_to_heads(d)
    if not d.get("head_dim") and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])
    d["sliding_window"] = None
    _mlp_only_layers_list(d)


def _qwen3_omni_moe_text_fields(d: Dict[str, Any]) -> None:
    # configuration_qwen3_omni_moe.py Qwen3OmniMoeTextConfig.__post_init__ sets mlp_only_layers only. Its class has
    # no head_dim field: a file's is kept, else both attentions (transformers' Qwen3OmniMoeThinkerTextAttention,
    # SGLang's qwen3_moe.py) take hidden_size // num_attention_heads; written here so both spellings are one view.
    if not d.get("head_dim") and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])
    _mlp_only_layers_list(d)


def _ernie4_5_moe_end_index(d: Dict[str, Any]) -> None:
    # configuration_ernie4_5_moe.py __post_init__: moe_layer_end_index -1 is the last layer.
    if d.get("moe_layer_end_index") == -1 and d.get("num_hidden_layers") is not None:
        d["moe_layer_end_index"] = int(d["num_hidden_layers"]) - 1


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
_QWEN_HYBRID_FACTS = Facts(
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

_GLM4_MOE = Facts(
    aliases={"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    defaults={"attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 10944, "max_position_embeddings": 131072, "moe_intermediate_size": 1408,
              "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
              "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
              "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05,
              "rope_theta": 10000.0, "routed_scaling_factor": 1.0, "tie_word_embeddings": False,
              "topk_group": 1, "use_qk_norm": False, "vocab_size": 151552},
    derive=(_glm4_moe_partial_rotary,),
)

# GLM-4.5V / 4.6V: the text model of Glm4vMoeForConditionalGeneration (configuration_glm4v_moe.py
# Glm4vMoeTextConfig); its config class names no MTP layers, and the published config.json has none.
_GLM4V_MOE_TEXT = Facts(
    aliases={"num_local_experts": "n_routed_experts"},
    defaults={"attention_bias": True, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 10944, "max_position_embeddings": 65536, "moe_intermediate_size": 1408,
              "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
              "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
              "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "routed_scaling_factor": 1.0,
              "tie_word_embeddings": False, "topk_group": 1, "vocab_size": 151424},
    derive=(_glm4_moe_partial_rotary,),
)

_DEEPSEEK_V3 = Facts(
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
)

_DEEPSEEK_V2 = Facts(
    aliases={"num_experts": "n_routed_experts"},
    defaults={"attention_bias": False, "first_k_dense_replace": 0, "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 11008, "kv_lora_rank": 512, "max_position_embeddings": 2048,
              "moe_intermediate_size": 1407, "n_routed_experts": 64, "n_shared_experts": 2,
              "norm_topk_prob": False, "num_attention_heads": 32, "num_hidden_layers": 32, "q_lora_rank": 1536,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_method": "greedy",
              "v_head_dim": 128, "vocab_size": 102400},
    derive=(_deepseek_v2_head_dim, _kv_heads_default_to_heads),
)

_QWEN3_MOE = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"attention_bias": False, "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048,
              "intermediate_size": 6144, "max_position_embeddings": 32768, "moe_intermediate_size": 768,
              "norm_topk_prob": False, "num_attention_heads": 32, "num_experts_per_tok": 8,
              "num_hidden_layers": 24, "num_key_value_heads": 4, "num_local_experts": 128, "rms_norm_eps": 1e-06,
              "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
              "use_sliding_window": False, "vocab_size": 151936},
    derive=(_qwen3_moe_sliding_window, _mlp_only_layers_list),
)

_QWEN2_MOE = Facts(
    aliases={},
    defaults={"decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
              "max_position_embeddings": 32768, "max_window_layers": 28, "moe_intermediate_size": 1408,
              "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
              "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "shared_expert_intermediate_size": 5632, "sliding_window": 4096, "tie_word_embeddings": False,
              "use_sliding_window": False, "vocab_size": 151936},
    derive=(_mlp_only_layers_list, _qwen2_moe_window_and_layer_types),
)

_MIXTRAL = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
              "max_position_embeddings": 131072, "num_attention_heads": 32, "num_experts_per_tok": 2,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
              "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 32000},
    derive=(_kv_heads_default_to_heads,),
)

_GLM4_MOE_LITE = Facts(
    aliases={"num_local_experts": "n_routed_experts", "head_dim": "qk_rope_head_dim"},
    defaults={"attention_bias": False, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10240,
              "kv_lora_rank": 512, "max_position_embeddings": 202752, "moe_intermediate_size": 1536, "n_group": 1,
              "n_routed_experts": 64, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 20,
              "num_experts_per_tok": 4, "num_hidden_layers": 47, "num_key_value_heads": 20, "q_lora_rank": 768,
              "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_interleave": True,
              "rope_theta": 10000.0, "routed_scaling_factor": 1.8, "tie_word_embeddings": False, "topk_group": 1,
              "v_head_dim": 256, "vocab_size": 154880},
    derive=(_glm4_moe_lite_mlp_layer_types,),
    # transformers builds its layers from mlp_layer_types; SGLang from first_k_dense_replace (a published key
    # the class keeps).
    routing_keys=("mlp_layer_types",),
)

_DSA_KEYS = ("mlp_layer_types", "index_topk", "index_head_dim", "index_n_heads", "indexer_types", "index_topk_pattern",
             "index_topk_freq", "index_skip_topk_offset")

_GLM_MOE_DSA = Facts(
    aliases={"num_local_experts": "n_routed_experts"},
    defaults={"attention_bias": False, "first_k_dense_replace": 3, "head_dim": 64, "hidden_act": "silu",
              "hidden_size": 6144, "intermediate_size": 12288, "kv_lora_rank": 512, "max_position_embeddings": 202752,
              "moe_intermediate_size": 2048, "n_group": 1, "n_routed_experts": 256, "n_shared_experts": 1,
              "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 78,
              "num_key_value_heads": 64, "q_lora_rank": 2048, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
              "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "routed_scaling_factor": 2.5, "tie_word_embeddings": False,
              "topk_group": 1, "v_head_dim": 256, "vocab_size": 154880,
              "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048},
    derive=(_glm_moe_dsa_fields,),
    # DSA's indexer (which keys each query attends to; SGLang's dsa_layer_skips_topk reads indexer_types, else
    # index_topk_pattern / index_topk_freq / index_skip_topk_offset) and transformers' per-layer MLP kinds.
    routing_keys=_DSA_KEYS,
)

# SGLang builds DeepSeek-V3.2 with its _DeepseekV32ConfigAlias, a subclass of transformers' DeepseekV3Config
# (hf_transformers/common.py): DeepSeek-V3's facts, and mlp_layer_types as transformers' DeepseekV32Config
# writes it.
_DEEPSEEK_V32 = Facts(
    aliases=_DEEPSEEK_V3.aliases,
    defaults=_DEEPSEEK_V3.defaults,
    derive=_DEEPSEEK_V3.derive + (_mlp_layer_types_first_k_dense, _dsa_layer_types),
    routing_keys=_DSA_KEYS,
)

_GPT_OSS = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"attention_bias": True, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
              "intermediate_size": 2880, "max_position_embeddings": 131072, "num_attention_heads": 64,
              "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
              "rms_norm_eps": 1e-05, "rope_theta": 150000.0, "sliding_window": 128, "swiglu_limit": 7.0,
              "tie_word_embeddings": False, "vocab_size": 201088},
    derive=(_gpt_oss_fields,),
    # the experts' clamped SwiGLU (SGLang's gpt_oss.py reads swiglu_limit)
    routing_keys=("swiglu_limit",),
)

_LLAMA4_TEXT = Facts(
    aliases={},
    defaults={"attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1,
              "attn_temperature_tuning": True, "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu",
              "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "max_position_embeddings": 131072, "no_rope_layer_interval": 4,
              "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
              "num_local_experts": 16, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
              "use_qk_norm": True, "vocab_size": 202048},
    derive=(_llama4_text_fields,),
    # which layers are MoE (SGLang: interleave_moe_layer_step; transformers: moe_layers), the dense MLP width,
    # NoPE layers and chunked attention, attention temperature tuning (llama4.py reads them all).
    routing_keys=("interleave_moe_layer_step", "moe_layers", "intermediate_size_mlp", "no_rope_layers",
                  "no_rope_layer_interval", "attention_chunk_size", "attn_temperature_tuning", "floor_scale",
                  "attn_scale"),
)

_QWEN3_VL_MOE_TEXT = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"attention_bias": False, "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048,
              "intermediate_size": 5632, "max_position_embeddings": 128000, "moe_intermediate_size": 1408,
              "num_attention_heads": 16, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
              "num_local_experts": 60, "rms_norm_eps": 1e-06, "rope_theta": 500000.0, "tie_word_embeddings": True,
              "vocab_size": 151936},
    derive=(_qwen3_vl_moe_text_fields,),
)

# transformers' Qwen3OmniMoeTextConfig (SGLang registers no class of its own for qwen3_omni_moe: transformers'
# Qwen3OmniMoeConfig is built, and its thinker_config.text_config is this class). No attribute map (num_experts is
# stored as num_experts), no tie_word_embeddings field (the thinker config holds it).
_QWEN3_OMNI_MOE_TEXT = Facts(
    aliases={},
    defaults={"attention_bias": False, "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048,
              "intermediate_size": 18944, "max_position_embeddings": 32768, "moe_intermediate_size": 768,
              "norm_topk_prob": True, "num_attention_heads": 28, "num_experts": 128, "num_experts_per_tok": 8,
              "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
              "vocab_size": 3584},
    derive=(_qwen3_omni_moe_text_fields,),
)

_ERNIE4_5_MOE = Facts(
    aliases={"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
    defaults={"hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072,
              "moe_intermediate_size": 1536, "moe_k": 6, "moe_layer_end_index": -1, "moe_layer_interval": 1,
              "moe_layer_start_index": 1, "moe_norm_min": 1e-12, "moe_num_experts": 64, "moe_num_shared_experts": 2,
              "num_attention_heads": 20, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-05,
              "rope_theta": 500000.0, "tie_word_embeddings": True, "use_bias": False, "vocab_size": 103424},
    derive=(_ernie4_5_moe_end_index,),
    routing_keys=("moe_k", "moe_num_shared_experts", "moe_layer_start_index", "moe_layer_end_index",
                  "moe_layer_interval", "moe_norm_min", "use_bias"),
)

_GRANITEMOE = Facts(
    aliases={},
    defaults={"attention_bias": False, "attention_multiplier": 1.0, "embedding_multiplier": 1.0, "hidden_act": "silu",
              "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 2048,
              "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_local_experts": 8,
              "residual_multiplier": 1.0, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "vocab_size": 32000},
    derive=(_kv_heads_default_to_heads,),
    # Granite's scalings of embeddings, residual branches and attention (granitemoe.py reads them)
    routing_keys=("embedding_multiplier", "residual_multiplier", "attention_multiplier"),
)

def _lfm2_moe_tie(d: Dict[str, Any]) -> None:
    # configuration_lfm2_moe.py __post_init__: a tie_embedding keyword is tie_word_embeddings.
    if "tie_embedding" in d:
        d["tie_word_embeddings"] = d.pop("tie_embedding")


_LFM2_MOE = Facts(
    aliases={},
    defaults={"conv_L_cache": 3, "conv_bias": False, "hidden_size": 2048, "intermediate_size": 7168,
              "max_position_embeddings": 128000, "moe_intermediate_size": 1792, "norm_eps": 1e-05,
              "norm_topk_prob": True, "num_attention_heads": 32, "num_dense_layers": 2, "num_experts": 32,
              "num_experts_per_tok": 4, "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 1000000.0,
              "routed_scaling_factor": 1.0, "tie_word_embeddings": True, "use_expert_bias": True,
              "vocab_size": 65536},
    derive=(_lfm2_moe_tie,),
    # the dense prefix, the router's expert bias, the short-conv blocks and LFM2's norm epsilon
    routing_keys=("num_dense_layers", "use_expert_bias", "conv_bias", "conv_L_cache", "norm_eps"),
)

def _afmoe_fields(d: Dict[str, Any]) -> None:
    # SGLang's configs/afmoe.py __init__: kv heads default to heads, head_dim to hidden_size // heads.
    _kv_heads_default_to_heads(d)
    if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])


# SGLang's own class (configs/afmoe.py); __init__ keyword defaults (they differ from transformers' AfmoeConfig's:
# a file that leaves them out is a different model in each, so the rule needs the keys that decide layers).
_AFMOE = Facts(
    aliases={},
    defaults={"attention_bias": False, "global_attn_every_n_layers": 4, "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 11008, "max_position_embeddings": 131072, "moe_intermediate_size": 256,
              "mup_enabled": False, "n_group": 1, "num_attention_heads": 32, "num_dense_layers": 0,
              "num_hidden_layers": 32, "num_shared_experts": 0, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "route_norm": True, "route_scale": 1.0, "score_func": "sigmoid", "tie_word_embeddings": False,
              "topk_group": 1, "vocab_size": 32000},
    derive=(_afmoe_fields,),
    routing_keys=("num_dense_layers", "num_shared_experts", "score_func", "route_norm", "route_scale",
                  "global_attn_every_n_layers", "mup_enabled"),
)

# SGLang's own class (configs/step3p5.py); __init__ keyword defaults.
_STEP3P5 = Facts(
    aliases={},
    defaults={"head_dim": 128, "hidden_size": 4096, "intermediate_size": 11264,
              "max_position_embeddings": 128000, "moe_intermediate_size": 1280,
              "moe_layers_enum": tuple(range(3, 45)), "moe_num_experts": 288, "moe_top_k": 8,
              "norm_expert_weight": True, "num_attention_groups": 8, "num_attention_heads": 64,
              "num_hidden_layers": 45, "rms_norm_eps": 1e-05, "rope_theta": 10000, "vocab_size": 128815},
    derive=(_step3p5_fields,),
)

# Gemma-4's text model (transformers' Gemma4TextConfig, which SGLang builds for gemma4 / gemma4_text): the MoE block
# is switched on for every layer by one flag, and its router is spelled num_experts / top_k_experts.
_GEMMA4_TEXT = Facts(
    aliases={},
    defaults={"attention_bias": False, "attention_k_eq_v": False, "enable_moe_block": False, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "hidden_size_per_layer_input": 256,
              "intermediate_size": 9216, "max_position_embeddings": 131072, "num_attention_heads": 8,
              "num_hidden_layers": 30, "num_key_value_heads": 4, "num_kv_shared_layers": 0, "rms_norm_eps": 1e-06,
              "rope_theta": 10000.0, "sliding_window": 512, "tie_word_embeddings": True, "use_double_wide_mlp": False,
              "vocab_size": 262144},
    derive=(_gemma4_text_fields,),
    routing_keys=("hidden_activation", "enable_moe_block", "top_k_experts", "global_head_dim", "num_global_key_value_heads",
                  "swa_head_dim", "swa_v_head_dim", "swa_num_key_value_heads",
                  "attention_k_eq_v", "num_kv_shared_layers", "hidden_size_per_layer_input", "use_double_wide_mlp",
                  "final_logit_softcapping"),
)

# Nemotron-H (SGLang's own class, configs/nemotron_h.py; transformers' NemotronHConfig spells some keys otherwise).
# Block types: SGLang's names ("mamba", "attention", "mlp", "moe"; pattern characters M * - E); transformers 5.19
# writes "linear_attention" / "full_attention" for the first two (its legacy remap), and SGLang 0.5.23 refuses a
# file that does (NemotronHConfig._validate_layers_block_type). One spelling in the view: SGLang's.
_NEMOTRON_H_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_H_NAMES = {"linear_attention": "mamba", "full_attention": "attention", "mamba": "mamba",
                     "attention": "attention", "mlp": "mlp", "moe": "moe"}


def _nemotron_h_types(value: Any, key: str) -> List[str]:
    if isinstance(value, str):
        bad = sorted(set(value) - set(_NEMOTRON_H_PATTERN))
        if bad:
            raise ConfigError(f"{key}={value!r} has characters {bad} (Nemotron-H blocks are M, *, - and E)")
        return [_NEMOTRON_H_PATTERN[c] for c in value]
    out = []
    for t in value:
        if t not in _NEMOTRON_H_NAMES:
            raise ConfigError(f"{key} has a block type {t!r} (Nemotron-H blocks are mamba, attention, mlp, moe)")
        out.append(_NEMOTRON_H_NAMES[t])
    return out


def _nemotron_h_fields(d: Dict[str, Any]) -> None:
    """SGLang's NemotronHConfig.__init__, in its order, in one spelling: the layers from layers_block_type, else
    hybrid_override_pattern (the class default pattern when neither is given), num_hidden_layers their count; the
    Mamba keywords (mamba_d_conv, mamba_conv_bias) stored under the names the file may also give (conv_kernel,
    use_conv_bias: given, they win, as the class's kwargs land after its keywords); MTP block types from
    mtp_hybrid_override_pattern where the list is the default."""
    pattern = d.pop("hybrid_override_pattern", None)
    types = d.get("layers_block_type")
    types = _nemotron_h_types(types, "layers_block_type") if types is not None else (
        _nemotron_h_types(pattern, "hybrid_override_pattern") if pattern is not None else None)
    layer_types = d.pop("layer_types", None)  # transformers' alias of layers_block_type; SGLang's class ignores it
    if layer_types is not None and (types is None or _nemotron_h_types(layer_types, "layer_types") != types):
        raise ConfigError(
            f"layer_types={list(layer_types)} (transformers' alias of layers_block_type) disagree with the layers "
            f"SGLang's NemotronHConfig builds (from layers_block_type / hybrid_override_pattern: {types})"
        )
    if types is not None:
        d["layers_block_type"] = types
        d["num_hidden_layers"] = len(types)
    for keyword, stored in (("mamba_d_conv", "conv_kernel"), ("mamba_conv_bias", "use_conv_bias")):
        value = d.pop(keyword, None)
        if d.get(stored) is None and value is not None:
            d[stored] = value
    # The Mamba mixer's groups are mamba_n_groups (keyword, default 8), its state cache's n_groups (read from the
    # file's kwargs; transformers reads n_groups, or mamba_n_groups where given): a file where they differ builds
    # a mixer that does not fit its cache.
    mixer = d.pop("mamba_n_groups", None)
    cache = d.get("n_groups")
    if cache is None:
        d["n_groups"] = mixer
    elif mixer is not None and int(mixer) != int(cache):
        raise ConfigError(
            f"n_groups={cache} but mamba_n_groups={mixer}: SGLang's NemotronHConfig builds the Mamba mixer with "
            f"mamba_n_groups (default 8) and its state cache with n_groups"
        )
    mtp = d.get("mtp_layers_block_type")
    mtp = _nemotron_h_types(mtp, "mtp_layers_block_type") if mtp is not None else None
    mtp_pattern = d.pop("mtp_hybrid_override_pattern", None)
    if mtp_pattern is not None and mtp in (None, ["attention", "moe"]):
        mtp = _nemotron_h_types(mtp_pattern, "mtp_hybrid_override_pattern")
    if mtp is not None:
        d["mtp_layers_block_type"] = mtp


# SGLang's own class (configs/nemotron_h.py); __init__ keyword defaults.
_NEMOTRON_H = Facts(
    aliases={},
    defaults={"attention_bias": False, "head_dim": 128, "hidden_size": 4096,
              "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
              "intermediate_size": 21504, "layer_norm_epsilon": 1e-05, "mamba_conv_bias": True, "mamba_d_conv": 4,
              "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_n_groups": 8, "mamba_num_heads": 128,
              "max_position_embeddings": 4096, "mlp_bias": False, "mlp_hidden_act": "relu2",
              "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
              "mtp_layers_block_type": ["attention", "moe"], "n_group": 1, "n_routed_experts": 8,
              "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts_per_tok": 2,
              "num_key_value_heads": 8, "num_nextn_predict_layers": 0, "rope_theta": 10000.0,
              "routed_scaling_factor": 1.0, "ssm_state_size": 128, "tie_word_embeddings": False, "topk_group": 1,
              "use_bias": False, "vocab_size": 131072},
    derive=(_kv_heads_default_to_heads, _nemotron_h_fields),
    # the hybrid blocks, the Mamba-2 mixer's shape and activations, the MLPs' activation and biases, the shared
    # expert's width and the latent MoE projection (nemotron_h.py and mamba.py read them)
    routing_keys=("hybrid_override_pattern", "layers_block_type", "mlp_hidden_act", "mlp_bias", "use_bias",
                  "layer_norm_epsilon", "mamba_hidden_act", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                  "mamba_n_groups", "n_groups", "mamba_d_conv", "conv_kernel", "mamba_conv_bias", "use_conv_bias",
                  "moe_shared_expert_intermediate_size", "moe_latent_size"),
)

_OLMOE = Facts(
    aliases={"num_local_experts": "num_experts"},
    defaults={"attention_bias": False, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 2048,
              "max_position_embeddings": 4096, "norm_topk_prob": False, "num_attention_heads": 16,
              "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16, "rms_norm_eps": 1e-05,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 50304},
    derive=(_kv_heads_default_to_heads,),
)



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


def _moe_layer_freq_one(v, arch) -> None:
    freq = _int(v, "moe_layer_freq", arch, default=1)
    if freq != 1:
        raise RuleError(
            f"{arch}: moe_layer_freq={freq}: SGLang 0.5.23 (deepseek_v2.py `_is_layer_sparse`) makes layer i MoE iff "
            f"i >= first_k_dense_replace and i % moe_layer_freq == 0, transformers' DeepSeek classes ignore "
            f"moe_layer_freq (MoE iff i >= first_k_dense_replace / as mlp_layer_types say): they disagree on which "
            f"layers are MoE; refusing a layout one of them would not serve"
        )


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


def _deepseek(v, arch) -> Stack:
    """DeepSeek-V2/V3/V3.2 and GLM-5 (deepseek_v2.py `_is_layer_sparse`; GlmMoeDsaForCausalLM subclasses
    DeepseekV2ForCausalLM): MoE iff layer >= first_k_dense_replace (and layer % moe_layer_freq == 0, which
    transformers ignores: moe_layer_freq != 1 is refused). NextN MTP layers are MoE."""
    _moe_layer_freq_one(v, arch)
    stack = _first_k_dense(v, arch, freq=1)
    return _mlp_layer_types_agree(v, arch, stack, "first_k_dense_replace")


def _glm4_moe(v, arch) -> Stack:
    """GLM-4.5/4.7 (glm4_moe.py `_is_layer_sparse`): SGLang, like
    transformers, ignores moe_layer_freq for Glm4Moe, so we do too."""
    return _first_k_dense(v, arch, freq=1)


def _glm4_moe_lite(v, arch) -> Stack:
    """GLM-4.7-Flash (glm4_moe_lite.py: `_is_layer_sparse` as DeepSeek's, with moe_layer_freq forced to 1 by
    its decoder layer): MoE iff layer >= first_k_dense_replace -- a key transformers' Glm4MoeLiteConfig does
    not define (SGLang reads it from the file; its absence is refused as SGLang would fail); transformers
    builds from mlp_layer_types (default: layer 0 dense), which must agree. Its NextN layer is MoE.

    q_lora_rank null (DeepSeek-V2-Lite-style attention: one q_proj, no q LoRA) is refused: glm4_moe_lite.py's
    load_weights maps every ``q_proj`` through its ``("qkv_proj", "q_proj", "q")`` stacking entry, so the
    checkpoint's q_proj never loads and SGLang serves another model (measured: 3% of (token, layer) pairs
    agreed with transformers' routers, on SGLang 0.5.15.post1 and 0.5.23 alike)."""
    if v.get("q_lora_rank") is None:
        raise RuleError(
            f"{arch}: q_lora_rank=None: SGLang (glm4_moe_lite.py load_weights) renames the checkpoint's "
            f"self_attn.q_proj through its qkv_proj stacking entry and never loads it, so it would serve "
            f"another model than the checkpoint (the published GLM-4.7-Flash sets q_lora_rank: 768); refusing"
        )
    stack = _first_k_dense(v, arch, freq=1)
    return _mlp_layer_types_agree(v, arch, stack, "first_k_dense_replace")


# Qwen3-Next checkpoints ship one MTP layer (mtp.* tensors) but their config
# declares no count; SGLang's draft sets num_nextn_predict_layers = 1 for it
# (configs/model_config.py `_config_draft_model`).
_QWEN_MTP_DEFAULT = {"Qwen3NextForCausalLM": 1}


def _qwen_moe(v, arch) -> Stack:
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
        raise RuleError(
            f"{arch}: decoder_sparse_step={step}, mlp_only_layers={dense_only} put dense MLPs in some "
            f"layers, but SGLang builds every {arch} layer as MoE; refusing a layout SGLang would not serve"
        )
    # qwen3_next.py and qwen3_5.py build their attention projections without biases whatever attention_bias says
    # (served with it, ~70% of (token, layer) pairs differed from the first full-attention layer on); the releases
    # set false. qwen3_moe.py and qwen2_moe.py (qkv_bias) honour theirs.
    if arch in _NO_ATTENTION_BIAS and v.get("attention_bias") is True:
        raise RuleError(
            f"{arch}: attention_bias=True: SGLang 0.5.23 (qwen3_next.py / qwen3_5.py) builds its attention "
            f"projections without biases, transformers adds them; refusing")
    if arch in _WINDOW_UNREAD:
        _refuse_unread_window(v, arch)
    if arch == "Qwen2MoeForCausalLM":
        _head_dim_derived(v, arch, "qwen2_moe.py")
    n_mtp = _mtp_count(v, arch, default=_QWEN_MTP_DEFAULT.get(arch, 0))
    return _stack(L, lambda i: True, E, k, n_mtp, mtp_moe=True)


_NO_ATTENTION_BIAS = ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
# transformers' Qwen3-MoE masks every layer's attention beyond sliding_window once use_sliding_window is set
# (modeling_qwen3_moe.py: create_sliding_window_causal_mask; the config class keeps the window only then), Qwen2-MoE
# the layers its layer_types make sliding; SGLang's qwen3_moe.py / qwen2_moe.py read neither key and attend to every
# key. A held-out Qwen3-MoE checkpoint with a short window was served so: 28.9% of (token, layer) pairs agreed with
# transformers' router top-k. Intern-S1's language model is qwen3_moe.py's.
_WINDOW_UNREAD = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "InternS1ForConditionalGeneration")


def _refuse_unread_window(v, arch) -> None:
    # The view's sliding_window is None / 0 unless use_sliding_window (the classes' __post_init__), and Qwen2-MoE's
    # layer_types are sliding only below max_window_layers: both keys reach the rule through those two.
    window = v.get("sliding_window")
    if not window or not v.given.get("use_sliding_window", True):
        return
    if arch == "Qwen2MoeForCausalLM" and v.given.get("max_window_layers") == 0:
        return
    layer_types = v.get("layer_types")
    if isinstance(layer_types, (list, tuple)) and "sliding_attention" not in layer_types:
        return  # Qwen2-MoE: no layer within max_window_layers is sliding
    positions = _int(v, "max_position_embeddings", arch)
    if window < positions:
        raise RuleError(
            f"{arch}: use_sliding_window=True with sliding_window={window}: transformers' {arch} masks attention "
            f"beyond the last {window} keys, SGLang 0.5.23 ({'qwen2_moe.py' if 'Qwen2' in arch else 'qwen3_moe.py'}) "
            f"reads neither key and attends to every key; refusing (set use_sliding_window false, as the releases "
            f"publish it)")


def _interns1(v, arch) -> Stack:
    """Intern-S1: interns1.py builds its language model by text_config.architectures -- qwen3_moe.py's
    Qwen3MoeForCausalLM for Intern-S1 (Qwen3-MoE's layers: every layer MoE), a dense Qwen2 / Qwen3 for
    Intern-S1-mini (no routers: nothing to replay). The vision tower's tokens reach the rows as tokens of the
    same layers."""
    if v.model_type != "qwen3_moe":  # a text_config without model_type is Qwen2's to its config class
        raise RuleError(
            f"{arch}: its text_config is not Qwen3-MoE's (model type read: {v.model_type!r}): interns1.py builds a "
            f"dense Qwen2 / Qwen3 language model for it (Intern-S1-mini), which has no routers to replay; refusing")
    return _qwen_moe(v, arch)


def _head_dim_from_widths(d: Dict[str, Any]) -> None:
    if not d.get("head_dim") and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]


# Ling / Ring 2.0's config class is the release's own code (inclusionAI/Ling-V2 af8837e
# models/configuration_bailing_moe_v2.py; the tests' stand-in takes its keywords and defaults). Ling 1.x publishes the
# same model type with another class (configuration_bailing_moe.py); it has no rule.
_BAILING_MOE_V2 = Facts(
    aliases={},
    defaults={"first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
              "intermediate_size": 5120, "max_position_embeddings": 32768, "max_window_layers": 20,
              "moe_intermediate_size": 512, "moe_router_enable_expert_bias": True, "mtp_loss_scaling_factor": 0,
              "n_group": 8, "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 20,
              "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
              "rms_norm_eps": 1e-06, "rope_theta": 600000.0, "routed_scaling_factor": 1.0,
              "tie_word_embeddings": False, "topk_group": 4, "use_bias": False, "use_qk_norm": True,
              "use_qkv_bias": False, "vocab_size": 157184},
    derive=(_head_dim_from_widths,),
    # Keys of the published config.json the class keeps and SGLang's bailing_moe.py reads.
    routing_keys=("use_qkv_bias", "use_bias", "num_shared_experts", "moe_shared_expert_intermediate_size",
                  "moe_router_enable_expert_bias", "score_function", "router_dtype", "norm_head", "rotary_dim",
                  "multi_gate", "router_type"),
)

# Ling / Ring 2.0's modeling code, the release's own (inclusionAI/Ling-V2 af8837e models/modeling_bailing_moe_v2.py),
# against which SGLang 0.5.23's bailing_moe.py is compared key by key below.
_LING_V2_CODE = "the release's modeling_bailing_moe_v2.py"


def _bailing_moe_v2(v, arch) -> Stack:
    """Ling / Ring 2.0 (bailing_moe.py `_is_layer_sparse`): layer i MoE iff num_experts is set and i >=
    first_k_dense_replace; the NextN layer MoE (``is_nextn or ...``), one at most (load_weights asserts it).

    SGLang reads some keys the release's code never reads (it always scores by sigmoid over an expert bias with
    grouped top-k in float32, renormalises the top-k weights, sizes the shared expert moe_intermediate_size *
    num_shared_experts, rotates partial_rotary_factor of each head and has no query_key_value bias for use_bias):
    a config on which the two disagree is served as another model than the checkpoint's, so it is refused,
    naming the key. Its config class is the release's own code (SGLang loads it with --trust-remote-code): the
    facts are its keywords' defaults."""
    router = v.get("router_type")
    if v.get("multi_gate") or router == "MultiRouter":
        raise RuleError(f"{arch}: multi_gate / router_type={router!r}: bailing_moe.py then routes image and audio "
                        f"tokens through gates of their own (Ming's multimodal routers), not described; refusing")
    disagree = []
    if v.get("moe_router_enable_expert_bias") is not True:
        disagree.append("moe_router_enable_expert_bias must be true (without it SGLang drops the expert bias the "
                        f"release's gate always adds, and scores by softmax)")
    if v.get("score_function") not in (None, "sigmoid"):
        disagree.append(f"score_function={v.get('score_function')!r} (the release always scores by sigmoid)")
    if v.get("norm_topk_prob") is not True:
        disagree.append(f"norm_topk_prob={v.get('norm_topk_prob')!r} (the release always renormalises the top-k "
                        f"weights, SGLang only when it is true)")
    if v.get("router_dtype") != "fp32":
        disagree.append(f"router_dtype={v.get('router_dtype')!r} (the release computes router logits in float32, "
                        f"SGLang only for 'fp32', else in the model's or bfloat16)")
    if v.get("use_bias"):
        disagree.append("use_bias=true (SGLang then adds a query_key_value bias the release does not have)")
    if v.get("norm_head"):
        disagree.append("norm_head=true (SGLang then normalises lm_head's rows at load, the release does not)")
    shared = v.get("moe_shared_expert_intermediate_size")
    if shared is not None and shared != v.get("moe_intermediate_size"):
        disagree.append(f"moe_shared_expert_intermediate_size={shared} (SGLang sizes the shared expert by it, times "
                        f"num_shared_experts; the release by moe_intermediate_size)")
    partial = v.get("partial_rotary_factor", (v.get("rope_parameters") or {}).get("partial_rotary_factor"))
    if partial is None and v.get("rotary_dim") not in (None, v.get("head_dim")):
        disagree.append(f"rotary_dim={v.get('rotary_dim')} without partial_rotary_factor (SGLang rotates "
                        f"rotary_dim, the release the whole head)")
    if disagree:
        raise RuleError(f"{arch}: SGLang 0.5.23's bailing_moe.py and {_LING_V2_CODE} (inclusionAI/Ling-V2) would "
                        f"compute different models: " + "; ".join(disagree) + "; refusing")
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    first_dense = _int(v, "first_k_dense_replace", arch)
    n_mtp = _mtp_count(v, arch, default=0)
    if n_mtp > 1:
        raise RuleError(f"{arch}: num_nextn_predict_layers={n_mtp}: bailing_moe.py loads one NextN layer "
                        f"(load_weights: 'Only 1 nextn layer is supported'); refusing")
    return _stack(L, lambda i: i >= first_dense, E, k, n_mtp, mtp_moe=True)


def _mimo(v, arch) -> Stack:
    """MiMo-7B: a dense Qwen2-style model; its MTP layers are dense Qwen2
    decoder layers too (mimo_mtp.py), so they carry no router."""
    L = _int(v, "num_hidden_layers", arch)
    return _stack(L, lambda i: False, 0, 0, _mtp_count(v, arch, default=0), mtp_moe=False)


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


def _mixtral(v, arch) -> Stack:
    """Mixtral: every layer MoE. SGLang's mixtral.py sizes its heads hidden_size // num_attention_heads whatever
    head_dim says, while its KV pool and transformers' MixtralForCausalLM use head_dim: served with head_dim 32
    (hidden 64, 4 heads), the first forward stopped on a shape mismatch. Another head_dim is refused, and a
    sliding window shorter than the context (served with 8, rows differed)."""
    hidden, heads, head_dim = _int(v, "hidden_size", arch), _int(v, "num_attention_heads", arch), v.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise RuleError(
            f"{arch}: head_dim={head_dim} is not hidden_size // num_attention_heads = {hidden // heads}: SGLang 0.5.23 "
            f"(mixtral.py) sizes its attention heads from the latter, transformers from head_dim; refusing")
    # mixtral.py attends to every key; transformers' Mixtral masks beyond sliding_window (the releases set null).
    window, positions = v.get("sliding_window"), _int(v, "max_position_embeddings", arch)
    if window is not None and window < positions:
        raise RuleError(
            f"{arch}: sliding_window={window}: SGLang 0.5.23 (mixtral.py) attends to every key, transformers' "
            f"Mixtral only to the last {window}; refusing")
    return _every_layer_moe(v, arch)


def _olmoe(v, arch) -> Stack:
    """OLMoE: every layer MoE. SGLang's olmoe.py builds its attention without biases, without clipping q/k/v and
    its experts without renormalising top-k weights, whatever attention_bias, clip_qkv and norm_topk_prob say;
    transformers' OlmoeForCausalLM honours each (served with the three set, 105 of 106 (token, layer) pairs
    differed). The published configs set none of them; a config that does is refused naming the key."""
    for key, served in (("attention_bias", False), ("clip_qkv", None), ("norm_topk_prob", False)):
        if (v.get(key) or served) != served:
            raise RuleError(
                f"{arch}: {key}={v.get(key)!r}: SGLang 0.5.23 (olmoe.py) ignores it (builds as if {key}={served!r}), "
                f"transformers' OlmoeForCausalLM applies it; refusing")
    _head_dim_derived(v, arch, "olmoe.py")
    return _every_layer_moe(v, arch)


def _granitemoe(v, arch) -> Stack:
    """Granite-MoE (granitemoe.py: every decoder layer GraniteMoeMoE). Its attention projections have no biases
    whatever attention_bias says; transformers' GraniteMoe honours it (served with it set, 36 of 106 greedy
    (token, layer) pairs differed). The published configs leave it false; a config that sets it is refused."""
    if v.get("attention_bias") is True:
        raise RuleError(f"{arch}: attention_bias=True: SGLang 0.5.23 (granitemoe.py) builds its attention without "
                        f"biases, transformers' GraniteMoe applies them; refusing")
    _head_dim_derived(v, arch, "granitemoe.py")
    return _every_layer_moe(v, arch)


def _gemma4(v, arch) -> Stack:
    """Gemma-4 (gemma4_causal.py ``Gemma4DecoderLayer``): with ``enable_moe_block`` every decoder layer runs a
    router (``Gemma4Router``: norm, scale, projection; softmax top-k in ``Gemma4MoE``'s routing function) and
    experts beside its dense MLP; without it none does (the dense Gemma-4 31B). No MTP layers: Gemma-4's drafter
    is a separate assistant checkpoint."""
    L = _int(v, "num_hidden_layers", arch)
    if not v.get("enable_moe_block"):
        return _stack(L, lambda i: False, 0, 0)
    return _stack(L, lambda i: True, _int(v, "num_experts", arch), _int(v, "top_k_experts", arch))


def _llama4(v, arch) -> Stack:
    """Llama 4 text (llama4.py `_is_moe_layer`): MoE iff (layer + 1) % interleave_moe_layer_step == 0 (every
    layer when the step is 0), num_local_experts experts, top num_experts_per_tok (top-1, sigmoid after the
    top-k: ids are plain experts). transformers builds from moe_layers (default: the same interleave); a
    config whose moe_layers disagree is refused. No MTP."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_local_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    step = _int(v, "interleave_moe_layer_step", arch, default=1)
    stack = _stack(L, (lambda i: E > 0) if step == 0 else (lambda i: (i + 1) % step == 0), E, k)
    given = v.get("moe_layers")
    if given is not None and sorted(int(i) for i in given) != list(stack.moe):
        raise RuleError(
            f"{arch}: moe_layers={list(given)} (what transformers builds its MoE layers from) disagree with "
            f"interleave_moe_layer_step={step} (what SGLang 0.5.23 builds them from: MoE layers {list(stack.moe)}); "
            f"refusing a layout one of them would not serve"
        )
    return stack


def _ernie4_5_moe(v, arch) -> Stack:
    """ERNIE-4.5-MoE (ernie4.py): MoE iff moe_layer_start_index <= layer <= moe_layer_end_index and
    (layer - start) % moe_layer_interval == 0; transformers counts (layer + 1) % moe_layer_interval == 0, so
    an interval other than 1 is refused (they disagree). Its MTP layers (ernie4_eagle.py, built with
    is_mtp=True) are dense."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "moe_num_experts", arch)
    k = _int(v, "moe_k", arch)
    start = _int(v, "moe_layer_start_index", arch)
    end = _int(v, "moe_layer_end_index", arch)
    interval = _int(v, "moe_layer_interval", arch)
    if interval != 1:
        raise RuleError(
            f"{arch}: moe_layer_interval={interval}: SGLang 0.5.23 (ernie4.py) makes layer i MoE iff "
            f"(i - moe_layer_start_index) % interval == 0, transformers iff (i + 1) % interval == 0: they disagree "
            f"on which layers are MoE; refusing a layout one of them would not serve"
        )
    # transformers' Ernie4_5_Moe gives its lm_head a bias with use_bias; SGLang's ernie4.py builds none, and start-up
    # stopped loading the checkpoint ("Parameter 'lm_head.bias' not found in model"). The releases set false.
    if v.get("use_bias") is True:
        raise RuleError(
            f"{arch}: use_bias=True: transformers' Ernie4_5_Moe then saves an lm_head.bias, which SGLang 0.5.23 "
            f"(ernie4.py) has no parameter for; refusing")
    return _stack(L, lambda i: start <= i <= end, E, k, _mtp_count(v, arch, default=0), mtp_moe=False)


def _lfm2_moe(v, arch) -> Stack:
    """LFM2-MoE (lfm2_moe.py, as transformers): layers below num_dense_layers dense, the rest MoE (sigmoid
    routing with an expert bias: plain expert ids), short-conv or attention alike. No MTP."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    dense = _int(v, "num_dense_layers", arch)
    _head_dim_derived(v, arch, "lfm2_moe.py")
    return _stack(L, lambda i: i >= dense, E, k)


def _afmoe(v, arch) -> Stack:
    """AFMoE / Arcee Trinity (afmoe.py, as transformers): layers below num_dense_layers dense, the rest MoE.
    SGLang's own AfmoeConfig leaves layer_types None when the file has none (every layer full attention),
    transformers derives sliding layers from global_attn_every_n_layers: such a file is two different models,
    so it is refused."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    dense = _int(v, "num_dense_layers", arch)
    if v.get("layer_types") is None:
        raise RuleError(
            f"{arch}: the config has no layer_types: SGLang 0.5.23's AfmoeConfig then builds every layer with full "
            f"attention, transformers' derives sliding-window layers from global_attn_every_n_layers (two "
            f"different models); refusing"
        )
    # transformers' AfmoeTokenChoiceRouter always scores with a sigmoid, picks on score + expert_bias and
    # renormalises, in one group; SGLang's afmoe.py follows score_func, route_norm and n_group / topk_group.
    # Served with attention_bias set, the rows differed: afmoe.py builds no attention biases.
    for key, served in (("score_func", "sigmoid"), ("route_norm", True), ("n_group", 1), ("attention_bias", False)):
        if v.get(key, served) != served:
            raise RuleError(
                f"{arch}: {key}={v.get(key)!r}: SGLang 0.5.23 (afmoe.py) and transformers' AfmoeForCausalLM "
                f"compute different models unless {key}={served!r} (as published); refusing")
    return _stack(L, lambda i: i >= dense, E, k)


def _minimax_m2(v, arch) -> Stack:
    """MiniMax-M2 (minimax_m2.py: every decoder layer sparse). transformers' MiniMaxM2 always normalises q and
    k over all heads; SGLang only when use_qk_norm is true (getattr default False), as the published config
    says: a config without it is two different models, refused."""
    if v.get("use_qk_norm") is not True:
        raise RuleError(
            f"{arch}: use_qk_norm={v.get('use_qk_norm')!r}: SGLang 0.5.23 (minimax_m2.py) then builds no q/k norm, "
            f"transformers' MiniMaxM2 always applies one (the published config sets use_qk_norm: true); refusing"
        )
    # Served with use_routing_bias false, 56 of 159 (token, layer) pairs differed from transformers' routers.
    if v.get("use_routing_bias") is not True:
        raise RuleError(
            f"{arch}: use_routing_bias={v.get('use_routing_bias')!r}: SGLang (minimax_m2.py) then builds no "
            f"e_score_correction_bias and ignores the checkpoint's, transformers' MiniMaxM2 always adds it to the "
            f"choice (the published config sets use_routing_bias: true); refusing"
        )
    # Partial RoPE: SGLang rotates rotary_dim dims (getattr default head_dim); transformers 5.19 rotates
    # head_dim * partial_rotary_factor, the factor derived from rotary_dim when only that is given
    # (MiniMaxM2Config.__post_init__). Served with the factor alone, 46 of 159 pairs differed.
    head_dim = _int(v, "head_dim", arch)
    rotary_dim = v.get("rotary_dim")
    factor = (v.get("rope_parameters") or {}).get("partial_rotary_factor")
    if factor is None:
        factor = rotary_dim / head_dim if rotary_dim is not None else 1.0
    sglang_dims = rotary_dim if rotary_dim is not None else head_dim
    if sglang_dims != round(head_dim * factor):
        raise RuleError(
            f"{arch}: rotary_dim={rotary_dim!r} with partial_rotary_factor={factor!r} and head_dim={head_dim}: SGLang "
            f"(minimax_m2.py) rotates rotary_dim={sglang_dims} dims, transformers' MiniMaxM2 "
            f"head_dim * partial_rotary_factor={head_dim * factor:g}; set rotary_dim to match (as published); refusing"
        )
    if v.get("scoring_func") != "sigmoid":
        raise RuleError(
            f"{arch}: scoring_func={v.get('scoring_func')!r}: SGLang's TopK scores with it, transformers' "
            f"MiniMaxM2 always takes the sigmoid (the published config sets scoring_func: sigmoid); refusing"
        )
    return _every_layer_moe(v, arch)


def _nemotron_h(v, arch) -> Stack:
    """Nemotron-H (nemotron_h.py): one decoder layer per block of layers_block_type / hybrid_override_pattern
    (Mamba-2, attention, MLP or MoE, as Megatron numbers them), MoE iff the block is "moe" ('E'): a TopK over
    n_routed_experts (sigmoid scores, e_score_correction_bias, grouped top-k), num_experts_per_tok.

    Refused, naming the key, where SGLang 0.5.23 and transformers' NemotronH build different models, or where
    SGLang does not serve: num_nextn_predict_layers > 1 (nemotron_h_mtp.py asserts one MTP layer), an MTP block
    pattern (mtp_layers_block_type / mtp_hybrid_override_pattern) with Mamba or MLP blocks (it builds attention and
    MoE blocks only) or more than one MoE block (one router per MTP layer in the record); n_shared_experts other
    than 1
    (SGLang widens the shared expert by it, transformers builds one of moe_shared_expert_intermediate_size
    whatever it says), mlp_hidden_act other than relu2 (SGLang's dense and shared MLPs are ReLU^2 whatever it
    says), mamba_hidden_act other than silu (SGLang's convolution kernels apply silu or nothing), mlp_bias
    (SGLang's shared expert has no bias), sliding_window (SGLang windows its attention, transformers does not)."""
    types = v.get("layers_block_type")
    if types is None:
        raise RuleError(f"{arch} config is missing 'hybrid_override_pattern' (or 'layers_block_type'), which its "
                        f"layout rule needs")
    L = len(types)
    E = _int(v, "n_routed_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    n_mtp = _int(v, "num_nextn_predict_layers", arch, default=0)
    refusals = []
    # One MTP layer (Nemotron-3-Ultra's head: attention then MoE, "*E"): SGLang's draft runs its blocks in order,
    # eh_proj of [embedding; hidden] first, one final norm last (nemotron_h_mtp.py).
    mtp_blocks = list(v.get("mtp_layers_block_type") or []) if n_mtp else []
    if n_mtp > 1:
        refusals.append(f"num_nextn_predict_layers={n_mtp}: SGLang's nemotron_h_mtp.py serves one MTP layer "
                        f"(it asserts so)")
    if set(mtp_blocks) - {"attention", "moe"}:
        refusals.append(f"mtp_layers_block_type={mtp_blocks}: SGLang's nemotron_h_mtp.py builds attention and MoE "
                        f"blocks only")
    if mtp_blocks.count("moe") > 1:
        refusals.append(f"mtp_layers_block_type={mtp_blocks}: {mtp_blocks.count('moe')} MoE blocks in one MTP "
                        f"layer (the record holds one router per MTP layer)")
    shared = _int(v, "n_shared_experts", arch)
    if shared != 1:
        refusals.append(f"n_shared_experts={shared}: SGLang builds a shared expert "
                        f"moe_shared_expert_intermediate_size * n_shared_experts wide (none for 0), transformers' "
                        f"NemotronH one moe_shared_expert_intermediate_size wide")
    if v.get("mlp_hidden_act") != "relu2":
        refusals.append(f"mlp_hidden_act={v.get('mlp_hidden_act')!r}: SGLang's dense and shared-expert MLPs are "
                        f"ReLU^2 whatever it says, transformers' NemotronH applies it")
    if v.get("mamba_hidden_act") not in ("silu", "swish"):
        refusals.append(f"mamba_hidden_act={v.get('mamba_hidden_act')!r}: SGLang's causal convolution applies silu "
                        f"or nothing, transformers' NemotronH applies it")
    if v.get("mlp_bias"):
        refusals.append("mlp_bias=True: SGLang's shared expert has no bias, transformers' NemotronH gives it one")
    if v.get("sliding_window") is not None:
        refusals.append(f"sliding_window={v.get('sliding_window')!r}: SGLang windows the attention layers by it, "
                        f"transformers' NemotronH attends to every key")
    if refusals:
        raise RuleError(f"{arch}: " + "; ".join(refusals) + "; refusing")
    return _stack(L, lambda i: types[i] == "moe", E, k, n_mtp, mtp_moe="moe" in mtp_blocks)


# step3p5_mtp.py builds every MTP layer's block as Step3p5DecoderLayer(layer_id=45) ("FIXME"): each
# depth reads layer 45's entries of moe_layers_enum / layer_types / swiglu_limits.
_STEP3P5_MTP_LAYER_ID = 45


def _step3p5(v, arch) -> Stack:
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
        raise RuleError(f"{arch} config is missing 'moe_layers_enum', which its layout rule needs")
    sparse = {int(x) for x in enum}
    n_mtp = _mtp_count(v, arch, default=0)
    if n_mtp:
        if L != _STEP3P5_MTP_LAYER_ID:
            raise RuleError(
                f"{arch}: num_hidden_layers={L}, but SGLang 0.5.23 builds every Step-3.5 MTP layer as layer "
                f"{_STEP3P5_MTP_LAYER_ID} (step3p5_mtp.py); refusing a layout SGLang would not serve"
            )
        says = {L + j: (L + j) in sparse for j in range(n_mtp)}
        if len(set(says.values())) > 1:
            raise RuleError(
                f"{arch}: moe_layers_enum makes MTP layers {sorted(i for i, s in says.items() if s)} MoE and "
                f"{sorted(i for i, s in says.items() if not s)} dense, but SGLang 0.5.23 builds all of them as "
                f"layer {_STEP3P5_MTP_LAYER_ID}; refusing a layout SGLang would not serve"
            )
    return _stack(L, lambda i: i in sparse, E, k, n_mtp, mtp_moe=_STEP3P5_MTP_LAYER_ID in sparse)


_MINIMAX_M2 = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
              "max_position_embeddings": 196608, "num_attention_heads": 48, "num_experts_per_tok": 8,
              "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256, "rms_norm_eps": 1e-06,
              "rope_theta": 5000000.0, "tie_word_embeddings": False, "vocab_size": 200064},
    # Published config.json keys transformers' class keeps and SGLang's minimax_m2.py reads.
    routing_keys=("use_routing_bias", "qk_norm_type", "rotary_dim"),
)

# Families SGLang 0.5.23 serves whose routing sglang-r3 cannot describe exactly: refused at start-up, by name.
_ZERO_EXPERTS = (
    "its routers pick among n_routed_experts + zero_expert_num ids, and ids >= n_routed_experts are "
    "zero-computation (identity) experts with no expert weights and no Megatron router column: a record "
    "could not be replayed as plain expert choices"
)

_GEMMA4_TEXT_ONLY_REFUSAL = (
    "a text-only Gemma-4 checkpoint (Gemma4ForCausalLM, model_type gemma4_text) is not read by SGLang 0.5.23: its "
    "get_config copies text_config keys the config lacks with hasattr(config, key), and transformers' Gemma4TextConfig "
    "raises AmbiguousGlobalPerLayerAttributeError for per-layer keys (head_dim, num_key_value_heads) instead of "
    "AttributeError; serve the checkpoint as published (Gemma4ForConditionalGeneration)"
)

_DBRX_REFUSAL = (
    "dbrx.py keeps its experts as raw weight tensors allocated on CUDA and run through fused_experts (no FusedMoE "
    "module), so the start-up check cannot read the experts SGLang served; and its routing lives in a nested "
    "ffn_config (moe_num_experts, moe_top_k) that the config view does not resolve"
)
# DeepSeek-V4 (deepseek_v4.py) as Miles trains it (scripts/models/deepseek-v4-flash.py, deepseek-v4-pro.py). Where
# plain SGLang stops on the CPU runtime is checked by tests/test_gpu_only_families.py (SGLang itself the oracle).
_DEEPSEEK_V4_REFUSAL = (
    "SGLang 0.5.23 serves it on GPU kernels only, so no rule can be proven by a served forward on the CPU runtime: "
    "there its load stops compiling the mHC kernels for a CUDA device (deepseek_v4.py _prewarm_mhc_kernels, "
    "kernels/ops/layernorm/mhc.py prewarm_mhc_pre); past that, its KV cache defaults to FP8 (arg_groups/overrides.py "
    "_deepseek_v4_kv_cache_dtype), which SGLang's CPU path holds only on Intel AMX with its intel_amx backend "
    "(mem_cache/kv_cache_configurator.py), its KV pool asserts the published head widths in FP8 "
    "(mem_cache/deepseek_v4_memory_pool.py) and its attention is FlashMLA's (layers/attention/deepseek_v4_backend.py, "
    "--dsv4-attn-backend flashmla / flashmla_mega / trtllm). A checkpoint saved by transformers 5.19's "
    "DeepseekV4ForCausalLM is not read at all (SGLang reads compress_ratios, transformers writes compress_rates and "
    "layer_types). Its first num_hash_layers MoE layers route by a token-id table (HashTopK's tid2eid), not a "
    "learned router: Miles replays them into its own Megatron's hash router (mlp.router.tid2eid, "
    "dsv4_n_hash_layers), which megatron-core 0.16.1, where sglang-r3 replays, does not have"
)
_MIMO_V2_REFUSAL = (
    "SGLang builds its layers from per-layer lists (moe_layer_freq, hybrid_layer_pattern, swa_*) that "
    "transformers' MiMoV2FlashConfig ignores (it derives mlp_layer_types, layer_types and per-attention-type "
    "rope_parameters instead), and its 3 dense MTP layers are served either as one draft layer "
    "(_config_draft_model forces num_nextn_predict_layers=1) or by multi-layer EAGLE, which sglang-r3 has not "
    "proven for it: the checkpoint's MTP layout is not what SGLang builds"
)

# Inkling (inkling.py, inkling_common/) as Miles trains it (scripts/models/inkling.py). Where plain SGLang stops on
# the CPU runtime is checked by tests/test_gpu_only_families.py (SGLang itself the oracle).
_INKLING_REFUSAL = (
    "SGLang 0.5.23 serves it on GPU kernels only, so no rule can be proven by a served forward on the CPU runtime: "
    "inkling.py asserts the Mamba cache's extra buffer (its short convolutions' state snapshots), which SGLang's "
    "start-up refuses there (arg_groups/mamba_hook.py validate_mamba_extra_buffer: 'extra_buffer requires platform "
    "support for Mamba cache state snapshots'); past that, its attention asserts the fa4 or triton backend "
    "(inkling_common/attn.py InklingAttention) and its routers are InklingGate (inkling_common/moe.py), not SGLang's "
    "TopK: Triton gate kernels (gate_topk, sigmoid_gate_topk_renorm) whose weights renormalise over the routed and "
    "the shared experts' logits, handing top-k ids to the experts capturer directly. Its trainer is Miles' own plugin "
    "(miles_plugins/models/inkling InklingRouter), replayed by Miles' routing_replay_manager, not by Megatron's "
    "RouterReplay or slime's RoutingReplay, which sglang-r3 installs into"
)

# Found by serving a tiny checkpoint saved by transformers' HunYuanMoEV1ForCausalLM (tests/test_families.py).
_HUNYUAN_V1_MOE_REFUSAL = (
    "SGLang 0.5.23's hunyuan.py serves no config as transformers' HunYuanMoEV1 computes it. With use_qk_norm true "
    "(as tencent/Hunyuan-A13B publishes it) it hands RadixAttention its queries as [tokens * heads, head_dim] after "
    "the QK norm, which radix_attention.py's padded-extend check (graph_utils.padded_extend_real_tokens) reads as "
    "padding: a prefill attends with the first `tokens` rows only, on every device (on the CPU runtime the first "
    "prefill stops on a shape mismatch); without it SGLang builds no QK norm, which transformers' HunYuanMoEV1 "
    "always applies"
)

# Intern-S1-Pro: its config class is the checkpoint's own code (model_type interns1_pro: neither transformers 5.19
# nor SGLang 0.5.23 defines it).
_INTERNS1_PRO_REFUSAL = (
    "no rule proven yet: its config class is the checkpoint's own code, so neither the sweep nor a served forward has "
    "built it here. interns1pro.py is Qwen3-VL-MoE's wrapper with its own text attention (InternS1ProTextAttention, "
    "FoPE weights) over qwen3_moe.py's decoder layers"
)

_LLAMA4_TEXT_ONLY_REFUSAL = (
    "SGLang 0.5.23 serves it with llama4.py, which loads q_proj / k_proj as the checkpoint holds them (llama.py "
    "load_weights) and rotates half-split (neox) pairs, while transformers' Llama 4 rotates interleaved pairs: "
    "SGLang's Llama4ForConditionalGeneration converts the weights at load (mllama4.py "
    "permute_qk_weight_for_rotary), its Llama4ForCausalLM does not, so a transformers checkpoint is served as another "
    "model and routes otherwise (tests/test_families.py); serve the Llama4ForConditionalGeneration checkpoint"
)

# deepseek_v2.py's DeepseekV2DecoderLayer._is_layer_sparse reads config.moe_layer_freq (0.5.15.post1 and 0.5.23);
# transformers' DeepseekV2 / V3 / V3.2 and GlmMoeDsa config classes have no such field, so their save omits it.
# (GLM-4.7-Flash's glm4_moe_lite.py sets it to 1 itself.)
_DEEPSEEK_V2_LAYER_KEYS = {"moe_layer_freq": (1, "deepseek_v2.py DeepseekV2DecoderLayer._is_layer_sparse")}
# deepseek_v2.py's DeepseekV2MoE reads config.topk_method too; transformers' DeepSeek-V2 class declares it (and saves
# it), V3's, V3.2's and GLM-5's do not: their routers are noaux_tc's, as the releases publish.
_DEEPSEEK_V3_LAYER_KEYS = {**_DEEPSEEK_V2_LAYER_KEYS,
                           "topk_method": ("noaux_tc", "deepseek_v2.py DeepseekV2MoE.__init__")}

# --- the registry ------------------------------------------------------------------------------------------

FAMILIES: Tuple[Family, ...] = (
    Family("GLM-4.5 / 4.7", {"Glm4MoeForCausalLM": "glm4_moe"}, {"glm4_moe": _GLM4_MOE}, _glm4_moe,
           mtp=MTP_NEXTN),
    # glm4v_moe.py builds its language model from glm4_moe.py's Glm4MoeModel: the same layers as GLM-4.5.
    Family("GLM-4.5V / 4.6V (text)", {"Glm4vMoeForConditionalGeneration": "glm4v_moe"},
           {"glm4v_moe_text": _GLM4V_MOE_TEXT}, _glm4_moe, text_model_types={"glm4v_moe": "glm4v_moe_text"}),
    Family("DeepSeek-V3", {"DeepseekV3ForCausalLM": "deepseek_v3"}, {"deepseek_v3": _DEEPSEEK_V3}, _deepseek,
           mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    # Kimi-K2.5: kimi_k25.py builds its language model as deepseek_v2.py's DeepseekV3ForCausalLM from text_config
    # (published: model_type deepseek_v3, no MTP layers).
    Family("Kimi-K2.5 (text)", {"KimiK25ForConditionalGeneration": "kimi_k25"}, {"deepseek_v3": _DEEPSEEK_V3},
           _deepseek, text_model_types={"kimi_k25": "deepseek_v3"}, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    Family("DeepSeek-V2", {"DeepseekV2ForCausalLM": "deepseek_v2"}, {"deepseek_v2": _DEEPSEEK_V2}, _deepseek,
           mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V2_LAYER_KEYS),
    Family("GLM-4.7-Flash", {"Glm4MoeLiteForCausalLM": "glm4_moe_lite"}, {"glm4_moe_lite": _GLM4_MOE_LITE},
           _glm4_moe_lite, mtp=MTP_NEXTN),
    Family("GLM-5 (DSA)", {"GlmMoeDsaForCausalLM": "glm_moe_dsa"}, {"glm_moe_dsa": _GLM_MOE_DSA}, _deepseek,
           mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    Family("DeepSeek-V3.2 (DSA)", {"DeepseekV32ForCausalLM": "deepseek_v32"}, {"deepseek_v32": _DEEPSEEK_V32},
           _deepseek, mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    Family("Qwen3-MoE", {"Qwen3MoeForCausalLM": "qwen3_moe"}, {"qwen3_moe": _QWEN3_MOE}, _qwen_moe),
    Family("Qwen2-MoE", {"Qwen2MoeForCausalLM": "qwen2_moe"}, {"qwen2_moe": _QWEN2_MOE}, _qwen_moe),
    Family("Qwen3-Next", {"Qwen3NextForCausalLM": "qwen3_next"}, {"qwen3_next": _QWEN_HYBRID_FACTS}, _qwen_moe,
           mtp=MTP_NEXTN),
    # Qwen3.5-MoE's text config is Qwen3-Next's (same class defaults in transformers 5.19).
    Family("Qwen3.5-MoE",
           {"Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text"},
           {"qwen3_5_moe_text": _QWEN_HYBRID_FACTS}, _qwen_moe, mtp=MTP_NEXTN,
           text_model_types={"qwen3_5_moe": "qwen3_5_moe_text"}),
    # MiMo's config class is the checkpoint's own code: no facts.
    Family("MiMo-7B", {"MiMoForCausalLM": ""}, {}, _mimo, mtp=MTP_NEXTN),
    Family("Mixtral", {"MixtralForCausalLM": "mixtral"}, {"mixtral": _MIXTRAL}, _mixtral),
    Family("OLMoE", {"OlmoeForCausalLM": "olmoe"}, {"olmoe": _OLMOE}, _olmoe),
    Family("Step-3.5", {"Step3p5ForCausalLM": "step3p5"}, {"step3p5": _STEP3P5}, _step3p5,
           mtp=MTP_MULTI_LAYER, multi_layer_capture=True),
    # minimax_m2.py declares every decoder layer sparse (declare_ffn(sparse=True)); its MTP modules are not
    # built by SGLang 0.5.23's draft path for it, so no MTP layers.
    Family("MiniMax-M2", {"MiniMaxM2ForCausalLM": "minimax_m2"}, {"minimax_m2": _MINIMAX_M2}, _minimax_m2),
    # gpt_oss.py: every decoder layer GptOssSparseMoeBlock (TopK over num_local_experts, renormalized after
    # top-k); attention sinks and alternating sliding windows change the hidden states, not which layers route.
    Family("gpt-oss", {"GptOssForCausalLM": "gpt_oss"}, {"gpt_oss": _GPT_OSS}, _every_layer_moe),
    Family("Llama 4", {"Llama4ForConditionalGeneration": "llama4"},
           {"llama4_text": _LLAMA4_TEXT}, _llama4, text_model_types={"llama4": "llama4_text"}),
    Family("Llama 4 text-only", {"Llama4ForCausalLM": "llama4_text"}, refusal=_LLAMA4_TEXT_ONLY_REFUSAL),
    # qwen3_vl_moe.py builds its language model from qwen3_moe.py's decoder layers: every layer MoE.
    Family("Qwen3-VL-MoE (text)", {"Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe"},
           {"qwen3_vl_moe_text": _QWEN3_VL_MOE_TEXT}, _qwen_moe, text_model_types={"qwen3_vl_moe": "qwen3_vl_moe_text"}),
    # Qwen3-Omni-MoE: qwen3_omni_moe.py builds the thinker only (Qwen3OmniMoeThinkerForConditionalGeneration, a
    # Qwen3-VL-MoE wrapper over qwen3_vl_moe.py's Qwen3MoeLLMModel, from thinker_config; its talker and code2wav
    # weights are skipped at load): the thinker's text model, every layer MoE, routes.
    Family("Qwen3-Omni-MoE (thinker text)", {"Qwen3OmniMoeForConditionalGeneration": "qwen3_omni_moe"},
           {"qwen3_omni_moe_text": _QWEN3_OMNI_MOE_TEXT}, _qwen_moe,
           text_model_types={"qwen3_omni_moe": "qwen3_omni_moe_text"}),
    # Gemma-4 as published (26B-A4B: MoE; 31B: dense): gemma4_mm.py builds gemma4_causal.py's text model from
    # text_config.
    Family("Gemma-4 (text)", {"Gemma4ForConditionalGeneration": "gemma4"}, {"gemma4_text": _GEMMA4_TEXT}, _gemma4,
           text_model_types={"gemma4": "gemma4_text"}),
    Family("Gemma-4 text-only", {"Gemma4ForCausalLM": ""}, refusal=_GEMMA4_TEXT_ONLY_REFUSAL),
    Family("ERNIE-4.5-MoE", {"Ernie4_5_MoeForCausalLM": "ernie4_5_moe"}, {"ernie4_5_moe": _ERNIE4_5_MOE},
           _ernie4_5_moe, mtp=MTP_NEXTN),
    Family("Hunyuan-MoE v1", {"HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe"}, refusal=_HUNYUAN_V1_MOE_REFUSAL),
    # granitemoe.py: every decoder layer GraniteMoeMoE (TopK over num_local_experts).
    Family("Granite-MoE", {"GraniteMoeForCausalLM": "granitemoe"}, {"granitemoe": _GRANITEMOE}, _granitemoe),
    Family("LFM2-MoE", {"Lfm2MoeForCausalLM": "lfm2_moe"}, {"lfm2_moe": _LFM2_MOE}, _lfm2_moe),
    Family("AFMoE (Arcee Trinity)", {"AfmoeForCausalLM": "afmoe"}, {"afmoe": _AFMOE}, _afmoe),
    # Nemotron-3 (nemotron_h.py): Mamba-2, attention, MLP and MoE blocks of one hybrid pattern, each a decoder
    # layer; MoE at the pattern's E blocks. Nano publishes no MTP layer; Ultra one (nemotron_h_mtp.py: its blocks,
    # attention then MoE, drafting as one NextN layer reused per step).
    Family("Nemotron-H (Nemotron-3)", {"NemotronHForCausalLM": "nemotron_h"}, {"nemotron_h": _NEMOTRON_H},
           _nemotron_h, mtp=MTP_NEXTN),
    Family("DBRX", {"DbrxForCausalLM": "dbrx"}, refusal=_DBRX_REFUSAL),
    Family("DeepSeek-V4", {"DeepseekV4ForCausalLM": "deepseek_v4"}, refusal=_DEEPSEEK_V4_REFUSAL, mtp=MTP_NEXTN),
    Family("MiMo-V2-Flash", {"MiMoV2FlashForCausalLM": "mimo_v2_flash", "MiMoV2ForCausalLM": "mimo_v2_flash"},
           refusal=_MIMO_V2_REFUSAL, mtp=MTP_MULTI_LAYER),
    Family("LongCat-Flash", {"LongcatFlashForCausalLM": "longcat_flash"}, refusal=_ZERO_EXPERTS, mtp=MTP_NEXTN),
    # Intern-S1: its config class is the checkpoint's own code (model_type interns1: transformers' InternVLConfig
    # renamed), its text_config Qwen3-MoE's.
    Family("Intern-S1", {"InternS1ForConditionalGeneration": "interns1"}, {"qwen3_moe": _QWEN3_MOE}, _interns1),
    Family("Intern-S1-Pro", {"InternS1ProForConditionalGeneration": ""}, refusal=_INTERNS1_PRO_REFUSAL),
    # Ling / Ring 2.0: model_type bailing_moe (shared with Ling 1.x's BailingMoeForCausalLM, another config class).
    Family("Ling / Ring 2.0 (Bailing-MoE V2)", {"BailingMoeV2ForCausalLM": "bailing_moe"},
           {"bailing_moe": _BAILING_MOE_V2}, _bailing_moe_v2, mtp=MTP_NEXTN),
    Family("Inkling", {"InklingForConditionalGeneration": "inkling_mm_model",
                       "InklingForConditionalGenerationMTP": "inkling_mm_model"},
           refusal=_INKLING_REFUSAL, mtp=MTP_MULTI_LAYER),
)


def _index():
    by_arch: Dict[str, Family] = {}
    facts: Dict[str, Facts] = {}
    model_type: Dict[str, str] = {}
    text: Dict[str, str] = {}
    for fam in FAMILIES:
        for arch, mt in fam.architectures.items():
            if arch in by_arch:
                raise ValueError(f"architecture {arch!r} is in two families")
            by_arch[arch] = fam
            if mt:
                model_type[arch] = mt
        for mt, f in fam.facts.items():
            if mt in facts and facts[mt] is not f:
                raise ValueError(f"model type {mt!r} has two fact tables")
            facts[mt] = f
        text.update(fam.text_model_types)
    return by_arch, facts, model_type, text


_BY_ARCH, _FACTS, _ARCH_MODEL_TYPE, _TEXT_MODEL_TYPE = _index()

SUPPORTED_ARCHITECTURES: Sequence[str] = tuple(a for a, f in _BY_ARCH.items() if f.rule is not None)
CONFIG_MODEL_TYPES: Tuple[str, ...] = tuple(_FACTS)
# Multi-layer EAGLE (MultiLayerEagleWorkerV2) is captured for these architectures only: the ones whose
# layout rule, draft runners and chained draft-extend rows were proven against a spec-off server
# (tests/test_multi_layer_mtp.py).
MULTI_LAYER_MTP_ARCHITECTURES: Tuple[str, ...] = tuple(
    a for a, f in _BY_ARCH.items() if f.mtp == MTP_MULTI_LAYER and f.multi_layer_capture
)


# Architectures whose SGLang 0.5.23 model builds its own lm_head whatever tie_word_embeddings says, and loads
# lm_head.weight, which a tied checkpoint does not hold (transformers' save_pretrained writes the embedding once):
# served tied, the head keeps its initial values (OLMoE tied: every greedy logprob off transformers'; the rows,
# SGLang's own forward over its own tokens, still agreed). tests/sweep.py builds every ruled architecture with
# tie_word_embeddings true and checks this set against the head SGLang builds.
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "AfmoeForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "GptOssForCausalLM",
    "InternS1ForConditionalGeneration", "MiniMaxM2ForCausalLM",
    "MixtralForCausalLM", "OlmoeForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3OmniMoeForConditionalGeneration", "Step3p5ForCausalLM",
})


def check_head(view, arch: str) -> None:
    """Refuse a tied checkpoint SGLang would serve with an untied, unloaded head (``UNTIED_HEAD_ARCHITECTURES``)."""
    if arch in UNTIED_HEAD_ARCHITECTURES and view.get("tie_word_embeddings") is True:
        raise RuleError(
            f"{arch}: tie_word_embeddings=True: SGLang 0.5.23 builds this model's lm_head untied and loads "
            f"lm_head.weight, which a tied checkpoint does not hold (its head would keep its initial values); "
            f"refusing")


def family_of(architecture: str) -> Optional[Family]:
    return _BY_ARCH.get(architecture)


def facts_of(model_type: str) -> Optional[Facts]:
    return _FACTS.get(model_type)


def model_type_of(architecture: str) -> str:
    """The model type of the config class SGLang builds for ``architecture`` ("" when unknown)."""
    return _ARCH_MODEL_TYPE.get(architecture, "")


def text_model_type_of(model_type: str) -> str:
    return _TEXT_MODEL_TYPE.get(model_type, "")


def facts_table() -> Dict[str, Tuple[Dict[str, str], Dict[str, Any]]]:
    """(aliases, defaults) per model type, for the test that compares them with the live classes."""
    return {mt: (dict(f.aliases), dict(f.defaults)) for mt, f in _FACTS.items()}


# --- key accounting --------------------------------------------------------------------------------------------
# Every config key a family's reference class reads (transformers' config class fields and what its modeling file
# reads off a config: ``python -m sglang_r3.tools.config_keys``, by AST, for the transformers each served SGLang
# release pins) is accounted for here as one of:
#   proven     -- set off the class default in a checkpoint served by tests/test_families.py, whose rows equal
#                 transformers' router top-k (tests/test_key_accounting.py checks each against the checkpoints);
#   neutral    -- only the listed values are accepted; any other is refused at start-up naming the key;
#   ruled      -- the family's layout rule (or the tied-head check) reads it: a value SGLang builds otherwise than
#                 transformers is refused there, naming the key (computed: the rule's source, not listed);
#   irrelevant -- changes neither routing nor logits of a served forward, with why.
# tests/test_key_accounting.py fails on a key the installed transformers reads that its family leaves unaccounted.


@dataclass(frozen=True)
class Keys:
    neutral: Mapping[str, Tuple[Tuple[Any, ...], str]] = field(default_factory=dict)  # key -> (accepted, why)
    proven: Tuple[str, ...] = ()
    irrelevant: Mapping[str, str] = field(default_factory=dict)  # key -> why
    # Not accounted for yet (issue 52 stays open while any is): key -> what is missing. Shown per family in
    # docs/models.md; the test fails on a key listed here that another category now covers. ``pending_all``: every
    # key the class reads, with why (a family whose served forwards are not held to transformers' class).
    pending: Mapping[str, str] = field(default_factory=dict)
    pending_all: str = ""


_DROPOUT = "dropout: inactive in a forward without training (eval mode), SGLang has none"
# Keys every family's class reads that touch neither routing nor logits of a served forward.
COMMON_IRRELEVANT: Mapping[str, str] = {
    "attention_dropout": _DROPOUT, "hidden_dropout": _DROPOUT, "activation_dropout": _DROPOUT, "dropout": _DROPOUT,
    "projector_dropout": _DROPOUT,
    "bos_token_id": "generation's start id: the forward never reads it",
    "eos_token_id": "generation's stop ids: the forward never reads them",
    "pad_token_id": "the embedding's padding_idx: zeroes that row at init and in its gradient; a served checkpoint "
                    "loads the row's values",
    "initializer_range": "the init's spread: a served checkpoint's weights are loaded, not drawn",
    "output_router_logits": "whether the forward also returns router logits (for the auxiliary loss); the logits and "
                            "the routing are the same",
    "router_aux_loss_coef": "the auxiliary load-balancing loss's weight: training only",
    "router_jitter_noise": "noise on the router's input under self.training only",
    "use_cache": "whether generate keeps a KV cache: the same logits either way",
    "num_logits_to_keep": "how many last positions the head computes logits for in generate: their values unchanged",
}

# The activation SGLang's model file builds for the family (its SiluAndMul / GeluAndMul); the releases publish it.
_SILU = {"hidden_act": (("silu",), "SGLang's model builds SiLU-gated MLPs (SiluAndMul; some raise on another "
                                   "activation only once the model is built)")}

KEYS: Dict[str, Keys] = {}


def _rule_strings(fn: Callable, seen: Optional[set] = None) -> set:
    """String constants in ``fn`` and in the functions of this module it calls, transitively: the keys a rule reads
    (``v.get("key")``, ``_int(v, "key", ...)``) and names in its refusals."""
    import ast
    import inspect
    import textwrap

    seen = set() if seen is None else seen
    if fn in seen:
        return set()
    seen.add(fn)
    out = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
        elif isinstance(node, ast.Name):
            target = globals().get(node.id)
            if callable(target) and getattr(target, "__module__", "") == __name__ and inspect.isfunction(target):
                out |= _rule_strings(target, seen)
    return out


def account(family: Family, keys) -> Dict[str, str]:
    """How ``family`` accounts for each of ``keys``: "ruled", "neutral: ...", "proven", "irrelevant: ..." (keys
    left unaccounted are absent)."""
    own = KEYS.get(family.name, Keys())
    aliases = {a: s for f in family.facts.values() for a, s in f.aliases.items()}  # transformers' attribute_map
    ruled = _rule_strings(family.rule) if family.rule is not None else set()
    ruled |= set(family.required_keys)
    if any(a in UNTIED_HEAD_ARCHITECTURES for a in family.architectures):
        ruled.add("tie_word_embeddings")
    ruled |= {aliases[k] for k in ruled if k in aliases}
    out = {}
    for key in keys:  # the strongest evidence first (a served forward, a refusal), the family's own words before
        if key in own.proven:  # the static reading of its rule's source
            out[key] = "proven"
        elif key in own.neutral:
            out[key] = f"neutral: {list(own.neutral[key][0])} accepted"
        elif key in own.irrelevant:
            out[key] = f"irrelevant: {own.irrelevant[key]}"
        elif key in ruled:
            out[key] = "ruled"
        elif key in COMMON_IRRELEVANT:
            out[key] = f"irrelevant: {COMMON_IRRELEVANT[key]}"
        elif key in own.pending or own.pending_all:
            out[key] = f"PENDING: {own.pending.get(key) or own.pending_all}"
    return out


def check_neutral(view, arch: str) -> None:
    """Refuse a value the family accepts only at its neutral values (``Keys.neutral``), naming the key."""
    family = family_of(arch)
    for key, (accepted, why) in (KEYS.get(family.name, Keys()).neutral.items() if family else ()):
        if key in view.given and view.given[key] not in accepted:
            raise RuleError(f"{arch}: {key}={view.given[key]!r}: {why}; only {list(accepted)} is served exactly; "
                            f"refusing")


_NEVER_READ = "declared by the config class, read by none of its modeling code"
_MLA_HEAD_DIM = "the config class sets it to qk_rope_head_dim whatever the file says (the derived view does too)"
_NO_ATTENTION_BIAS_MLA = {"attention_bias": ((False,), "SGLang's deepseek_v2.py builds its MLA projections without "
                                                       "biases")}
_NO_MLP_BIAS = {"mlp_bias": ((False,), "SGLang's MLPs have no biases")}
_STEP3P5_PENDING = ("Step-3.5's served forwards are held to SGLang itself (weights drawn from a seed, spec on = off), "
                    "not to transformers' class")
_SHAPES = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads",
           "vocab_size", "max_position_embeddings")
_SHAPES_BUT_KV = tuple(k for k in _SHAPES if k != "num_key_value_heads")
_MLA = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_GROUPED = ("n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "n_shared_experts")


def _pending(*keys: str, why: str = "no served checkpoint sets it off its default yet") -> Dict[str, str]:
    return {k: why for k in keys}


KEYS.update({
    "GLM-4.5 / 4.7": Keys(neutral=_SILU, proven=_SHAPES + _GROUPED + (
        "attention_bias", "head_dim", "use_qk_norm", "rms_norm_eps", "rope_parameters")),
    "GLM-4.5V / 4.6V (text)": Keys(neutral=_SILU, proven=_SHAPES + _GROUPED + (
        "attention_bias", "head_dim", "rms_norm_eps", "rope_parameters"), pending=_pending("tie_word_embeddings")),
    "DeepSeek-V3": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA}, proven=_SHAPES + _MLA + _GROUPED + (
        "rope_interleave", "tie_word_embeddings", "rms_norm_eps", "rope_parameters"),
        irrelevant={"head_dim": _MLA_HEAD_DIM, "pretraining_tp": _NEVER_READ}),
    "Kimi-K2.5 (text)": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA}, proven=_SHAPES + _MLA + _GROUPED + (
        "rope_interleave", "rms_norm_eps"),
        irrelevant={"head_dim": _MLA_HEAD_DIM, "pretraining_tp": _NEVER_READ},
        pending=_pending("rope_parameters", "tie_word_embeddings")),
    "DeepSeek-V2": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **_NO_MLP_BIAS},
                        proven=_SHAPES + _MLA + ("n_group", "topk_group", "routed_scaling_factor", "n_shared_experts",
                                                 "topk_method", "tie_word_embeddings", "rms_norm_eps",
                                                 "rope_parameters"),
                        irrelevant={"head_dim": _MLA_HEAD_DIM, "pretraining_tp": _NEVER_READ,
                                    "norm_topk_prob": _NEVER_READ}),
    "GLM-4.7-Flash": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA}, proven=_SHAPES + _MLA + _GROUPED + (
        "rope_interleave", "rms_norm_eps", "rope_parameters"), irrelevant={"pretraining_tp": _NEVER_READ}),
    "GLM-5 (DSA)": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **_NO_MLP_BIAS}, proven=_SHAPES + _MLA + _GROUPED + (
        "index_n_heads", "tie_word_embeddings", "rms_norm_eps"),
        pending=_pending("index_head_dim", "index_topk", "indexer_types", "layer_types", "rope_parameters"),
        irrelevant={"head_dim": _MLA_HEAD_DIM, "num_experts": _NEVER_READ}),
    "DeepSeek-V3.2 (DSA)": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **_NO_MLP_BIAS},
                                proven=_SHAPES + _MLA + _GROUPED + ("index_n_heads", "rms_norm_eps"),
                                irrelevant={"head_dim": _MLA_HEAD_DIM, "num_experts": _NEVER_READ},
                                pending=_pending("index_head_dim", "index_topk", "layer_types", "rope_parameters",
                                                 "tie_word_embeddings")),
    "Qwen3-MoE": Keys(neutral=_SILU, proven=_SHAPES + ("head_dim", "norm_topk_prob", "attention_bias", "rms_norm_eps",
                                                       "rope_parameters")),
    "Qwen2-MoE": Keys(neutral=_SILU, proven=_SHAPES + ("norm_topk_prob", "qkv_bias", "shared_expert_intermediate_size",
                                                       "rms_norm_eps", "rope_parameters")),
    "Qwen3-Next": Keys(neutral=_SILU, proven=_SHAPES_BUT_KV + (
        "head_dim", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
        "norm_topk_prob", "shared_expert_intermediate_size", "rms_norm_eps", "rope_parameters"),
        pending=_pending("linear_conv_kernel_dim", "num_key_value_heads")),
    "Qwen3.5-MoE": Keys(neutral=_SILU, proven=_SHAPES_BUT_KV + (
        "head_dim", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "linear_value_head_dim", "shared_expert_intermediate_size", "tie_word_embeddings", "rope_parameters",
        "rms_norm_eps"), pending=_pending("linear_conv_kernel_dim", "num_key_value_heads")),
    "Mixtral": Keys(neutral=_SILU, proven=_SHAPES + ("rms_norm_eps", "rope_parameters")),
    "OLMoE": Keys(neutral={**_SILU,
                           "rms_norm_eps": ((1e-05,), "SGLang's olmoe.py builds every norm with eps 1e-5 whatever the "
                                                      "key says"),
                           "sliding_window": ((None,), "transformers' OLMoE hands sliding_window to its attention, "
                                                       "SGLang's olmoe.py never windows")},
                  proven=_SHAPES + ("num_experts", "rope_parameters")),
    "MiniMax-M2": Keys(neutral=_SILU, proven=_SHAPES + ("rms_norm_eps", "head_dim", "rope_parameters")),
    "gpt-oss": Keys(neutral={**_SILU, "swiglu_alpha": ((1.702,), "SGLang's gpt_oss.py takes the gate's alpha from "
                                                                 "hidden_act_alpha (1.702), never swiglu_alpha")},
                    proven=_SHAPES + ("attention_bias", "head_dim", "layer_types", "rope_parameters", "sliding_window",
                                      "rms_norm_eps"),
                    pending=_pending("swiglu_limit")),
    "Llama 4": Keys(neutral=_SILU, proven=_SHAPES + (
        "attention_chunk_size", "head_dim", "intermediate_size_mlp", "use_qk_norm", "rms_norm_eps", "rope_parameters"),
        pending=_pending("attention_bias", "attn_scale", "attn_temperature_tuning", "floor_scale", "image_token_id",
                         "layer_types", "no_rope_layer_interval", "no_rope_layers", "tie_word_embeddings")),
    "Qwen3-VL-MoE (text)": Keys(neutral=_SILU, proven=_SHAPES + (
        "head_dim", "attention_bias", "rope_parameters", "tie_word_embeddings", "rms_norm_eps")),
    "Gemma-4 (text)": Keys(proven=_SHAPES + (
        "attention_k_eq_v", "final_logit_softcapping", "head_dim", "hidden_size_per_layer_input", "layer_types",
        "num_kv_shared_layers", "sliding_window", "use_bidirectional_attention", "rms_norm_eps"),
        pending={**_pending("attention_bias", "hidden_activation", "per_layer_config", "rope_parameters",
                            "tie_word_embeddings", "use_double_wide_mlp", "vocab_size_per_layer_input"),
                 **_pending("global_head_dim", "num_global_key_value_heads",
                            why="(transformers 5.12.1) equal to the sliding layers' in the served checkpoint; the "
                                "published split is refused on the CPU runtime (its one KV pool holds one shape)")}),
    "ERNIE-4.5-MoE": Keys(neutral=_SILU, proven=_SHAPES + (
        "moe_num_shared_experts", "tie_word_embeddings", "rms_norm_eps", "rope_parameters"),
        pending=_pending("head_dim", "moe_norm_min")),
    "Granite-MoE": Keys(neutral=_SILU, proven=_SHAPES + (
        "attention_multiplier", "embedding_multiplier", "logits_scaling", "residual_multiplier", "tie_word_embeddings",
        "rms_norm_eps", "rope_parameters")),
    "LFM2-MoE": Keys(proven=_SHAPES + (
        "conv_bias", "layer_types", "norm_topk_prob", "routed_scaling_factor", "tie_word_embeddings", "use_expert_bias",
        "norm_eps", "rope_parameters"), pending=_pending("conv_L_cache")),
    "AFMoE (Arcee Trinity)": Keys(neutral=_SILU, proven=_SHAPES + (
        "global_attn_every_n_layers", "mup_enabled", "num_shared_experts", "route_scale", "sliding_window",
        "rms_norm_eps", "rope_parameters"), pending=_pending("head_dim")),
    "Intern-S1": Keys(neutral=_SILU, proven=_SHAPES + ("head_dim", "norm_topk_prob", "attention_bias", "rms_norm_eps",
                                                       "rope_parameters")),
})

KEYS.update({
    "Step-3.5": Keys(pending_all=_STEP3P5_PENDING),
    "Nemotron-H (Nemotron-3)": Keys(proven=_SHAPES + (
        "head_dim", "mamba_head_dim", "mamba_num_heads", "moe_latent_size", "moe_shared_expert_intermediate_size",
        "n_group", "norm_topk_prob", "num_hidden_layers", "routed_scaling_factor", "ssm_state_size", "topk_group",
        "use_conv_bias", "layer_norm_epsilon"),
        pending=_pending("attention_bias", "chunk_size", "conv_kernel", "expand", "mamba_proj_bias",
                         "mamba_ssm_cache_dtype", "moe_shared_expert_overlap", "n_groups", "rescale_prenorm_residual",
                         "residual_in_fp32", "tie_word_embeddings", "time_step_floor", "time_step_limit",
                         "time_step_max", "time_step_min", "use_bias", "use_mamba_kernels")),
    "Qwen3-Omni-MoE (thinker text)": Keys(neutral=_SILU, proven=_SHAPES + (
        "norm_topk_prob", "attention_bias", "rope_parameters", "rms_norm_eps"),
        irrelevant={"sliding_window": "the thinker's attention sets no window whatever the key says "
                                      "(modeling_qwen3_omni_moe.py: self.sliding_window = None)", **{k: "the talker's or code2wav's: SGLang builds the thinker only, and the thinker's forward never "
                       "reads it" for k in (
            "accept_hidden_layer", "code_predictor_config", "codebook_size", "codec_bos_id", "codec_eos_token_id",
            "codec_nothink_id", "codec_pad_id", "codec_think_bos_id", "codec_think_eos_id", "decoder_dim", "do_sample",
            "layer_scale_initial_scale", "num_quantizers", "speaker_id", "thinker_hidden_size", "upsample_rates",
            "upsampling_ratios")}},
        pending=_pending("shared_expert_intermediate_size", "vision_start_token_id")),
})
