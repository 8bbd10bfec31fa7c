"""Granite-MoE (granitemoe.py): what their config classes say, the layout rule, the registry entries and their key
accounting."""

from __future__ import annotations

from typing import Dict, Tuple

from sglang_r3.core.families._base import (
    RuleError, Facts, Stack, Family, _kv_heads_default_to_heads, _head_dim_derived, _every_layer_moe
)
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


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


def _granitemoe(v, arch) -> Stack:
    """Granite-MoE (granitemoe.py: every decoder layer GraniteMoeMoE). Its attention projections have no biases
    whatever attention_bias says; transformers' GraniteMoe honours it (served with it set, 36 of 106 greedy
    (token, layer) pairs differed). The published configs leave it false; a config that sets it is refused."""
    if v.get("attention_bias") is True:
        raise RuleError(f"{arch}: attention_bias=True: SGLang 0.5.23 (granitemoe.py) builds its attention without "
                        f"biases, transformers' GraniteMoe applies them; refusing")
    _head_dim_derived(v, arch, "granitemoe.py")
    return _every_layer_moe(v, arch)


FAMILIES: Tuple[Family, ...] = (
    # granitemoe.py: every decoder layer GraniteMoeMoE (TopK over num_local_experts).
    Family("Granite-MoE", {"GraniteMoeForCausalLM": "granitemoe"}, {"granitemoe": _GRANITEMOE}, _granitemoe),
)

KEYS: Dict[str, Keys] = {
    "Granite-MoE": Keys(neutral={**_SILU,
                                 # SGLang's only: 0.5.23's granitemoe.py builds a shared MLP this wide when the config
                                 # names model_type granitemoeshared; 0.5.15's never does
                                 "shared_intermediate_size": ((0,), "SGLang 0.5.23 builds a shared-expert MLP of this "
                                                                    "width (model_type granitemoeshared), transformers' "
                                                                    "GraniteMoe has none")},
                        proven=_SHAPES + (
        "attention_multiplier", "embedding_multiplier", "logits_scaling", "residual_multiplier", "tie_word_embeddings",
        "rms_norm_eps", "rope_parameters")),
}
