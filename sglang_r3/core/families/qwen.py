"""The Qwen-MoE rule: Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE, Qwen3-VL-MoE, Qwen3-Omni-MoE and Intern-S1 (every
layer MoE): what their config classes say, the layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import (
    ConfigError, RuleError, Facts, MTP_NEXTN, Stack, Family, _kv_heads_default_to_heads, _int, _mtp_count, _stack,
    _head_dim_derived
)
from sglang_r3.core.families.keys import (
    DUAL_CHUNK, SERVER_FLAG_SWITCHES, Keys, _SILU, _SHAPES, _SHAPES_BUT_KV, rope_spellings
)


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


FAMILIES: Tuple[Family, ...] = (
    Family("Qwen3-MoE", {"Qwen3MoeForCausalLM": "qwen3_moe"}, {"qwen3_moe": _QWEN3_MOE}, _qwen_moe),
    Family("Qwen2-MoE", {"Qwen2MoeForCausalLM": "qwen2_moe"}, {"qwen2_moe": _QWEN2_MOE}, _qwen_moe),
    Family("Qwen3-Next", {"Qwen3NextForCausalLM": "qwen3_next"}, {"qwen3_next": _QWEN_HYBRID_FACTS}, _qwen_moe,
           mtp=MTP_NEXTN),
    # Qwen3.5-MoE's text config is Qwen3-Next's (same class defaults in transformers 5.19).
    Family("Qwen3.5-MoE",
           {"Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text"},
           {"qwen3_5_moe_text": _QWEN_HYBRID_FACTS}, _qwen_moe, mtp=MTP_NEXTN,
           text_model_types={"qwen3_5_moe": "qwen3_5_moe_text"}),
    # qwen3_vl_moe.py builds its language model from qwen3_moe.py's decoder layers: every layer MoE.
    Family("Qwen3-VL-MoE (text)", {"Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe"},
           {"qwen3_vl_moe_text": _QWEN3_VL_MOE_TEXT}, _qwen_moe, text_model_types={"qwen3_vl_moe": "qwen3_vl_moe_text"}),
    # Qwen3-Omni-MoE: qwen3_omni_moe.py builds the thinker only (Qwen3OmniMoeThinkerForConditionalGeneration, a
    # Qwen3-VL-MoE wrapper over qwen3_vl_moe.py's Qwen3MoeLLMModel, from thinker_config; its talker and code2wav
    # weights are skipped at load): the thinker's text model, every layer MoE, routes.
    Family("Qwen3-Omni-MoE (thinker text)", {"Qwen3OmniMoeForConditionalGeneration": "qwen3_omni_moe"},
           {"qwen3_omni_moe_text": _QWEN3_OMNI_MOE_TEXT}, _qwen_moe,
           text_model_types={"qwen3_omni_moe": "qwen3_omni_moe_text"}),
    # Intern-S1: its config class is the checkpoint's own code (model_type interns1: transformers' InternVLConfig
    # renamed), its text_config Qwen3-MoE's.
    Family("Intern-S1", {"InternS1ForConditionalGeneration": "interns1"}, {"qwen3_moe": _QWEN3_MOE}, _interns1),
)

# Keys SGLang's Qwen models read that transformers' classes neither read nor declare (config_keys.sglang_only_keys),
# shared by the hybrid (gated delta-net) families: SGLang's own Qwen3NextConfig / Qwen3_5TextConfig.
_HYBRID_SGLANG = dict(
    neutral={"attn_output_gate": ((True,), "SGLang's full-attention layers gate their output with it (a q_proj twice "
                                           "as wide), transformers' always"),
             "output_gate_type": ((None, "silu", "swish"), "SGLang's gated RMSNorm gates by it (SiLU where absent), "
                                                           "transformers' Qwen3NextRMSNormGated always with SiLU")},
    irrelevant={**{k: "SGLang's CPU path sets it from linear_num_*_heads before the model is built "
                      "(adjust_tp_num_heads_if_necessary), over any file value" for k in (
                          "linear_num_key_heads_cpu", "linear_num_value_heads_cpu")}},
    via={"full_attention_interval": "layer_types: both configs derive the layer kinds from it; start-up refuses it "
                                    "missing (SGLang builds from it alone) and the config view refuses layer_types "
                                    "that disagree",
         "layers_block_type": "full_attention_interval: a property SGLang's config computes (a file's value stops the "
                              "config's load)",
         "partial_rotary_factor": "rope_parameters: the config view fills the top-level value SGLang reads (class "
                                  "default 0.25) and refuses it given apart from rope_parameters'",
         **rope_spellings("which SGLang's config keeps as rope_parameters", ("rope_scaling",))},
)

# Read in qwen2_moe.py's sparse block, which the hybrid families' decoder layers build: where it fuses the shared
# expert into the routed ones (Qwen3-Next on CUDA, which raises above 1; Qwen3.5 on ROCm), as many shared experts.
_SHARED_FUSED = {"n_shared_experts": ((None, 0, 1), "SGLang's sparse block (qwen2_moe.py) fuses this many shared "
                                                    "experts where it fuses them, transformers' class builds one")}

# qwen3_vl.py, which the Qwen3-VL-MoE and Qwen3.5 wrappers subclass: a checkpoint (or --language-model-only) marked
# so gets no vision tower and plain RoPE, which for text tokens is M-RoPE's rotation (equal positions on every
# axis); a media prompt is then refused.
_LANGUAGE_MODEL_ONLY = {"language_model_only": "SGLang's only: builds no vision tower (media prompts refused); a "
                                                "text token's rotation is M-RoPE's, whose axes hold one position"}

KEYS: Dict[str, Keys] = {
    "Qwen3-MoE": Keys(neutral={**_SILU, **DUAL_CHUNK,
                               # SGLang's only: transformers folds it into rope_parameters, where its YaRN and linear
                               # scaling fail on a partial rotation; qwen3_moe.py rotates the whole head
                               "partial_rotary_factor": ((1.0,), "qwen3_moe.py rotates the whole head whatever it "
                                                                 "says")},
                      proven=_SHAPES + ("head_dim", "norm_topk_prob", "attention_bias", "rms_norm_eps",
                                        "rope_parameters"),
                      via=rope_spellings("which qwen3_moe.py reads")),
    "Qwen2-MoE": Keys(neutral={**_SILU, **DUAL_CHUNK},
                      proven=_SHAPES + ("norm_topk_prob", "qkv_bias", "shared_expert_intermediate_size",
                                        "rms_norm_eps", "rope_parameters"),
                      irrelevant={"n_shared_experts": "SGLang's only: qwen2_moe.py reads it where the sparse block "
                                                      "fuses the shared expert, which its decoder layer never asks"}),
    "Qwen3-Next": Keys(neutral={**_SILU, **_HYBRID_SGLANG["neutral"], **_SHARED_FUSED}, proven=_SHAPES_BUT_KV + (
        "head_dim", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
        "norm_topk_prob", "shared_expert_intermediate_size", "rms_norm_eps", "linear_conv_kernel_dim",
        "num_key_value_heads", "rope_parameters"),
        irrelevant={**_HYBRID_SGLANG["irrelevant"],
                    "target_hidden_size": "SGLang's only: read by set_embed, which EAGLE-3 drafts call (start-up "
                                          "refuses them); the MTP draft shares embeddings and head otherwise"},
        via={**_HYBRID_SGLANG["via"],
             "rope_theta": "rope_parameters: SGLang's config reads the top-level base; start-up refuses a base given "
                           "only inside rope_parameters, or both ways apart (refusals/startup.py)"}),
    "Qwen3.5-MoE": Keys(neutral={**_SILU, **_HYBRID_SGLANG["neutral"], **_SHARED_FUSED,
                                 # read in qwen2_moe.py's sparse block, which qwen3_5.py builds
                                 "norm_topk_prob": ((True,), "SGLang's sparse block (qwen2_moe.py) renormalises the "
                                                             "top-k weights by it, transformers' class always"),
                                 "is_causal": ((True,), "SGLang 0.5.23's qwen3_5.py builds bidirectional full "
                                                        "attention where it is false, transformers' class is causal")},
                        proven=_SHAPES_BUT_KV + (
        "head_dim", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "linear_value_head_dim", "shared_expert_intermediate_size", "tie_word_embeddings", "rope_parameters",
        "rms_norm_eps", "linear_conv_kernel_dim", "num_key_value_heads"),
        irrelevant={**_HYBRID_SGLANG["irrelevant"], **_LANGUAGE_MODEL_ONLY,
                    **SERVER_FLAG_SWITCHES},
        via=_HYBRID_SGLANG["via"]),
    # (DUAL_CHUNK: read by qwen3_moe.py's decoder layers, which these three build)
    "Qwen3-VL-MoE (text)": Keys(neutral={**_SILU, **DUAL_CHUNK}, proven=_SHAPES + (
        "head_dim", "attention_bias", "rope_parameters", "tie_word_embeddings", "rms_norm_eps"),
        irrelevant={**SERVER_FLAG_SWITCHES, **_LANGUAGE_MODEL_ONLY},
        via=rope_spellings("which qwen3_vl.py reads for its M-RoPE sections", ("rope_scaling",))),
    "Qwen3-Omni-MoE (thinker text)": Keys(neutral={**_SILU, **DUAL_CHUNK}, proven=_SHAPES + (
        "norm_topk_prob", "attention_bias", "rope_parameters", "rms_norm_eps"),
        irrelevant={"sliding_window": "the thinker's attention sets no window whatever the key says "
                                      "(modeling_qwen3_omni_moe.py: self.sliding_window = None)",
                    **{k: "the talker's or code2wav's: SGLang builds the thinker only, and the thinker's forward never "
                          "reads it" for k in (
                        "accept_hidden_layer", "code_predictor_config", "codebook_size", "codec_bos_id",
                        "codec_eos_token_id", "codec_nothink_id", "codec_pad_id", "codec_think_bos_id",
                        "codec_think_eos_id", "decoder_dim", "do_sample", "layer_scale_initial_scale", "num_quantizers",
                        "speaker_id", "thinker_hidden_size", "upsample_rates", "upsampling_ratios",
                        "shared_expert_intermediate_size")},
                    "vision_start_token_id": "the M-RoPE index of a prompt with media (get_rope_index), not the text "
                                             "model: SGLang's Qwen3-Omni config keeps the file's value as transformers "
                                             "does; the image prompts' rows are served with the checkpoint's own ids",
                    "original_encoder_attention_heads": "SGLang's only: the audio tower's (its CPU path sizes the "
                                                        "tower's qkv by it; a value off the checkpoint's stops the "
                                                        "load), never the text model's"}),
    "Intern-S1": Keys(neutral={**_SILU, **DUAL_CHUNK},
                      proven=_SHAPES + ("head_dim", "norm_topk_prob", "attention_bias", "rms_norm_eps",
                                        "rope_parameters"),
                      via={"downsample_ratio": "transformers' InternVL config's: SGLang's pixel shuffle and projector "
                                               "widths are its InternVLModel's",
                           "vision_feature_layer": "transformers' InternVL config's: the vision layer an image's "
                                                   "features come from, read alike at the published -1"},
                      pending={"force_image_size": "SGLang's only: its InternVL processor counts an image's tokens "
                                                   "per tile by it; a value off vision_config.image_size is not "
                                                   "refused yet"}),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "InternS1ForConditionalGeneration", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3OmniMoeForConditionalGeneration"
})
