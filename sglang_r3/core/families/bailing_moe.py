"""Ling / Ring 2.0, Bailing-MoE V2 (bailing_moe.py): what their config classes say, the layout rule, the registry
entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from sglang_r3.core.families._base import RuleError, Facts, MTP_NEXTN, Stack, Family, _int, _mtp_count, _stack


def _head_dim_from_widths(d: Dict[str, Any]) -> None:
    if not d.get("head_dim") and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]


# Ling / Ring 2.0's config class is the release's own code (inclusionAI/Ling-V2 af8837e
# models/configuration_bailing_moe_v2.py; the tests' stand-in takes its keywords and defaults). Ling 1.x publishes the
# same model type with another class (configuration_bailing_moe.py); it has no rule.
_BAILING_MOE_V2 = Facts(
    aliases={},
    defaults={"first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
              "intermediate_size": 5120, "max_position_embeddings": 32768, "max_window_layers": 20,
              "moe_intermediate_size": 512, "moe_router_enable_expert_bias": True, "mtp_loss_scaling_factor": 0,
              "n_group": 8, "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 20,
              "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
              "rms_norm_eps": 1e-06, "rope_theta": 600000.0, "routed_scaling_factor": 1.0,
              "tie_word_embeddings": False, "topk_group": 4, "use_bias": False, "use_qk_norm": True,
              "use_qkv_bias": False, "vocab_size": 157184},
    derive=(_head_dim_from_widths,),
    # Keys of the published config.json the class keeps and SGLang's bailing_moe.py reads.
    routing_keys=("use_qkv_bias", "use_bias", "num_shared_experts", "moe_shared_expert_intermediate_size",
                  "moe_router_enable_expert_bias", "score_function", "router_dtype", "norm_head", "rotary_dim",
                  "multi_gate", "router_type"),
)

# Ling / Ring 2.0's modeling code, the release's own (inclusionAI/Ling-V2 af8837e models/modeling_bailing_moe_v2.py),
# against which SGLang 0.5.23's bailing_moe.py is compared key by key below.
_LING_V2_CODE = "the release's modeling_bailing_moe_v2.py"


def _bailing_moe_v2(v, arch) -> Stack:
    """Ling / Ring 2.0 (bailing_moe.py `_is_layer_sparse`): layer i MoE iff num_experts is set and i >=
    first_k_dense_replace; the NextN layer MoE (``is_nextn or ...``), one at most (load_weights asserts it).

    SGLang reads some keys the release's code never reads (it always scores by sigmoid over an expert bias with
    grouped top-k in float32, renormalises the top-k weights, sizes the shared expert moe_intermediate_size *
    num_shared_experts, rotates partial_rotary_factor of each head and has no query_key_value bias for use_bias):
    a config on which the two disagree is served as another model than the checkpoint's, so it is refused,
    naming the key. Its config class is the release's own code (SGLang loads it with --trust-remote-code): the
    facts are its keywords' defaults."""
    router = v.get("router_type")
    if v.get("multi_gate") or router == "MultiRouter":
        raise RuleError(f"{arch}: multi_gate / router_type={router!r}: bailing_moe.py then routes image and audio "
                        f"tokens through gates of their own (Ming's multimodal routers), not described; refusing")
    disagree = []
    if v.get("moe_router_enable_expert_bias") is not True:
        disagree.append("moe_router_enable_expert_bias must be true (without it SGLang drops the expert bias the "
                        "release's gate always adds, and scores by softmax)")
    if v.get("score_function") not in (None, "sigmoid"):
        disagree.append(f"score_function={v.get('score_function')!r} (the release always scores by sigmoid)")
    if v.get("norm_topk_prob") is not True:
        disagree.append(f"norm_topk_prob={v.get('norm_topk_prob')!r} (the release always renormalises the top-k "
                        f"weights, SGLang only when it is true)")
    if v.get("router_dtype") != "fp32":
        disagree.append(f"router_dtype={v.get('router_dtype')!r} (the release computes router logits in float32, "
                        f"SGLang only for 'fp32', else in the model's or bfloat16)")
    if v.get("use_bias"):
        disagree.append("use_bias=true (SGLang then adds a query_key_value bias the release does not have)")
    if v.get("norm_head"):
        disagree.append("norm_head=true (SGLang then normalises lm_head's rows at load, the release does not)")
    shared = v.get("moe_shared_expert_intermediate_size")
    if shared is not None and shared != v.get("moe_intermediate_size"):
        disagree.append(f"moe_shared_expert_intermediate_size={shared} (SGLang sizes the shared expert by it, times "
                        f"num_shared_experts; the release by moe_intermediate_size)")
    partial = v.get("partial_rotary_factor", (v.get("rope_parameters") or {}).get("partial_rotary_factor"))
    if partial is None and v.get("rotary_dim") not in (None, v.get("head_dim")):
        disagree.append(f"rotary_dim={v.get('rotary_dim')} without partial_rotary_factor (SGLang rotates "
                        f"rotary_dim, the release the whole head)")
    if disagree:
        raise RuleError(f"{arch}: SGLang 0.5.23's bailing_moe.py and {_LING_V2_CODE} (inclusionAI/Ling-V2) would "
                        f"compute different models: " + "; ".join(disagree) + "; refusing")
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    first_dense = _int(v, "first_k_dense_replace", arch)
    n_mtp = _mtp_count(v, arch, default=0)
    if n_mtp > 1:
        raise RuleError(f"{arch}: num_nextn_predict_layers={n_mtp}: bailing_moe.py loads one NextN layer "
                        f"(load_weights: 'Only 1 nextn layer is supported'); refusing")
    return _stack(L, lambda i: i >= first_dense, E, k, n_mtp, mtp_moe=True)


FAMILIES: Tuple[Family, ...] = (
    # Ling / Ring 2.0: model_type bailing_moe (shared with Ling 1.x's BailingMoeForCausalLM, another config class).
    Family("Ling / Ring 2.0 (Bailing-MoE V2)", {"BailingMoeV2ForCausalLM": "bailing_moe"},
           {"bailing_moe": _BAILING_MOE_V2}, _bailing_moe_v2, mtp=MTP_NEXTN),
)
