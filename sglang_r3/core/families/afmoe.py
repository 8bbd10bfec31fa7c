"""AFMoE / Arcee Trinity (afmoe.py): what their config classes say, the layout rule, the registry entries and their key
accounting."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import RuleError, Facts, Stack, Family, _kv_heads_default_to_heads, _int, _stack
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


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


FAMILIES: Tuple[Family, ...] = (
    Family("AFMoE (Arcee Trinity)", {"AfmoeForCausalLM": "afmoe"}, {"afmoe": _AFMOE}, _afmoe),
)

KEYS: Dict[str, Keys] = {
    "AFMoE (Arcee Trinity)": Keys(
        neutral={**_SILU,
                 # SGLang's only (transformers 5.19's save writes a given factor at the top level too)
                 "partial_rotary_factor": ((1.0,), "afmoe.py's AfmoeAttention rotates head_dim * partial_rotary_factor "
                                                   "dims, transformers' Afmoe always the whole head")},
        proven=_SHAPES + ("global_attn_every_n_layers", "mup_enabled", "num_shared_experts", "route_scale",
                          "sliding_window", "rms_norm_eps", "rope_parameters", "head_dim"),
        irrelevant={**{k: "SGLang's only: afmoe.py reads it where the config has no num_dense_layers, which SGLang's "
                          "AfmoeConfig always sets" for k in ("first_k_dense_replace", "moe_layer_freq")},
                    "topk_group": "SGLang's only: afmoe.py's grouped top-k reads it when n_group > 1, which the layout "
                                  "rule refuses"}),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "AfmoeForCausalLM"
})
