"""Step-3.5 (step3p5.py, step3p5_mtp.py): what their config classes say, the layout rule, the registry entries and their
key accounting."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Tuple

from sglang_r3.core.families._base import (
    ConfigError, RuleError, Facts, MTP_MULTI_LAYER, Stack, Family, _int, _mtp_count, _stack
)
from sglang_r3.core.families.keys import Keys, _SHAPES


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


def _step3p5_mtp(v, arch, L: int, sparse: set, n_mtp: int) -> None:
    """The MTP layers SGLang builds (all as layer 45: its moe_layers_enum and layer_types entries) against what the
    config says of them: transformers' mtp_mlp_layer_types / mtp_layer_types where given."""
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
    mlp = v.given.get("mtp_mlp_layer_types")
    built = ["sparse" if _STEP3P5_MTP_LAYER_ID in sparse else "dense"] * n_mtp
    if mlp is not None and list(mlp) != built:
        raise RuleError(f"{arch}: mtp_mlp_layer_types={list(mlp)}, but SGLang 0.5.23 builds its {n_mtp} MTP layers "
                        f"as layer {_STEP3P5_MTP_LAYER_ID} of moe_layers_enum: {built}; refusing")
    attn = v.given.get("mtp_layer_types")
    types = list(v.get("layer_types") or [])
    if attn is not None:
        built = [types[_STEP3P5_MTP_LAYER_ID]] * n_mtp if len(types) > _STEP3P5_MTP_LAYER_ID else None
        if list(attn) != built:
            raise RuleError(f"{arch}: mtp_layer_types={list(attn)}, but SGLang 0.5.23 builds its MTP layers' "
                            f"attention from layer_types[{_STEP3P5_MTP_LAYER_ID}] ({built}); refusing")


def _step3p5_attention(v, arch, L: int) -> None:
    """Attention keys the two read otherwise: transformers' Step3p7TextConfig (heads of sliding-attention layers from
    num_sliding_attention_heads / per_layer_config, kv heads num_key_value_heads in every layer, the scale
    query_pre_attn_scalar ** -0.5, a RoPE per layer type) and SGLang's step3p5.py (attention_other_setting's heads and
    groups in sliding-attention layers, the scale head_dim ** -0.5, rope_theta / partial_rotary_factors per layer,
    rope_scaling on the types in yarn_only_types). A value on which they build otherwise is refused naming it."""
    head_dim = _int(v, "head_dim", arch)
    scalar = v.given.get("query_pre_attn_scalar")
    if scalar is not None and scalar != head_dim:
        raise RuleError(f"{arch}: query_pre_attn_scalar={scalar!r}: transformers' Step3p7Attention scales scores by "
                        f"query_pre_attn_scalar ** -0.5, SGLang 0.5.23 (step3p5.py) by head_dim ** -0.5 "
                        f"(head_dim={head_dim}); refusing")
    types = list(v.get("layer_types") or ["full_attention"] * L)
    other = v.given.get("attention_other_setting")
    groups = _int(v, "num_attention_groups", arch)
    sliding_heads = None
    if other is not None:
        sliding_heads = other.get("num_attention_heads")
        if other.get("num_attention_groups") != groups:
            raise RuleError(
                f"{arch}: attention_other_setting={other!r}: SGLang 0.5.23 (step3p5.py) builds sliding-attention "
                f"layers with its num_attention_groups kv heads, transformers' Step3p7Attention with "
                f"num_attention_groups={groups} (num_key_value_heads) in every layer; refusing")
    # (without attention_other_setting start-up refuses the config: a required key)
    given_heads = v.given.get("num_sliding_attention_heads")
    if other is not None and given_heads is not None and given_heads != sliding_heads:
        raise RuleError(
            f"{arch}: num_sliding_attention_heads={given_heads!r}: transformers builds sliding-attention layers with it, "
            f"SGLang 0.5.23 (step3p5.py) with attention_other_setting's num_attention_heads ({sliding_heads!r}); "
            f"refusing")
    per_layer = v.given.get("per_layer_config")
    if other is not None and per_layer:
        built = {i: {"num_attention_heads": sliding_heads} for i in range(L) if types[i] == "sliding_attention"}
        if {int(i): dict(c) for i, c in per_layer.items()} != built:
            raise RuleError(
                f"{arch}: per_layer_config={per_layer!r}: transformers builds those layers' attention from it, "
                f"SGLang 0.5.23 (step3p5.py) the sliding-attention layers' from attention_other_setting "
                f"({built}); refusing")
    # RoPE: transformers takes one base and partial factor per layer type (the first layer's of that type).
    for key in ("rope_theta", "partial_rotary_factors"):
        per_layer_values = v.given.get(key)
        if not isinstance(per_layer_values, (list, tuple)):
            continue
        for t in set(types[:len(per_layer_values)]):
            values = {per_layer_values[i] for i in range(min(len(types), len(per_layer_values))) if types[i] == t}
            if len(values) > 1:
                raise RuleError(
                    f"{arch}: {key}={list(per_layer_values)}: SGLang 0.5.23 (step3p5.py) reads it per layer, "
                    f"transformers' Step3p7TextConfig once per layer type ({t!r} layers here differ); refusing")
    # transformers reads rope_parameters only where it holds a dict per layer type (its own save); otherwise (a flat
    # dict: PretrainedConfig's standardisation of rope_theta) it builds them from rope_theta, as SGLang does.
    rope = v.given.get("rope_parameters")
    per_type = isinstance(rope, dict) and all(isinstance(rope.get(t), dict) for t in set(types[:L]))
    if per_type and isinstance(v.given.get("rope_theta"), (list, tuple)):
        theta, factors = v.given["rope_theta"], v.given.get("partial_rotary_factors")
        for t in set(types[:L]):
            i = types.index(t)
            want = {"rope_theta": theta[i], "partial_rotary_factor": factors[i] if factors else 1.0}
            got = rope.get(t) or {}
            if (got.get("rope_type", "default") != "default" or got.get("rope_theta") != want["rope_theta"]
                    or got.get("partial_rotary_factor", 1.0) != want["partial_rotary_factor"]):
                raise RuleError(
                    f"{arch}: rope_parameters={rope!r}: transformers rotates {t!r} layers with it, SGLang 0.5.23 "
                    f"(step3p5.py) with rope_theta / partial_rotary_factors ({want}); refusing")
    scaling = v.given.get("rope_scaling")
    if scaling:
        yarn = set(v.given.get("yarn_only_types") or [])
        if yarn & set(types[:L]) != {"full_attention"} & set(types[:L]):
            raise RuleError(
                f"{arch}: rope_scaling={scaling!r} with yarn_only_types={sorted(yarn)}: SGLang 0.5.23 (step3p5.py) "
                f"scales the RoPE of the layer types in yarn_only_types, transformers' Step3p7TextConfig that of "
                f"full_attention layers; refusing")


# The per-layer SwiGLU clamps (routed experts, shared expert / dense MLP). Named here, not in the rule's source: a
# null refused is no evidence on the values, and the routed one stays pending in KEYS (_STEP3P5_ROUTED_CLAMP).
_STEP3P5_CLAMPS = ("swiglu_limits", "swiglu_limits_shared")


def _step3p5_values(v, arch) -> None:
    """Keys SGLang's step3p5.py reads where transformers' class has no choice (it always gates each head and adds
    the router's bias) or takes another spelling (no clamp: None; SGLang compares each entry with 0)."""
    for key in ("use_head_wise_attn_gate", "use_moe_router_bias"):
        if key in v.given and v.given[key] is not True:
            raise RuleError(f"{arch}: {key}={v.given[key]!r}: SGLang 0.5.23 (step3p5.py) then builds no "
                            f"{'attention gate' if key == 'use_head_wise_attn_gate' else 'router bias'}, "
                            f"transformers' Step3p7 class always has one; refusing")
    for key in _STEP3P5_CLAMPS:
        if key in v.given and (v.given[key] is None or any(x is None for x in v.given[key])):
            raise RuleError(f"{arch}: {key}={v.given[key]!r}: SGLang 0.5.23 (step3p5.py) indexes it per layer and "
                            f"compares each entry with 0 (no clamp: 0, not null); refusing")


def _step3p5(v, arch) -> Stack:
    """Step-3.5 (step3p5.py `_is_moe_layer`): a decoder layer is MoE iff its id is in moe_layers_enum;
    moe_num_experts experts, moe_top_k. Its K = num_nextn_predict_layers MTP layers (step3p5_mtp.py,
    one per draft step under multi-layer EAGLE) are all built as layer 45, so each is MoE iff 45 is in
    moe_layers_enum. A config whose MTP layers would be built otherwise than it says (decoder count
    not 45, or ids 45..45+K-1 not all MoE or all dense) is refused. transformers' Step3p7TextConfig builds the
    decoder layers from mlp_layer_types where given (else from moe_layers_enum too): where both are given they must
    agree. The attention keys the two read otherwise: _step3p5_attention."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "moe_num_experts", arch)
    k = _int(v, "moe_top_k", arch)
    enum = v.get("moe_layers_enum")
    if enum is None:
        raise RuleError(f"{arch} config is missing 'moe_layers_enum', which its layout rule needs")
    sparse = {int(x) for x in enum}
    types = v.given.get("mlp_layer_types")
    if types is not None and "moe_layers_enum" in v.given:
        built = ["sparse" if i in sparse else "dense" for i in range(L)]
        if list(types)[:L] != built:
            raise RuleError(
                f"{arch}: mlp_layer_types={list(types)} (what transformers builds each layer from) disagree with "
                f"moe_layers_enum (what SGLang 0.5.23 builds them from: MoE layers {sorted(i for i in sparse if i < L)});"
                f" refusing a layout one of them would not serve")
    _step3p5_attention(v, arch, L)
    _step3p5_values(v, arch)
    n_mtp = _mtp_count(v, arch, default=0)
    if n_mtp:
        _step3p5_mtp(v, arch, L, sparse, n_mtp)
    return _stack(L, lambda i: i in sparse, E, k, n_mtp, mtp_moe=_STEP3P5_MTP_LAYER_ID in sparse)


# Keys SGLang's step3p5.py / configs/step3p5.py read unconditionally that transformers' Step3p7TextConfig neither
# saves (it saves n_routed_experts, mlp_layer_types, rope_parameters, ... in its own spelling) nor reads: a
# transformers-saved Step-3.5 config.json lacks them, and SGLang builds 288 experts, splits a tuple, indexes a float
# or reads a missing attribute. Start-up refuses it naming the key (the values stepfun-ai/Step-3.5-Flash publishes).
_STEP3P5_REQUIRED = {
    "moe_layers_enum": ("3,4,...,44", "step3p5.py Step3p5DecoderLayer._is_moe_layer splits it"),
    "moe_num_experts": (288, "step3p5.py Step3p5MoEMLP (its class default, 288, otherwise)"),
    "moe_top_k": (8, "step3p5.py Step3p5MoEMLP (its class default, 8, otherwise)"),
    "num_attention_groups": (8, "step3p5.py Step3p5DecoderLayer (its class default, 8, otherwise)"),
    "rope_theta": ([10000.0], "step3p5.py Step3p5DecoderLayer indexes it per layer"),
    "partial_rotary_factors": ([1.0], "step3p5.py Step3p5DecoderLayer indexes it per layer"),
    "swiglu_limits_shared": ([0], "step3p5.py Step3p5DecoderLayer indexes it per layer"),
    "attention_other_setting": ({"num_attention_heads": 96, "num_attention_groups": 8},
                                "step3p5.py Step3p5DecoderLayer, for sliding-attention layers"),
    "use_head_wise_attn_gate": (True, "step3p5.py Step3p5DecoderLayer"),
    "use_moe_router_bias": (True, "step3p5.py Step3p5MoEMLP"),
    "need_fp32_gate": (True, "step3p5.py Step3p5MoEMLP"),
}

# sliding_window: SGLang's step3p5.py (0.5.23 and 0.5.15.post1) hands config.sliding_window to its attention as the
# keys before the query, so it attends sliding_window + 1 keys (torch_native keeps k >= q - window; gemma3_causal.py and
# gpt_oss.py pass sliding_window - 1), where the release's modeling_step3p5.py and transformers' Step3p7 mask to
# sliding_window keys. An upstream difference past the window, served as SGLang computes it (the rows are what its
# forward routed; refusing the key would refuse the published Step-3.5-Flash). Proven as SGLang reads it: the flipped
# checkpoint's window (4) is shorter than every test sequence and its rows equal transformers' at window + 1; the
# published window's rows differ (tests/test_families.py pins both; tests/family_specs/published.py).

# num_sliding_attention_heads is ruled (refused where it disagrees with attention_other_setting), not proven: a
# sliding-attention head count other than num_attention_heads stops SGLang 0.5.23's own config parsing with
# transformers 5.19 (hf_transformers/config.py HfModelConfigParser.parse reads the file with AutoConfig first, which
# maps step3p5 to Step3p7TextConfig; that class makes num_attention_heads per-layer, and parse's hasattr raises
# AmbiguousGlobalPerLayerAttributeError while SGLang resolves its arguments: seen serving a tiny checkpoint with 8
# sliding / 4 full heads). The served checkpoints keep the two equal.

FAMILIES: Tuple[Family, ...] = (
    Family("Step-3.5", {"Step3p5ForCausalLM": "step3p5"}, {"step3p5": _STEP3P5}, _step3p5,
           mtp=MTP_MULTI_LAYER, multi_layer_capture=True, required_keys=_STEP3P5_REQUIRED),
)

_NO_BIAS = "SGLang's step3p5.py builds its attention projections and MLPs without biases"

KEYS: Dict[str, Keys] = {
    # Proven by tests/test_families.py's step3p5 / step3p5_flipped checkpoints (transformers' Step3p7 class, saved
    # and rewritten as published: tests/family_specs/published.py _step3p5_as_published).
    "Step-3.5": Keys(
        neutral={"attention_bias": ((False,), _NO_BIAS), "mlp_bias": ((False,), _NO_BIAS),
                 "use_bidirectional_attention": ((False,), "SGLang's step3p5.py attends causally only"),
                 "gating": ((True, "per-head"), "SGLang's step3p5.py gates each head with a scalar "
                                                 "(use_head_wise_attn_gate), transformers per element otherwise")},
        proven=_SHAPES + ("head_dim", "n_routed_experts", "num_experts_per_tok", "share_expert_dim", "layer_types",
                          "mlp_layer_types", "rms_norm_eps", "rope_parameters",
                          "moe_router_scaling_factor", "swiglu_limits_shared", "swiglu_limits", "sliding_window"),
        irrelevant={"hidden_act": "transformers' Step3p7TextConfig sets it to silu whatever the file says "
                                  "(__post_init__); SGLang's step3p5.py builds SiLU",
                    # SGLang's only
                    "scale_emb": "read by step3p5.py's Step3p5Model.get_input_embedding only, which neither the forward "
                                 "nor the MTP draft calls (both embed with embed_tokens)"},
        # swiglu_limits: the CPU runtime clamps the routed experts as SGLang's CUDA runner (cpu_runtime/families/step3p5.py, held to
        # transformers' Step3p7Experts in tests/test_cpu_step3p5.py); the flipped checkpoint serves a clamp of 0.002
        # with equal rows, though its routed experts move the logits too little for that forward alone to tell;
        # sliding_window as SGLang attends it (window + 1 keys: above)
    ),
}

# This module's architectures whose SGLang model builds its own lm_head whatever tie_word_embeddings says (the
# registry's UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = frozenset({
    "Step3p5ForCausalLM"
})
