"""A tiny Step-3.5 (``Step3p5ForCausalLM`` + 3 ``Step3p5MTP`` layers) for multi-layer MTP tests.

There is no transformers class for Step-3.5. The main model is a safetensors checkpoint of seeded
random weights in the names SGLang's ``Step3p5ForCausalLM.load_weights`` reads (which asserts that
every parameter was loaded), scaled so routers choose with wide margins and differently per layer.
The three MTP layers come from SGLang's ``--speculative-draft-load-format dummy``: SGLang 0.5.23
loads only one nextn layer from a Step-3.5 checkpoint (``load_weights(is_nextn=True)`` raises for
more), and ``initialize_dummy_weights`` seeds every parameter with 1234 by shape and dtype, so every
server holds the same MTP weights too. (Dummy weights for the main model would not do as an oracle:
every MoE layer gets the same router weights, and the rows of all 43 routed the same few expert pairs.)

SGLang 0.5.23 constraints the config follows: ``step3p5_mtp.py`` builds every MTP block as layer 45
(``layer_id = 45  # FIXME``), so there are 45 decoder layers and the per-layer lists (``layer_types``,
``rope_theta``, ``partial_rotary_factors``, ``swiglu_limits*``) have 45 + 3 entries (transformers 5's
``validate_layer_type`` accepts exactly ``num_hidden_layers + num_nextn_predict_layers``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

NUM_LAYERS = 45
NUM_MTP = 3
DENSE_LAYERS = (0, 2)  # every other decoder layer, and all three MTP layers (built as layer 45), MoE
NUM_EXPERTS = 8
TOPK = 2

# --disable-hybrid-swa-memory: SGLang 0.5.23's torch_native backend reads a sliding-window layer's KV from
# the smaller SWA pool by full-pool slot ids (IndexError once ids pass its size); one full pool avoids it
# (the window itself is still applied by the attention masks).
SERVE_FLAGS = ["--speculative-draft-load-format", "dummy", "--dtype", "float32", "--max-total-tokens", "4096",
               "--mem-fraction-static", "0.99", "--disable-hybrid-swa-memory"]
# SGLang turns multi-layer EAGLE on by itself for Step3p5ForCausalLM: one draft step per MTP layer.
SPEC_FLAGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(NUM_MTP),
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(NUM_MTP + 1)]


def config() -> dict:
    n = NUM_LAYERS + NUM_MTP
    return {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_attention_groups": 2,
        "num_hidden_layers": NUM_LAYERS,
        "vocab_size": 288,
        "rms_norm_eps": 1e-05,
        "moe_intermediate_size": 32,
        "moe_num_experts": NUM_EXPERTS,
        "moe_top_k": TOPK,
        "rope_theta": [10000.0] * n,
        "rope_scaling": None,
        "max_position_embeddings": 512,
        "max_seq_len": 512,
        "share_expert_dims": 32,
        "head_dim": 16,
        "norm_expert_weight": True,
        "layer_types": ["sliding_attention" if i % 4 == 1 else "full_attention" for i in range(n)],
        "sliding_window": 64,
        "moe_layers_enum": ",".join(str(i) for i in range(n) if i not in DENSE_LAYERS),
        "num_nextn_predict_layers": NUM_MTP,
        "swiglu_limits": [0] * n,
        "swiglu_limits_shared": [0] * n,
        "partial_rotary_factors": [1.0] * n,
        "attention_other_setting": {"num_attention_heads": 4, "num_attention_groups": 2},
        "need_fp32_gate": True,
        "moe_router_scaling_factor": 1.0,
        "use_moe_router_bias": True,
        "use_head_wise_attn_gate": True,
        "torch_dtype": "float32",
        "eos_token_id": 256,
        "bos_token_id": 256,
    }


def weights(seed: int = 0) -> Dict[str, Any]:
    """The main model's checkpoint tensors (float32), seeded. Router logits are O(1) and differ per
    layer, so top-2 choices change from token to token and layer to layer, with margins far above
    float32 rounding (a verify and a decode forward of a token must choose the same experts)."""
    import torch

    c = config()
    g = torch.Generator().manual_seed(seed)
    H, V, E, hd = c["hidden_size"], c["vocab_size"], c["moe_num_experts"], c["head_dim"]
    heads, kv = c["num_attention_heads"], c["num_attention_groups"]

    def rnd(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    w = H ** -0.5
    out = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": rnd(H, std=0.1),
           "lm_head.weight": rnd(V, H, std=w)}
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": rnd(H, std=0.1),
            p + "post_attention_layernorm.weight": rnd(H, std=0.1),
            p + "self_attn.q_proj.weight": rnd(heads * hd, H, std=w),
            p + "self_attn.k_proj.weight": rnd(kv * hd, H, std=w),
            p + "self_attn.v_proj.weight": rnd(kv * hd, H, std=w),
            p + "self_attn.o_proj.weight": rnd(H, heads * hd, std=(heads * hd) ** -0.5),
            p + "self_attn.q_norm.weight": rnd(hd, std=0.1),
            p + "self_attn.k_norm.weight": rnd(hd, std=0.1),
            p + "self_attn.g_proj.weight": rnd(heads, H, std=w),
        })
        if i in DENSE_LAYERS:
            inter = c["intermediate_size"]
            out.update({p + "mlp.gate_proj.weight": rnd(inter, H, std=w), p + "mlp.up_proj.weight": rnd(inter, H, std=w),
                        p + "mlp.down_proj.weight": rnd(H, inter, std=inter ** -0.5)})
            continue
        inter, shared = c["moe_intermediate_size"], c["share_expert_dims"]
        out.update({
            p + "moe.gate.weight": rnd(E, H, std=3 * w),  # logits O(3): wide margins between experts
            p + "moe.router_bias": rnd(E, std=0.1),
            p + "moe.gate_proj.weight": rnd(E, inter, H, std=w),
            p + "moe.up_proj.weight": rnd(E, inter, H, std=w),
            p + "moe.down_proj.weight": rnd(E, H, inter, std=inter ** -0.5),
            p + "share_expert.gate_proj.weight": rnd(shared, H, std=w),
            p + "share_expert.up_proj.weight": rnd(shared, H, std=w),
            p + "share_expert.down_proj.weight": rnd(H, shared, std=shared ** -0.5),
        })
    return out


def build(out: Path) -> Path:
    """Write the config, the main model's seeded checkpoint and the embedded model's byte-level
    tokenizer (id == byte) into ``out``."""
    from safetensors.torch import save_file

    from sglang_r3.dev.embedded.tokenizer import write_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(), indent=1))
    save_file({k: v.contiguous() for k, v in weights().items()}, str(out / "model.safetensors"))
    write_tokenizer(out)
    return out


def server_flags(model_dir: Path, spec: bool) -> List[str]:
    return ["--model-path", str(model_dir), *SERVE_FLAGS, *(SPEC_FLAGS if spec else [])]
