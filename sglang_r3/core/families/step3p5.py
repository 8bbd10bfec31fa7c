"""Step-3.5 (step3p5.py, step3p5_mtp.py): what their config classes say, the layout rule, the registry entries and their
key accounting."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import (
    ConfigError, RuleError, Facts, MTP_MULTI_LAYER, Stack, Family, _int, _mtp_count, _stack
)
from sglang_r3.core.families.keys import Keys


def _step3p5_fields(d: Dict[str, Any]) -> None:
    # SGLang's configs/step3p5.py: the share_expert_dims keyword is stored as share_expert_dim (default
    # 1280); yarn_only_types None becomes []. moe_layers_enum is a "3,4,..." string in published files
    # and a tuple of ints as the class default; SGLang's _is_moe_layer splits the string. One spelling: a
    # list of ints.
    dims = d.pop("share_expert_dims", None)
    if d.get("share_expert_dim") is None:
        d["share_expert_dim"] = 1280 if dims is None else dims
    if d.get("yarn_only_types") is None:
        d["yarn_only_types"] = []
    enum = d.get("moe_layers_enum")
    if isinstance(enum, str):
        try:
            d["moe_layers_enum"] = [int(x) for x in enum.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"moe_layers_enum must be comma-separated layer ids, got {enum!r}") from None
    elif enum is not None:
        d["moe_layers_enum"] = [int(x) for x in enum]


# SGLang's own class (configs/step3p5.py); __init__ keyword defaults.
_STEP3P5 = Facts(
    aliases={},
    defaults={"head_dim": 128, "hidden_size": 4096, "intermediate_size": 11264,
              "max_position_embeddings": 128000, "moe_intermediate_size": 1280,
              "moe_layers_enum": tuple(range(3, 45)), "moe_num_experts": 288, "moe_top_k": 8,
              "norm_expert_weight": True, "num_attention_groups": 8, "num_attention_heads": 64,
              "num_hidden_layers": 45, "rms_norm_eps": 1e-05, "rope_theta": 10000, "vocab_size": 128815},
    derive=(_step3p5_fields,),
)

# step3p5_mtp.py builds every MTP layer's block as Step3p5DecoderLayer(layer_id=45) ("FIXME"): each
# depth reads layer 45's entries of moe_layers_enum / layer_types / swiglu_limits.
_STEP3P5_MTP_LAYER_ID = 45


def _step3p5(v, arch) -> Stack:
    """Step-3.5 (step3p5.py `_is_moe_layer`): a decoder layer is MoE iff its id is in moe_layers_enum;
    moe_num_experts experts, moe_top_k. Its K = num_nextn_predict_layers MTP layers (step3p5_mtp.py,
    one per draft step under multi-layer EAGLE) are all built as layer 45, so each is MoE iff 45 is in
    moe_layers_enum. A config whose MTP layers would be built otherwise than it says (decoder count
    not 45, or ids 45..45+K-1 not all MoE or all dense) is refused."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "moe_num_experts", arch)
    k = _int(v, "moe_top_k", arch)
    enum = v.get("moe_layers_enum")
    if enum is None:
        raise RuleError(f"{arch} config is missing 'moe_layers_enum', which its layout rule needs")
    sparse = {int(x) for x in enum}
    n_mtp = _mtp_count(v, arch, default=0)
    if n_mtp:
        if L != _STEP3P5_MTP_LAYER_ID:
            raise RuleError(
                f"{arch}: num_hidden_layers={L}, but SGLang 0.5.23 builds every Step-3.5 MTP layer as layer "
                f"{_STEP3P5_MTP_LAYER_ID} (step3p5_mtp.py); refusing a layout SGLang would not serve"
            )
        says = {L + j: (L + j) in sparse for j in range(n_mtp)}
        if len(set(says.values())) > 1:
            raise RuleError(
                f"{arch}: moe_layers_enum makes MTP layers {sorted(i for i, s in says.items() if s)} MoE and "
                f"{sorted(i for i, s in says.items() if not s)} dense, but SGLang 0.5.23 builds all of them as "
                f"layer {_STEP3P5_MTP_LAYER_ID}; refusing a layout SGLang would not serve"
            )
    return _stack(L, lambda i: i in sparse, E, k, n_mtp, mtp_moe=_STEP3P5_MTP_LAYER_ID in sparse)


_STEP3P5_PENDING = ("Step-3.5's served forwards are held to SGLang itself (weights drawn from a seed, spec on = off), "
                    "not to transformers' class")

FAMILIES: Tuple[Family, ...] = (
    Family("Step-3.5", {"Step3p5ForCausalLM": "step3p5"}, {"step3p5": _STEP3P5}, _step3p5,
           mtp=MTP_MULTI_LAYER, multi_layer_capture=True),
)

KEYS: Dict[str, Keys] = {
    "Step-3.5": Keys(pending_all=_STEP3P5_PENDING),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "Step3p5ForCausalLM"
})
