"""ERNIE-4.5-MoE (ernie4.py, ernie4_eagle.py): what their config classes say, the layout rule, the registry entries and
their key accounting."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from sglang_r3.core.families._base import RuleError, Facts, MTP_NEXTN, Stack, Family, _int, _mtp_count, _stack
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


def _ernie4_5_moe_end_index(d: Dict[str, Any]) -> None:
    # configuration_ernie4_5_moe.py __post_init__: moe_layer_end_index -1 is the last layer.
    if d.get("moe_layer_end_index") == -1 and d.get("num_hidden_layers") is not None:
        d["moe_layer_end_index"] = int(d["num_hidden_layers"]) - 1


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


FAMILIES: Tuple[Family, ...] = (
    Family("ERNIE-4.5-MoE", {"Ernie4_5_MoeForCausalLM": "ernie4_5_moe"}, {"ernie4_5_moe": _ERNIE4_5_MOE},
           _ernie4_5_moe, mtp=MTP_NEXTN),
)

KEYS: Dict[str, Keys] = {
    "ERNIE-4.5-MoE": Keys(
        neutral={**_SILU, "moe_norm_min": ((1e-12,), "transformers' Ernie4_5_Moe clamps the top-k weights' sum at "
                                                      "it before renormalising, SGLang's TopK does not read it"),
                 # SGLang's only
                 "rope_is_neox_style": ((False,), "ernie4.py rotates half-split pairs when it is true; transformers' "
                                                  "Ernie4_5_Moe always rotates interleaved pairs")},
        proven=_SHAPES + ("moe_num_shared_experts", "tie_word_embeddings", "rms_norm_eps", "rope_parameters",
                          "head_dim")),
}
