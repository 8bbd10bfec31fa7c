"""LFM2-MoE (lfm2_moe.py): what their config classes say, the layout rule, the registry entries and their key
accounting."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from sglang_r3.core.families._base import Facts, Stack, Family, _int, _stack, _head_dim_derived
from sglang_r3.core.families.keys import Keys, _SHAPES, rope_spellings


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


def _lfm2_moe(v, arch) -> Stack:
    """LFM2-MoE (lfm2_moe.py, as transformers): layers below num_dense_layers dense, the rest MoE (sigmoid
    routing with an expert bias: plain expert ids), short-conv or attention alike. No MTP."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    dense = _int(v, "num_dense_layers", arch)
    _head_dim_derived(v, arch, "lfm2_moe.py")
    return _stack(L, lambda i: i >= dense, E, k)


FAMILIES: Tuple[Family, ...] = (
    Family("LFM2-MoE", {"Lfm2MoeForCausalLM": "lfm2_moe"}, {"lfm2_moe": _LFM2_MOE}, _lfm2_moe),
)

KEYS: Dict[str, Keys] = {
    "LFM2-MoE": Keys(proven=_SHAPES + (
        "conv_bias", "layer_types", "norm_topk_prob", "routed_scaling_factor", "tie_word_embeddings", "use_expert_bias",
        "norm_eps", "rope_parameters", "conv_L_cache"),
        via=rope_spellings("which lfm2_moe.py reads (rope_parameters first)")),
}
