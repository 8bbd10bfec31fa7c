"""Gemma-4 (gemma4_causal.py through gemma4_mm.py) and the text-only checkpoint it refuses: what their config classes
say, the layout rule, the registry entries and their key accounting."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from sglang_r3.core.families._base import ConfigError, Facts, Stack, Family, _int, _stack
from sglang_r3.core.families.keys import Keys, _SHAPES, _pending


def _gemma4_text_fields(d: Dict[str, Any]) -> None:
    # configuration_gemma4.py Gemma4TextConfig.__post_init__ (layer types 5 sliding : 1 full, the last forced full;
    # per-type RoPE; full-attention layers' head_dim / kv heads as a per_layer_config, from global_head_dim and, with
    # attention_k_eq_v, num_global_key_value_heads), then SGLang's get_config flattening it
    # (hf_transformers/config.py _apply_gemma4_attention_overrides: head_dim and kv heads are the full-attention
    # layers', swa_* the sliding ones'; any other per-layer key, or two shapes within one layer type, it refuses).
    L = d.get("num_hidden_layers")
    if d.get("layer_types") is None and L is not None:
        d["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(int(L))]
    types = list(d.get("layer_types") or [])
    if types and types[-1] != "full_attention":
        types[-1] = "full_attention"
        d["layer_types"] = types
    if d.get("rope_parameters") is None:
        d["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}}
    global_head_dim = d.pop("global_head_dim", None) or 512
    global_kv_heads = d.pop("num_global_key_value_heads", None)
    per_layer = d.pop("per_layer_config", None)
    if d.get("swa_head_dim") is not None:  # SGLang's config object: flattened already
        return
    if per_layer is None:
        overrides = {"head_dim": global_head_dim}
        if d.get("attention_k_eq_v") and global_kv_heads is not None:
            overrides["num_key_value_heads"] = global_kv_heads
        per_layer = {i: overrides for i, t in enumerate(types) if t == "full_attention"}
    per_layer = {int(i): dict(o) for i, o in per_layer.items()}
    extra = sorted({k for o in per_layer.values() for k in o} - {"head_dim", "num_key_value_heads"})
    if extra:
        raise ConfigError(f"Gemma-4 config declares per-layer {extra}, which SGLang 0.5.23 refuses (it flattens "
                          "only head_dim and num_key_value_heads)")
    shapes: Dict[str, set] = {}
    for i, t in enumerate(types):
        o = per_layer.get(i, {})
        shapes.setdefault(t, set()).add((o.get("head_dim", d.get("head_dim")),
                                         o.get("num_key_value_heads", d.get("num_key_value_heads"))))
    for t, got in shapes.items():
        if len(got) > 1:
            raise ConfigError(f"Gemma-4 config gives its {t!r} layers more than one (head_dim, num_key_value_heads): "
                              f"{sorted(got, key=str)}, which SGLang 0.5.23 refuses")
    if "full_attention" in shapes:
        full = next(iter(shapes["full_attention"]))
        swa = next(iter(shapes.get("sliding_attention", shapes["full_attention"])))
        d["head_dim"], d["num_key_value_heads"] = full
        d["swa_head_dim"], d["swa_num_key_value_heads"] = swa
        d["swa_v_head_dim"] = swa[0]
        if d.get("v_head_dim") is None:
            d["v_head_dim"] = full[0]


# Gemma-4's text model (transformers' Gemma4TextConfig, which SGLang builds for gemma4 / gemma4_text): the MoE block
# is switched on for every layer by one flag, and its router is spelled num_experts / top_k_experts.
_GEMMA4_TEXT = Facts(
    aliases={},
    defaults={"attention_bias": False, "attention_k_eq_v": False, "enable_moe_block": False, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "hidden_size_per_layer_input": 256,
              "intermediate_size": 9216, "max_position_embeddings": 131072, "num_attention_heads": 8,
              "num_hidden_layers": 30, "num_key_value_heads": 4, "num_kv_shared_layers": 0, "rms_norm_eps": 1e-06,
              "rope_theta": 10000.0, "sliding_window": 512, "tie_word_embeddings": True, "use_double_wide_mlp": False,
              "vocab_size": 262144},
    derive=(_gemma4_text_fields,),
    routing_keys=("hidden_activation", "enable_moe_block", "top_k_experts", "global_head_dim", "num_global_key_value_heads",
                  "swa_head_dim", "swa_v_head_dim", "swa_num_key_value_heads",
                  "attention_k_eq_v", "num_kv_shared_layers", "hidden_size_per_layer_input", "use_double_wide_mlp",
                  "final_logit_softcapping"),
)


def _gemma4(v, arch) -> Stack:
    """Gemma-4 (gemma4_causal.py ``Gemma4DecoderLayer``): with ``enable_moe_block`` every decoder layer runs a
    router (``Gemma4Router``: norm, scale, projection; softmax top-k in ``Gemma4MoE``'s routing function) and
    experts beside its dense MLP; without it none does (the dense Gemma-4 31B). No MTP layers: Gemma-4's drafter
    is a separate assistant checkpoint."""
    L = _int(v, "num_hidden_layers", arch)
    if not v.get("enable_moe_block"):
        return _stack(L, lambda i: False, 0, 0)
    return _stack(L, lambda i: True, _int(v, "num_experts", arch), _int(v, "top_k_experts", arch))


_GEMMA4_TEXT_ONLY_REFUSAL = (
    "a text-only Gemma-4 checkpoint (Gemma4ForCausalLM, model_type gemma4_text) is not read by SGLang 0.5.23: its "
    "get_config copies text_config keys the config lacks with hasattr(config, key), and transformers' Gemma4TextConfig "
    "raises AmbiguousGlobalPerLayerAttributeError for per-layer keys (head_dim, num_key_value_heads) instead of "
    "AttributeError; serve the checkpoint as published (Gemma4ForConditionalGeneration)"
)

FAMILIES: Tuple[Family, ...] = (
    # Gemma-4 as published (26B-A4B: MoE; 31B: dense): gemma4_mm.py builds gemma4_causal.py's text model from
    # text_config.
    Family("Gemma-4 (text)", {"Gemma4ForConditionalGeneration": "gemma4"}, {"gemma4_text": _GEMMA4_TEXT}, _gemma4,
           text_model_types={"gemma4": "gemma4_text"}),
    Family("Gemma-4 text-only", {"Gemma4ForCausalLM": ""}, refusal=_GEMMA4_TEXT_ONLY_REFUSAL),
)

KEYS: Dict[str, Keys] = {
    "Gemma-4 (text)": Keys(proven=_SHAPES + (
        "attention_k_eq_v", "final_logit_softcapping", "head_dim", "hidden_size_per_layer_input", "layer_types",
        "num_kv_shared_layers", "sliding_window", "use_bidirectional_attention", "rms_norm_eps", "attention_bias",
        "rope_parameters", "use_double_wide_mlp", "vocab_size_per_layer_input"),
        neutral={"tie_word_embeddings": ((True,), "the text config's: transformers' Gemma-4 ties its head by the outer "
                                                  "config's key; only the published value (tied) is proven"),
                 "hidden_activation": (("gelu_pytorch_tanh",), "SGLang's Gemma-4 MLPs and experts are tanh-GELU "
                                                               "whatever it says")},
        pending={"per_layer_config": "SGLang's get_config flattens it into each layer type's head_dim and KV heads "
                                     "and refuses any other per-layer key (so does start-up here); a per-layer "
                                     "shape apart from the class's derivation is not served yet",
                 **_pending("global_head_dim", "num_global_key_value_heads",
                            why="(transformers 5.12.1) equal to the sliding layers' in the served checkpoint; the "
                                "published split is refused on the CPU runtime (its one KV pool holds one shape)")}),
}
