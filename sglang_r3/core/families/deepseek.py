"""DeepSeek-V2 / V3 / V3.2, Kimi-K2.5 and GLM-5: one rule, deepseek_v2.py's: what their config classes say, the layout
rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from sglang_r3.core.families._base import (
    RuleError, Facts, MTP_NEXTN, Stack, Family, _kv_heads_default_to_heads, _int, _first_k_dense,
    _mlp_layer_types_agree, mla_rope
)
from sglang_r3.core.families.keys import (
    Keys, _SILU, _NEVER_READ, _NO_ATTENTION_BIAS_MLA, _SHAPES, _MLA, _GROUPED, mla_latent_eps, rope_spellings,
    SERVER_FLAG_SWITCHES
)


def _deepseek_v3_head_dim(d: Dict[str, Any]) -> None:
    # configuration_deepseek_v3.py: head_dim = qk_rope_head_dim, whatever the file says.
    d["head_dim"] = d.get("qk_rope_head_dim")


def _deepseek_v2_head_dim(d: Dict[str, Any]) -> None:
    # configuration_deepseek_v2.py: head_dim = qk_rope_head_dim, else hidden_size // heads.
    d["head_dim"] = d.get("qk_rope_head_dim")
    if d["head_dim"] is None and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]


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


def _moe_layer_freq_one(v, arch) -> None:
    freq = _int(v, "moe_layer_freq", arch, default=1)
    if freq != 1:
        raise RuleError(
            f"{arch}: moe_layer_freq={freq}: SGLang 0.5.23 (deepseek_v2.py `_is_layer_sparse`) makes layer i MoE iff "
            f"i >= first_k_dense_replace and i % moe_layer_freq == 0, transformers' DeepSeek classes ignore "
            f"moe_layer_freq (MoE iff i >= first_k_dense_replace / as mlp_layer_types say): they disagree on which "
            f"layers are MoE; refusing a layout one of them would not serve"
        )


def _v2_router(v, arch) -> None:
    """DeepSeek-V2's router: SGLang's DeepseekV2MoE always takes the grouped top-k (n_group groups, the best
    topk_group), transformers' DeepseekV2Moe groups only for group_limited_greedy; "greedy" is the same top-k only
    where every group is kept. transformers' class has no noaux_tc router at all."""
    if arch != "DeepseekV2ForCausalLM":
        return
    method = v.get("topk_method")
    groups, kept = v.get("n_group"), v.get("topk_group")
    if method == "greedy" and groups not in (None, 1) and kept != groups:
        raise RuleError(
            f"{arch}: topk_method='greedy' with n_group={groups}, topk_group={kept}: SGLang's DeepseekV2MoE picks "
            f"the top-k within the best {kept} of {groups} groups, transformers' DeepseekV2Moe over every expert; "
            f"refusing")
    if method not in ("greedy", "group_limited_greedy"):
        raise RuleError(f"{arch}: topk_method={method!r}: transformers' DeepseekV2Moe routes by greedy or "
                        f"group_limited_greedy only; refusing")


def _deepseek(v, arch) -> Stack:
    """DeepSeek-V2/V3/V3.2 and GLM-5 (deepseek_v2.py `_is_layer_sparse`; GlmMoeDsaForCausalLM subclasses
    DeepseekV2ForCausalLM): MoE iff layer >= first_k_dense_replace (and layer % moe_layer_freq == 0, which
    transformers ignores: moe_layer_freq != 1 is refused). NextN MTP layers are MoE."""
    _moe_layer_freq_one(v, arch)
    _v2_router(v, arch)
    mla_rope(v, arch)
    _own_indexer_per_layer(v, arch)
    stack = _first_k_dense(v, arch, freq=1)
    return _mlp_layer_types_agree(v, arch, stack, "first_k_dense_replace")


def _own_indexer_per_layer(v, arch) -> None:
    """GLM-5's DSA: transformers' GlmMoeDsa lets a layer reuse the previous layer's top-k ("shared" in
    indexer_types, from index_topk_pattern or index_topk_freq); what is served here is one indexer per layer (all
    "full", the class default), the others are refused."""
    shared = [i for i, t in enumerate(v.get("indexer_types") or []) if t != "full"]
    pattern = v.get("index_topk_pattern")
    if shared or (pattern is not None and set(pattern) - {"F", "full"}) or int(v.get("index_topk_freq") or 1) != 1:
        raise RuleError(
            f"{arch}: indexer_types={v.get('indexer_types')!r} (index_topk_pattern={pattern!r}, index_topk_freq="
            f"{v.get('index_topk_freq')!r}) reuses another layer's top-k in some layers: not served exactly here "
            f"(one indexer per layer is); refusing")


# deepseek_v2.py's DeepseekV2DecoderLayer._is_layer_sparse reads config.moe_layer_freq (0.5.15.post1 and 0.5.23);
# transformers' DeepseekV2 / V3 / V3.2 and GlmMoeDsa config classes have no such field, so their save omits it.
# (GLM-4.7-Flash's glm4_moe_lite.py sets it to 1 itself.)
# DeepseekV2MoE reads config.scoring_func as unconditionally (its TopK's scores), which no transformers DeepSeek
# class declares: softmax for DeepSeek-V2, sigmoid for the others, as the releases publish.
_DEEPSEEK_V2_LAYER_KEYS = {"moe_layer_freq": (1, "deepseek_v2.py DeepseekV2DecoderLayer._is_layer_sparse"),
                           "scoring_func": ("softmax", "deepseek_v2.py DeepseekV2MoE.__init__")}

# deepseek_v2.py's DeepseekV2MoE reads config.topk_method too; transformers' DeepSeek-V2 class declares it (and saves
# it), V3's, V3.2's and GLM-5's do not: their routers are noaux_tc's, as the releases publish.
_DEEPSEEK_V3_LAYER_KEYS = {**_DEEPSEEK_V2_LAYER_KEYS,
                           "topk_method": ("noaux_tc", "deepseek_v2.py DeepseekV2MoE.__init__"),
                           "scoring_func": ("sigmoid", "deepseek_v2.py DeepseekV2MoE.__init__")}

_MLA_HEAD_DIM = "the config class sets it to qk_rope_head_dim whatever the file says (the derived view does too)"

_NO_MLP_BIAS = {"mlp_bias": ((False,), "SGLang's MLPs have no biases")}

# SGLang's DSA KV pool holds the indexer's keys 128 wide and asserts so (memory_pool.py, "num head == 1 and head dim
# == 128 for index_k in DSA"): a flipped index_head_dim of 32 stopped the scheduler there.
_INDEX_HEAD_DIM = {"index_head_dim": ((128,), "SGLang's DSA KV pool asserts an indexer head of 128")}

# Keys deepseek_v2.py reads that no transformers DeepSeek class reads or declares (config_keys.sglang_only_keys).
_SGLANG_ONLY_NEUTRAL = {
    "swiglu_limit": ((None,), "deepseek_v2.py clamps the MLPs' and experts' SwiGLU at it, transformers' classes never "
                              "clamp"),
    "llama_4_scaling": ((None,), "deepseek_v2.py scales q by position past original_max_position_embeddings with it, "
                                 "transformers' classes never do"),
    "num_hash_layers": ((0,), "deepseek_v2.py routes its first num_hash_layers MoE layers by a token-id table "
                              "(HashTopK), transformers' routers by score"),
    "mla_nope": ((False,), "SGLang 0.5.23's deepseek_v2.py skips RoPE in the NextN draft layer with it, transformers' "
                           "layer rotates"),
}
_SGLANG_ONLY_IRRELEVANT = {
    "router_fp32": "SGLang's only: deepseek_v2.py keeps and applies the gate in float32, as transformers' routers "
                   "compute it",
    "routing_method_type": "SGLang's only: read by the FlashInfer TRT-LLM MoE runners, which route inside their kernel "
                           "and start-up refuses",
}
_VIA_ROPE_PARAMETERS = rope_spellings("which deepseek_v2.py reads")
_NOT_DSA = {"indexer_rope_interleave": "SGLang's only: read by the DSA indexer, which deepseek_v2.py builds for DSA "
                                      "models only"}
_ALWAYS_INTERLEAVED = {"rope_interleave": ((True,), "deepseek_v2.py rotates half-split pairs when it is false, "
                                                    "transformers' class always rotates interleaved pairs")}
_INDEXER_ROTATION_PENDING = ("SGLang's only: the DSA indexer's rotation (deepseek_v2.py) changes which keys it "
                             "selects, and its selection runs on a GPU only (the CPU runtime refuses a context longer "
                             "than index_topk)")

# V3's router as every transformers class but V2's has it: sigmoid scores plus the correction bias, grouped; SGLang's
# DeepseekV2MoE builds the bias for noaux_tc only (a held-out topk_method "greedy": 159 of 252 pairs differed).
_NOAUX_TC = {"topk_method": (("noaux_tc",), "SGLang's DeepseekV2MoE adds the gate's correction bias for noaux_tc only, "
                                           "transformers' router always")}

# Kimi-K2.5's vision tower keys kimi_k25.py reads off its own config (its KimiK25Config): none reaches a text token's
# routing; an image's only as transformers' code reads them, or the build stops.
_KIMI_K25_WRAPPER = {
    **SERVER_FLAG_SWITCHES,
    **{k: "SGLang's only: the vision tower's position-embedding grid, the shape of its checkpoint tensor (the load "
          "asserts they agree)" for k in ("init_pos_emb_height", "init_pos_emb_width")},
    "init_pos_emb_time": "SGLang's only: the bound of a video chunk's frames and its time table's length; an image's "
                         "embedding does not depend on it",
    "merge_type": "SGLang's only: stored, never branched on (the patch merger is the same whatever it says)",
    **{k: "SGLang's only: another value stops the vision tower's build (kimi_k25.py raises), never served"
       for k in ("pos_emb_type", "video_attn_type")},
    **{k: "SGLang's only: a projector width that must equal the checkpoint's tensors (the load asserts it)"
       for k in ("vt_hidden_size", "text_hidden_size")},
    **{k: "the vision tower's own key (transformers 5.19's Kimi-K2.5 vision config declares it; 5.12.1 has no "
          "Kimi-K2.5 class): no text token's path reads it" for k in ("merge_kernel_size", "patch_size")},
}

# The DSA indexer selects index_topk keys per query with SGLang's GPU kernels; the CPU runtime attends to every key,
# so start-up refuses a context longer than index_topk there (a flipped index_topk of 8 was refused so): no served
# forward here has selected.
_INDEX_TOPK_PENDING = ("the indexer's selection runs on a GPU only (the CPU runtime refuses a context longer than "
                       "index_topk), so no served forward here selects")

FAMILIES: Tuple[Family, ...] = (
    Family("DeepSeek-V3", {"DeepseekV3ForCausalLM": "deepseek_v3"}, {"deepseek_v3": _DEEPSEEK_V3}, _deepseek,
           mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    # Kimi-K2.5: kimi_k25.py builds its language model as deepseek_v2.py's DeepseekV3ForCausalLM from text_config
    # (published: model_type deepseek_v3, no MTP layers).
    Family("Kimi-K2.5 (text)", {"KimiK25ForConditionalGeneration": "kimi_k25"}, {"deepseek_v3": _DEEPSEEK_V3},
           _deepseek, text_model_types={"kimi_k25": "deepseek_v3"}, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    Family("DeepSeek-V2", {"DeepseekV2ForCausalLM": "deepseek_v2"}, {"deepseek_v2": _DEEPSEEK_V2}, _deepseek,
           mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V2_LAYER_KEYS),
    Family("GLM-5 (DSA)", {"GlmMoeDsaForCausalLM": "glm_moe_dsa"}, {"glm_moe_dsa": _GLM_MOE_DSA}, _deepseek,
           mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
    Family("DeepSeek-V3.2 (DSA)", {"DeepseekV32ForCausalLM": "deepseek_v32"}, {"deepseek_v32": _DEEPSEEK_V32},
           _deepseek, mtp=MTP_NEXTN, required_keys=_DEEPSEEK_V3_LAYER_KEYS),
)

KEYS: Dict[str, Keys] = {
    "DeepSeek-V3": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **mla_latent_eps(1e-06), **_SGLANG_ONLY_NEUTRAL,
                                 **_NOAUX_TC},
                        proven=_SHAPES + _MLA + _GROUPED + ("rope_interleave", "tie_word_embeddings", "rope_parameters"),
        irrelevant={"head_dim": _MLA_HEAD_DIM, "pretraining_tp": _NEVER_READ, **_SGLANG_ONLY_IRRELEVANT, **_NOT_DSA},
        via=_VIA_ROPE_PARAMETERS),
    "Kimi-K2.5 (text)": Keys(proven=_SHAPES + _MLA + _GROUPED + ("rope_interleave", "rope_parameters"),
        neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **mla_latent_eps(1e-06),
                 "tie_word_embeddings": ((False,), "the text config's: transformers' Kimi-K2.5 ties its head by the "
                                                   "outer config's key; only the published value (untied) is proven"),
                 **_SGLANG_ONLY_NEUTRAL, **_NOAUX_TC},
        irrelevant={"head_dim": _MLA_HEAD_DIM, "pretraining_tp": _NEVER_READ, **_SGLANG_ONLY_IRRELEVANT, **_NOT_DSA,
                    **_KIMI_K25_WRAPPER},
        via=_VIA_ROPE_PARAMETERS),
    "DeepSeek-V2": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **_NO_MLP_BIAS, **mla_latent_eps(1e-06),
                                 **_SGLANG_ONLY_NEUTRAL, **_ALWAYS_INTERLEAVED,
                                 "norm_topk_prob": ((False,), "SGLang's DeepseekV2MoE renormalises the top-k weights "
                                                              "with it, transformers' DeepseekV2 class never does"),
                                 # SGLang's only (0.5.23 scores with it; 0.5.15.post1 always takes the softmax)
                                 "scoring_func": (("softmax",), "SGLang 0.5.23's grouped top-k scores with it, "
                                                                "transformers' DeepseekV2Moe takes the softmax")},
                        proven=_SHAPES + _MLA + ("n_group", "topk_group", "routed_scaling_factor", "n_shared_experts",
                                                 "topk_method", "tie_word_embeddings", "rope_parameters"),
                        irrelevant={"head_dim": _MLA_HEAD_DIM, "pretraining_tp": _NEVER_READ,
                                    **_SGLANG_ONLY_IRRELEVANT, **_NOT_DSA},
                        via=_VIA_ROPE_PARAMETERS),
    "GLM-5 (DSA)": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **_NO_MLP_BIAS, **mla_latent_eps(1e-05),
                                 **_INDEX_HEAD_DIM, **_SGLANG_ONLY_NEUTRAL, **_NOAUX_TC, **_ALWAYS_INTERLEAVED,
                                 # SGLang's only: transformers' YaRN rotates the factor's share of the head
                                 "partial_rotary_factor": ((1.0,), "SGLang's GLM-5 (deepseek_v2.py's MLA) rotates "
                                                                   "qk_rope_head_dim whatever it says")},
                        proven=_SHAPES + _MLA + _GROUPED + ("index_n_heads", "tie_word_embeddings", "rope_parameters"),
        irrelevant={"head_dim": _MLA_HEAD_DIM, "num_experts": _NEVER_READ, "layer_types": _NEVER_READ,
                    **_SGLANG_ONLY_IRRELEVANT,
                    "use_qk_norm": "SGLang's only: read by glm4_moe.py's GLM-4.5 classes, not by GLM-5's MLA "
                                   "(deepseek_v2.py)"},
        via=_VIA_ROPE_PARAMETERS,
        pending={"index_topk": _INDEX_TOPK_PENDING, "indexer_rope_interleave": _INDEXER_ROTATION_PENDING}),
    "DeepSeek-V3.2 (DSA)": Keys(neutral={**_SILU, **_NO_ATTENTION_BIAS_MLA, **_NO_MLP_BIAS, **mla_latent_eps(1e-06),
                                         **_INDEX_HEAD_DIM, **_SGLANG_ONLY_NEUTRAL, **_NOAUX_TC,
                                         **_ALWAYS_INTERLEAVED},
                                proven=_SHAPES + _MLA + _GROUPED + ("index_n_heads", "rope_parameters",
                                                                    "tie_word_embeddings"),
                                irrelevant={"head_dim": _MLA_HEAD_DIM, "num_experts": _NEVER_READ,
                                            "layer_types": _NEVER_READ, **_SGLANG_ONLY_IRRELEVANT},
                                via=_VIA_ROPE_PARAMETERS,
                                pending={"index_topk": _INDEX_TOPK_PENDING,
                                         "indexer_rope_interleave": _INDEXER_ROTATION_PENDING}),
}
