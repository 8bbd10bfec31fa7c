"""GLM-4.5 / 4.7 and GLM-4.5V / 4.6V (glm4_moe.py), GLM-4.7-Flash (glm4_moe_lite.py): what their config classes say, the
layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import (
    RuleError, Facts, MTP_NEXTN, Stack, Family, _first_k_dense, _mlp_layer_types_agree, mla_rope
)
from sglang_r3.core.families.keys import (
    Keys, _SILU, _NEVER_READ, _NO_ATTENTION_BIAS_MLA, _SHAPES, _MLA, _GROUPED, mla_latent_eps
)


def _glm4_moe_partial_rotary(d: Dict[str, Any]) -> None:
    # configuration_glm4_moe.py: kwargs.setdefault("partial_rotary_factor", 0.5).
    d.setdefault("partial_rotary_factor", 0.5)


def _glm4_moe_lite_mlp_layer_types(d: Dict[str, Any]) -> None:
    # configuration_glm4_moe_lite.py __post_init__: the first layer dense, the rest sparse (whatever
    # first_k_dense_replace says -- the class has no such field; SGLang reads it from the file).
    if d.get("mlp_layer_types") is None and d.get("num_hidden_layers") is not None:
        d["mlp_layer_types"] = ["dense"] + ["sparse"] * (int(d["num_hidden_layers"]) - 1)


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
    mla_rope(v, arch)
    stack = _first_k_dense(v, arch, freq=1)
    return _mlp_layer_types_agree(v, arch, stack, "first_k_dense_replace")


FAMILIES: Tuple[Family, ...] = (
    Family("GLM-4.5 / 4.7", {"Glm4MoeForCausalLM": "glm4_moe"}, {"glm4_moe": _GLM4_MOE}, _glm4_moe,
           mtp=MTP_NEXTN),
    # glm4v_moe.py builds its language model from glm4_moe.py's Glm4MoeModel: the same layers as GLM-4.5.
    Family("GLM-4.5V / 4.6V (text)", {"Glm4vMoeForConditionalGeneration": "glm4v_moe"},
           {"glm4v_moe_text": _GLM4V_MOE_TEXT}, _glm4_moe, text_model_types={"glm4v_moe": "glm4v_moe_text"}),
    Family("GLM-4.7-Flash", {"Glm4MoeLiteForCausalLM": "glm4_moe_lite"}, {"glm4_moe_lite": _GLM4_MOE_LITE},
           _glm4_moe_lite, mtp=MTP_NEXTN),
)

KEYS: Dict[str, Keys] = {
    "GLM-4.5 / 4.7": Keys(neutral=_SILU, proven=_SHAPES + _GROUPED + (
        "attention_bias", "head_dim", "use_qk_norm", "rms_norm_eps", "rope_parameters"),
        via={"partial_rotary_factor": "rope_parameters: glm4_moe.py reads rope_parameters' factor first, as "
                                      "transformers' Glm4MoeConfig folds the top-level one into it"}),
    "GLM-4.5V / 4.6V (text)": Keys(neutral=_SILU, proven=_SHAPES + _GROUPED + (
        "attention_bias", "head_dim", "rms_norm_eps", "rope_parameters", "tie_word_embeddings"),
        via={"rope_scaling": "rope_parameters: SGLang's config copies the text config onto the outer one, where "
                             "rope_scaling is the text config's rope_parameters (glm4v_moe.py's M-RoPE sections)"}),
    "GLM-4.7-Flash": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **mla_latent_eps(1e-05)},
                          proven=_SHAPES + _MLA + _GROUPED + ("rope_interleave", "rope_parameters"),
                          irrelevant={"pretraining_tp": _NEVER_READ,
                                      "moe_layer_freq": "SGLang's only: glm4_moe_lite.py sets it to 1 itself before "
                                                        "it reads it"}),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM"
})
