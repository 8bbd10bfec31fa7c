"""Llama 4 (llama4.py through mllama4.py) and the text-only checkpoint it refuses: what their config classes say, the
layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from sglang_r3.core.families._base import RuleError, Facts, Stack, Family, _kv_heads_default_to_heads, _int, _stack
from sglang_r3.core.families.keys import Keys, _SILU, _SHAPES


def _llama4_text_fields(d: Dict[str, Any]) -> None:
    # configuration_llama4.py Llama4TextConfig.__post_init__, in its order.
    _kv_heads_default_to_heads(d)
    L = d.get("num_hidden_layers")
    if L is None:
        return
    L = int(L)
    if not d.get("no_rope_layers"):
        interval = int(d.get("no_rope_layer_interval", 4))
        d["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(L)]
    if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
        d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])
    step = int(d.get("interleave_moe_layer_step", 1))
    if d.get("moe_layers") is None and step:  # transformers: range(step - 1, L, step); step 0 it cannot build
        d["moe_layers"] = list(range(step - 1, L, step))
    if d.get("layer_types") is None:
        d["layer_types"] = ["chunked_attention" if no_rope else "full_attention" for no_rope in d["no_rope_layers"]]


_LLAMA4_TEXT = Facts(
    aliases={},
    defaults={"attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1,
              "attn_temperature_tuning": True, "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu",
              "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "max_position_embeddings": 131072, "no_rope_layer_interval": 4,
              "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
              "num_local_experts": 16, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
              "use_qk_norm": True, "vocab_size": 202048},
    derive=(_llama4_text_fields,),
    # which layers are MoE (SGLang: interleave_moe_layer_step; transformers: moe_layers), the dense MLP width,
    # NoPE layers and chunked attention, attention temperature tuning (llama4.py reads them all).
    routing_keys=("interleave_moe_layer_step", "moe_layers", "intermediate_size_mlp", "no_rope_layers",
                  "no_rope_layer_interval", "attention_chunk_size", "attn_temperature_tuning", "floor_scale",
                  "attn_scale"),
)


def _llama4(v, arch) -> Stack:
    """Llama 4 text (llama4.py `_is_moe_layer`): MoE iff (layer + 1) % interleave_moe_layer_step == 0 (every
    layer when the step is 0), num_local_experts experts, top num_experts_per_tok (top-1, sigmoid after the
    top-k: ids are plain experts). transformers builds from moe_layers (default: the same interleave); a
    config whose moe_layers disagree is refused. No MTP."""
    L = _int(v, "num_hidden_layers", arch)
    E = _int(v, "num_local_experts", arch)
    k = _int(v, "num_experts_per_tok", arch)
    step = _int(v, "interleave_moe_layer_step", arch, default=1)
    stack = _stack(L, (lambda i: E > 0) if step == 0 else (lambda i: (i + 1) % step == 0), E, k)
    given = v.get("moe_layers")
    if given is not None and sorted(int(i) for i in given) != list(stack.moe):
        raise RuleError(
            f"{arch}: moe_layers={list(given)} (what transformers builds its MoE layers from) disagree with "
            f"interleave_moe_layer_step={step} (what SGLang 0.5.23 builds them from: MoE layers {list(stack.moe)}); "
            f"refusing a layout one of them would not serve"
        )
    # SGLang's llama4.py: RoPE (and chunked attention) on every layer but each fourth, whatever the config says;
    # transformers' no_rope_layers (from no_rope_layer_interval) and layer_types decide it there.
    rope = [int((i + 1) % 4 != 0) for i in range(L)]
    if v.get("no_rope_layers") is not None and [int(x) for x in v.get("no_rope_layers")] != rope:
        raise RuleError(
            f"{arch}: no_rope_layers={list(v.get('no_rope_layers'))} (no_rope_layer_interval="
            f"{v.get('no_rope_layer_interval')!r}): SGLang 0.5.23 (llama4.py) builds RoPE on every layer but each "
            f"fourth whatever it says, transformers' Llama4 from it; refusing")
    types = ["chunked_attention" if r else "full_attention" for r in rope]
    if v.get("layer_types") is not None and list(v.get("layer_types")) != types:
        raise RuleError(
            f"{arch}: layer_types={list(v.get('layer_types'))}: SGLang 0.5.23 (llama4.py) chunks the attention of "
            f"its RoPE layers ({types}) whatever it says, transformers' Llama4 follows it; refusing")
    return stack


_LLAMA4_TEXT_ONLY_REFUSAL = (
    "SGLang 0.5.23 serves it with llama4.py, which loads q_proj / k_proj as the checkpoint holds them (llama.py "
    "load_weights) and rotates half-split (neox) pairs, while transformers' Llama 4 rotates interleaved pairs: "
    "SGLang's Llama4ForConditionalGeneration converts the weights at load (mllama4.py "
    "permute_qk_weight_for_rotary), its Llama4ForCausalLM does not, so a transformers checkpoint is served as another "
    "model and routes otherwise (tests/test_families.py); serve the Llama4ForConditionalGeneration checkpoint"
)

FAMILIES: Tuple[Family, ...] = (
    Family("Llama 4", {"Llama4ForConditionalGeneration": "llama4"},
           {"llama4_text": _LLAMA4_TEXT}, _llama4, text_model_types={"llama4": "llama4_text"}),
    Family("Llama 4 text-only", {"Llama4ForCausalLM": "llama4_text"}, refusal=_LLAMA4_TEXT_ONLY_REFUSAL),
)

KEYS: Dict[str, Keys] = {
    "Llama 4": Keys(proven=_SHAPES + (
        "attention_chunk_size", "head_dim", "intermediate_size_mlp", "use_qk_norm", "rms_norm_eps", "rope_parameters",
        "attn_scale", "attn_temperature_tuning", "floor_scale"),
        neutral={**_SILU, "attention_bias": ((False,), "SGLang's llama4.py builds its attention without biases"),
                 "tie_word_embeddings": ((False,), "a tied Llama 4 head is not proven by a served forward (published "
                                                   "untied)")},
        via={**{k: f"SGLang's only: set by SGLang's CPU path itself from {src} (model_config.py "
                    f"adjust_config_with_unaligned_cpu_tp, over any value the file gives) and read by its q/k weight "
                    f"permutation there"
                 for k, src in (("original_num_attention_heads", "num_attention_heads"),
                                ("original_total_num_kv_heads", "num_key_value_heads"))}},
        irrelevant={"original_intermediate_size": "SGLang's only: mllama4.py reads the vision config's (its pixel "
                                                  "shuffle MLP), never the text config's",
                    "image_token_id": "the outer model's image placeholder id (Llama4ForConditionalGeneration's "
                                      "get_placeholder_mask): text prompts never hold it; Llama 4's image prompts are "
                                      "not among those served against transformers"}),
}
