"""Nemotron-H / Nemotron-3 (nemotron_h.py, nemotron_h_mtp.py): what their config classes say, the layout rule, the
registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from sglang_r3.core.families._base import (
    ConfigError, RuleError, Facts, MTP_NEXTN, Stack, Family, _kv_heads_default_to_heads, _int, _stack
)
from sglang_r3.core.families.keys import Keys, _INIT_ONLY, _SHAPES


# Nemotron-H (SGLang's own class, configs/nemotron_h.py; transformers' NemotronHConfig spells some keys otherwise).
# Block types: SGLang's names ("mamba", "attention", "mlp", "moe"; pattern characters M * - E); transformers 5.19
# writes "linear_attention" / "full_attention" for the first two (its legacy remap), and SGLang 0.5.23 refuses a
# file that does (NemotronHConfig._validate_layers_block_type). One spelling in the view: SGLang's.
_NEMOTRON_H_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}

_NEMOTRON_H_NAMES = {"linear_attention": "mamba", "full_attention": "attention", "mamba": "mamba",
                     "attention": "attention", "mlp": "mlp", "moe": "moe"}


def _nemotron_h_types(value: Any, key: str) -> List[str]:
    if isinstance(value, str):
        bad = sorted(set(value) - set(_NEMOTRON_H_PATTERN))
        if bad:
            raise ConfigError(f"{key}={value!r} has characters {bad} (Nemotron-H blocks are M, *, - and E)")
        return [_NEMOTRON_H_PATTERN[c] for c in value]
    out = []
    for t in value:
        if t not in _NEMOTRON_H_NAMES:
            raise ConfigError(f"{key} has a block type {t!r} (Nemotron-H blocks are mamba, attention, mlp, moe)")
        out.append(_NEMOTRON_H_NAMES[t])
    return out


def _nemotron_h_fields(d: Dict[str, Any]) -> None:
    """SGLang's NemotronHConfig.__init__, in its order, in one spelling: the layers from layers_block_type, else
    hybrid_override_pattern (the class default pattern when neither is given), num_hidden_layers their count; the
    Mamba keywords (mamba_d_conv, mamba_conv_bias) stored under the names the file may also give (conv_kernel,
    use_conv_bias: given, they win, as the class's kwargs land after its keywords); MTP block types from
    mtp_hybrid_override_pattern where the list is the default."""
    pattern = d.pop("hybrid_override_pattern", None)
    types = d.get("layers_block_type")
    types = _nemotron_h_types(types, "layers_block_type") if types is not None else (
        _nemotron_h_types(pattern, "hybrid_override_pattern") if pattern is not None else None)
    layer_types = d.pop("layer_types", None)  # transformers' alias of layers_block_type; SGLang's class ignores it
    if layer_types is not None and (types is None or _nemotron_h_types(layer_types, "layer_types") != types):
        raise ConfigError(
            f"layer_types={list(layer_types)} (transformers' alias of layers_block_type) disagree with the layers "
            f"SGLang's NemotronHConfig builds (from layers_block_type / hybrid_override_pattern: {types})"
        )
    if types is not None:
        d["layers_block_type"] = types
        d["num_hidden_layers"] = len(types)
    for keyword, stored in (("mamba_d_conv", "conv_kernel"), ("mamba_conv_bias", "use_conv_bias")):
        value = d.pop(keyword, None)
        if d.get(stored) is None and value is not None:
            d[stored] = value
    # The Mamba mixer's groups are mamba_n_groups (keyword, default 8), its state cache's n_groups (read from the
    # file's kwargs; transformers reads n_groups, or mamba_n_groups where given): a file where they differ builds
    # a mixer that does not fit its cache.
    mixer = d.pop("mamba_n_groups", None)
    cache = d.get("n_groups")
    if cache is None:
        d["n_groups"] = mixer
    elif mixer is not None and int(mixer) != int(cache):
        raise ConfigError(
            f"n_groups={cache} but mamba_n_groups={mixer}: SGLang's NemotronHConfig builds the Mamba mixer with "
            f"mamba_n_groups (default 8) and its state cache with n_groups"
        )
    mtp = d.get("mtp_layers_block_type")
    mtp = _nemotron_h_types(mtp, "mtp_layers_block_type") if mtp is not None else None
    mtp_pattern = d.pop("mtp_hybrid_override_pattern", None)
    if mtp_pattern is not None and mtp in (None, ["attention", "moe"]):
        mtp = _nemotron_h_types(mtp_pattern, "mtp_hybrid_override_pattern")
    if mtp is not None:
        d["mtp_layers_block_type"] = mtp


# SGLang's own class (configs/nemotron_h.py); __init__ keyword defaults.
_NEMOTRON_H = Facts(
    aliases={},
    defaults={"attention_bias": False, "head_dim": 128, "hidden_size": 4096,
              "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
              "intermediate_size": 21504, "layer_norm_epsilon": 1e-05, "mamba_conv_bias": True, "mamba_d_conv": 4,
              "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_n_groups": 8, "mamba_num_heads": 128,
              "max_position_embeddings": 4096, "mlp_bias": False, "mlp_hidden_act": "relu2",
              "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
              "mtp_layers_block_type": ["attention", "moe"], "n_group": 1, "n_routed_experts": 8,
              "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts_per_tok": 2,
              "num_key_value_heads": 8, "num_nextn_predict_layers": 0, "rope_theta": 10000.0,
              "routed_scaling_factor": 1.0, "ssm_state_size": 128, "tie_word_embeddings": False, "topk_group": 1,
              "use_bias": False, "vocab_size": 131072},
    derive=(_kv_heads_default_to_heads, _nemotron_h_fields),
    # the hybrid blocks, the Mamba-2 mixer's shape and activations, the MLPs' activation and biases, the shared
    # expert's width and the latent MoE projection (nemotron_h.py and mamba.py read them)
    routing_keys=("hybrid_override_pattern", "layers_block_type", "mlp_hidden_act", "mlp_bias", "use_bias",
                  "layer_norm_epsilon", "mamba_hidden_act", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                  "mamba_n_groups", "n_groups", "mamba_d_conv", "conv_kernel", "mamba_conv_bias", "use_conv_bias",
                  "moe_shared_expert_intermediate_size", "moe_latent_size"),
)


def _nemotron_h(v, arch) -> Stack:
    """Nemotron-H (nemotron_h.py): one decoder layer per block of layers_block_type / hybrid_override_pattern
    (Mamba-2, attention, MLP or MoE, as Megatron numbers them), MoE iff the block is "moe" ('E'): a TopK over
    n_routed_experts (sigmoid scores, e_score_correction_bias, grouped top-k), num_experts_per_tok.

    Refused, naming the key, where SGLang 0.5.23 and transformers' NemotronH build different models, or where
    SGLang does not serve: num_nextn_predict_layers > 1 (nemotron_h_mtp.py asserts one MTP layer), an MTP block
    pattern (mtp_layers_block_type / mtp_hybrid_override_pattern) with Mamba or MLP blocks (it builds attention and
    MoE blocks only) or more than one MoE block (one router per MTP layer in the record); n_shared_experts other
    than 1
    (SGLang widens the shared expert by it, transformers builds one of moe_shared_expert_intermediate_size
    whatever it says), mlp_hidden_act other than relu2 (SGLang's dense and shared MLPs are ReLU^2 whatever it
    says), mamba_hidden_act other than silu (SGLang's convolution kernels apply silu or nothing), mlp_bias
    (SGLang's shared expert has no bias), sliding_window (SGLang windows its attention, transformers does not)."""
    types = v.get("layers_block_type")
    if types is None:
        raise RuleError(f"{arch} config is missing 'hybrid_override_pattern' (or 'layers_block_type'), which its "
                        f"layout rule needs")
    L = len(types)
    E = _int(v, "n_routed_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    n_mtp = _int(v, "num_nextn_predict_layers", arch, default=0)
    refusals = []
    # One MTP layer (Nemotron-3-Ultra's head: attention then MoE, "*E"): SGLang's draft runs its blocks in order,
    # eh_proj of [embedding; hidden] first, one final norm last (nemotron_h_mtp.py).
    mtp_blocks = list(v.get("mtp_layers_block_type") or []) if n_mtp else []
    if n_mtp > 1:
        refusals.append(f"num_nextn_predict_layers={n_mtp}: SGLang's nemotron_h_mtp.py serves one MTP layer "
                        f"(it asserts so)")
    if set(mtp_blocks) - {"attention", "moe"}:
        refusals.append(f"mtp_layers_block_type={mtp_blocks}: SGLang's nemotron_h_mtp.py builds attention and MoE "
                        f"blocks only")
    if mtp_blocks.count("moe") > 1:
        refusals.append(f"mtp_layers_block_type={mtp_blocks}: {mtp_blocks.count('moe')} MoE blocks in one MTP "
                        f"layer (the record holds one router per MTP layer)")
    shared = _int(v, "n_shared_experts", arch)
    if shared != 1:
        refusals.append(f"n_shared_experts={shared}: SGLang builds a shared expert "
                        f"moe_shared_expert_intermediate_size * n_shared_experts wide (none for 0), transformers' "
                        f"NemotronH one moe_shared_expert_intermediate_size wide")
    if v.get("mlp_hidden_act") != "relu2":
        refusals.append(f"mlp_hidden_act={v.get('mlp_hidden_act')!r}: SGLang's dense and shared-expert MLPs are "
                        f"ReLU^2 whatever it says, transformers' NemotronH applies it")
    if v.get("mamba_hidden_act") not in ("silu", "swish"):
        refusals.append(f"mamba_hidden_act={v.get('mamba_hidden_act')!r}: SGLang's causal convolution applies silu "
                        f"or nothing, transformers' NemotronH applies it")
    if v.get("mlp_bias"):
        refusals.append("mlp_bias=True: SGLang's shared expert has no bias, transformers' NemotronH gives it one")
    if v.get("sliding_window") is not None:
        refusals.append(f"sliding_window={v.get('sliding_window')!r}: SGLang windows the attention layers by it, "
                        f"transformers' NemotronH attends to every key")
    if refusals:
        raise RuleError(f"{arch}: " + "; ".join(refusals) + "; refusing")
    return _stack(L, lambda i: types[i] == "moe", E, k, n_mtp, mtp_moe="moe" in mtp_blocks)


FAMILIES: Tuple[Family, ...] = (
    # Nemotron-3 (nemotron_h.py): Mamba-2, attention, MLP and MoE blocks of one hybrid pattern, each a decoder
    # layer; MoE at the pattern's E blocks. Nano publishes no MTP layer; Ultra one (nemotron_h_mtp.py: its blocks,
    # attention then MoE, drafting as one NextN layer reused per step).
    Family("Nemotron-H (Nemotron-3)", {"NemotronHForCausalLM": "nemotron_h"}, {"nemotron_h": _NEMOTRON_H},
           _nemotron_h, mtp=MTP_NEXTN),
)

KEYS: Dict[str, Keys] = {
    "Nemotron-H (Nemotron-3)": Keys(proven=_SHAPES + (
        "head_dim", "mamba_head_dim", "mamba_num_heads", "moe_latent_size", "moe_shared_expert_intermediate_size",
        "n_group", "norm_topk_prob", "num_hidden_layers", "routed_scaling_factor", "ssm_state_size", "topk_group",
        "use_conv_bias", "layer_norm_epsilon", "conv_kernel", "n_groups", "use_bias"),
        # transformers clamps the Mamba step at (time_step_min, inf), SGLang's MambaMixer2 at (0, inf) (mamba.py):
        # the same wherever softplus(dt + dt_bias) >= time_step_min, which the published value's served forwards show
        neutral={"time_step_min": ((0.001,), "SGLang's Mamba mixer clamps the step at 0, transformers' NemotronH at "
                                             "time_step_min"),
                 "tie_word_embeddings": ((False,), "transformers' NemotronH never ties its head (_tied_weights_keys "
                                                   "empty: a tied save still holds lm_head.weight), SGLang's "
                                                   "nemotron_h.py ties it to the embedding")},
        via={"hybrid_override_pattern": "layers_block_type: SGLang's and transformers' configs both derive the "
                                         "layer kinds from it where layers_block_type is absent (the config view "
                                         "too), and read layers_block_type after",
             "mamba2_cache_params": "SGLang's only: a property its NemotronHConfig computes from the Mamba keys (a "
                                    "file's value stops the config's load)",
             "max_n_routed_experts": "SGLang's only: a property its NemotronHConfig computes from n_routed_experts",
             "mamba_n_groups": "n_groups: SGLang's name for the Mamba groups transformers reads as n_groups; the "
                               "config view refuses the two given apart"},
        irrelevant={"chunk_size": "the Mamba scan's chunk length: the same sums grouped otherwise (transformers' "
                                  "logits move by under 1e-6 with it)",
                    "time_step_floor": _INIT_ONLY, "time_step_max": _INIT_ONLY, "rescale_prenorm_residual": _INIT_ONLY,
                    "use_mamba_kernels": "deprecated in transformers' NemotronH: no effect (it warns); SGLang never "
                                         "reads it",
                    **{k: "declared by the config classes, read by neither transformers' modeling_nemotron_h.py nor "
                          "SGLang's nemotron_h.py / MambaMixer2 (transformers' clamp is (time_step_min, inf); "
                          "attention and the Mamba projections' biases follow nothing but use_bias there)"
                       for k in ("attention_bias", "expand", "mamba_proj_bias", "mamba_ssm_cache_dtype",
                                 "moe_shared_expert_overlap", "residual_in_fp32", "time_step_limit")}}),
}
