"""MiniMax-M2 (minimax_m2.py): what their config classes say, the layout rule, the registry entries and their key
accounting."""

from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import RuleError, Facts, Stack, Family, _int, _every_layer_moe
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


_MINIMAX_M2 = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
              "max_position_embeddings": 196608, "num_attention_heads": 48, "num_experts_per_tok": 8,
              "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256, "rms_norm_eps": 1e-06,
              "rope_theta": 5000000.0, "tie_word_embeddings": False, "vocab_size": 200064},
    # Published config.json keys transformers' class keeps and SGLang's minimax_m2.py reads.
    routing_keys=("use_routing_bias", "qk_norm_type", "rotary_dim"),
)


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


FAMILIES: Tuple[Family, ...] = (
    # minimax_m2.py declares every decoder layer sparse (declare_ffn(sparse=True)); its MTP modules are not
    # built by SGLang 0.5.23's draft path for it, so no MTP layers.
    Family("MiniMax-M2", {"MiniMaxM2ForCausalLM": "minimax_m2"}, {"minimax_m2": _MINIMAX_M2}, _minimax_m2),
)

KEYS: Dict[str, Keys] = {
    "MiniMax-M2": Keys(
        neutral={**_SILU,
                 # SGLang's only
                 "qk_norm_type": (("per_layer",), "minimax_m2.py's MiniMaxM2Attention norms q and k over all heads "
                                                  "for per_layer, as transformers' class always does (another value "
                                                  "stops the model's build)")},
        proven=_SHAPES + ("rms_norm_eps", "head_dim", "rope_parameters"),
        irrelevant={"num_mtp_modules": "SGLang's only: minimax_m2.py reads it to skip the checkpoint's MTP tensors "
                                       "at load (get_spec_layer_idx_from_weight_name); no MiniMax-M2 draft is built"}),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "MiniMaxM2ForCausalLM"
})
