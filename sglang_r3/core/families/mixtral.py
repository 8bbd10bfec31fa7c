"""Mixtral (mixtral.py): what their config classes say, the layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import (
    RuleError, Facts, Stack, Family, _kv_heads_default_to_heads, _int, _every_layer_moe
)
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


_MIXTRAL = Facts(
    aliases={"num_experts": "num_local_experts"},
    defaults={"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
              "max_position_embeddings": 131072, "num_attention_heads": 32, "num_experts_per_tok": 2,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
              "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 32000},
    derive=(_kv_heads_default_to_heads,),
)


def _mixtral(v, arch) -> Stack:
    """Mixtral: every layer MoE. SGLang's mixtral.py sizes its heads hidden_size // num_attention_heads whatever
    head_dim says, while its KV pool and transformers' MixtralForCausalLM use head_dim: served with head_dim 32
    (hidden 64, 4 heads), the first forward stopped on a shape mismatch. Another head_dim is refused, and a
    sliding window shorter than the context (served with 8, rows differed)."""
    hidden, heads, head_dim = _int(v, "hidden_size", arch), _int(v, "num_attention_heads", arch), v.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise RuleError(
            f"{arch}: head_dim={head_dim} is not hidden_size // num_attention_heads = {hidden // heads}: SGLang 0.5.23 "
            f"(mixtral.py) sizes its attention heads from the latter, transformers from head_dim; refusing")
    # mixtral.py attends to every key; transformers' Mixtral masks beyond sliding_window (the releases set null).
    window, positions = v.get("sliding_window"), _int(v, "max_position_embeddings", arch)
    if window is not None and window < positions:
        raise RuleError(
            f"{arch}: sliding_window={window}: SGLang 0.5.23 (mixtral.py) attends to every key, transformers' "
            f"Mixtral only to the last {window}; refusing")
    return _every_layer_moe(v, arch)


FAMILIES: Tuple[Family, ...] = (
    Family("Mixtral", {"MixtralForCausalLM": "mixtral"}, {"mixtral": _MIXTRAL}, _mixtral),
)

KEYS: Dict[str, Keys] = {
    "Mixtral": Keys(neutral=_SILU, proven=_SHAPES + ("rms_norm_eps", "rope_parameters")),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "MixtralForCausalLM"
})
