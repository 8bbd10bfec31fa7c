"""Gpt-oss (gpt_oss.py): what their config classes say, the layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import Facts, Family, _kv_heads_default_to_heads, _every_layer_moe
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


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

FAMILIES: Tuple[Family, ...] = (
    # gpt_oss.py: every decoder layer GptOssSparseMoeBlock (TopK over num_local_experts, renormalized after
    # top-k); attention sinks and alternating sliding windows change the hidden states, not which layers route.
    Family("gpt-oss", {"GptOssForCausalLM": "gpt_oss"}, {"gpt_oss": _GPT_OSS}, _every_layer_moe),
)

KEYS: Dict[str, Keys] = {
    "gpt-oss": Keys(neutral={**_SILU, "swiglu_alpha": ((1.702,), "SGLang's gpt_oss.py takes the gate's alpha from "
                                                                 "hidden_act_alpha (1.702), never swiglu_alpha"),
                             # SGLang's only: transformers 5.19 takes the alpha from swiglu_alpha, 5.12.1 fixes 1.702
                             "hidden_act_alpha": ((1.702,), "SGLang's gpt_oss.py gives it to the experts' SwiGLU gate "
                                                            "(gemm1_alpha), transformers' class never reads it")},
                    irrelevant={"original_intermediate_size": "SGLang's only: the width SGLang itself records when it "
                                "pads intermediate_size (configs/update_config.py), read by the mxfp4 experts' loader "
                                "only to reshape their tensors; no forward reads it"},
                    proven=_SHAPES + ("attention_bias", "head_dim", "layer_types", "rope_parameters", "sliding_window",
                                      "rms_norm_eps", "swiglu_limit")),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "GptOssForCausalLM"
})
