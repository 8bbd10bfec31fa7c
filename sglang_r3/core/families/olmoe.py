"""OLMoE (olmoe.py): what their config classes say, the layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import (
    RuleError, Facts, Stack, Family, _kv_heads_default_to_heads, _head_dim_derived, _every_layer_moe
)
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


_OLMOE = Facts(
    aliases={"num_local_experts": "num_experts"},
    defaults={"attention_bias": False, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 2048,
              "max_position_embeddings": 4096, "norm_topk_prob": False, "num_attention_heads": 16,
              "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16, "rms_norm_eps": 1e-05,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 50304},
    derive=(_kv_heads_default_to_heads,),
)


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


FAMILIES: Tuple[Family, ...] = (
    Family("OLMoE", {"OlmoeForCausalLM": "olmoe"}, {"olmoe": _OLMOE}, _olmoe),
)

KEYS: Dict[str, Keys] = {
    "OLMoE": Keys(neutral={**_SILU,
                           "rms_norm_eps": ((1e-05,), "SGLang's olmoe.py builds every norm with eps 1e-5 whatever the "
                                                      "key says"),
                           "sliding_window": ((None,), "transformers' OLMoE hands sliding_window to its attention, "
                                                       "SGLang's olmoe.py never windows")},
                  proven=_SHAPES + ("num_experts", "rope_parameters")),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "OlmoeForCausalLM"
})
