"""The embedded default model, built once from a fixed seed into the cache: a GLM-4.5-shaped MoE (layer 0
dense, 1..3 MoE with 16 experts top-4 and a shared expert, one NextN MTP layer), float32 so speculative and
plain runs agree exactly. Its weights are constructed, not random, so that routing depends on context and
MTP drafts are accepted (``lm_head`` maps a token to a fixed successor; ``eh_proj`` passes the next token).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict

import torch

from sglang_r3.dev.embedded.tokenizer import EOS_TOKEN_ID, NUM_BYTE_TOKENS, SPECIAL_TOKENS, write_tokenizer
from sglang_r3.core.paths import cache_root

SEED = 20260301
BUILD_VERSION = 2  # bump when the construction below changes

EMBEDDED_CONFIG: Dict = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.5,
    "hidden_act": "silu",
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 1,
    "attention_bias": True,
    "use_qk_norm": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
    "bos_token_id": EOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": EOS_TOKEN_ID,
}

# Relative size of each block's write into the residual stream. Small enough
# that the next-token prediction is always succ(current token), large enough
# that routing depends on context.
_ATTN_SCALE = 0.25
_FFN_SCALE = 0.25


def successor_table(seed: int = SEED) -> torch.Tensor:
    """succ[x] for every vocab id: a permutation of the byte tokens; specials map into bytes."""
    g = torch.Generator().manual_seed(seed + 1)
    vocab = EMBEDDED_CONFIG["vocab_size"]
    succ = torch.empty(vocab, dtype=torch.long)
    succ[:NUM_BYTE_TOKENS] = torch.randperm(NUM_BYTE_TOKENS, generator=g)
    succ[NUM_BYTE_TOKENS:] = torch.randint(0, NUM_BYTE_TOKENS, (vocab - NUM_BYTE_TOKENS,), generator=g)
    return succ


def _weights(cfg: Dict, seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I, Im = cfg["n_routed_experts"], cfg["intermediate_size"], cfg["moe_intermediate_size"]
    L = cfg["num_hidden_layers"]

    def rnd(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    w: Dict[str, torch.Tensor] = {}
    embed = rnd(V, H)
    w["model.embed_tokens.weight"] = embed
    succ = successor_table(seed)
    # Row succ[x] of lm_head is the direction of E[x]: the argmax of
    # <lm_head, norm(E[x] + small)> is succ[x]. Bytes only, so specials never win.
    # The scale leaves succ[x] about half the probability mass at temperature 1:
    # greedy decoding is deterministic with a wide margin, while sampling often
    # departs from the greedy draft, so drafts get rejected too.
    head = torch.full((V, H), 0.0)
    unit = embed / embed.norm(dim=-1, keepdim=True)
    head[succ[:NUM_BYTE_TOKENS]] = unit[:NUM_BYTE_TOKENS] * 0.75
    w["lm_head.weight"] = head
    w["model.norm.weight"] = torch.ones(H)

    def attention(prefix: str) -> None:
        w[f"{prefix}.input_layernorm.weight"] = torch.ones(H)
        w[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(H)
        w[f"{prefix}.self_attn.q_proj.weight"] = rnd(nh * hd, H, std=H**-0.5)
        w[f"{prefix}.self_attn.q_proj.bias"] = rnd(nh * hd, std=0.1)
        w[f"{prefix}.self_attn.k_proj.weight"] = rnd(nkv * hd, H, std=H**-0.5)
        w[f"{prefix}.self_attn.k_proj.bias"] = rnd(nkv * hd, std=0.1)
        w[f"{prefix}.self_attn.v_proj.weight"] = rnd(nkv * hd, H, std=H**-0.5)
        w[f"{prefix}.self_attn.v_proj.bias"] = rnd(nkv * hd, std=0.1)
        w[f"{prefix}.self_attn.o_proj.weight"] = rnd(H, nh * hd, std=_ATTN_SCALE * (nh * hd) ** -0.5)

    def mlp(prefix: str, inter: int, scale: float) -> None:
        w[f"{prefix}.gate_proj.weight"] = rnd(inter, H, std=H**-0.5)
        w[f"{prefix}.up_proj.weight"] = rnd(inter, H, std=H**-0.5)
        w[f"{prefix}.down_proj.weight"] = rnd(H, inter, std=scale * inter**-0.5)

    def moe(prefix: str) -> None:
        # Router logits of std ~2 keep sigmoid scores spread out, so top-k
        # choices are far from ties and identical across batch shapes.
        w[f"{prefix}.mlp.gate.weight"] = rnd(E, H, std=2.0 * H**-0.5)
        w[f"{prefix}.mlp.gate.e_score_correction_bias"] = torch.zeros(E)
        for e in range(E):
            mlp(f"{prefix}.mlp.experts.{e}", Im, _FFN_SCALE)
        mlp(f"{prefix}.mlp.shared_experts", Im, _FFN_SCALE)

    for i in range(L):
        prefix = f"model.layers.{i}"
        attention(prefix)
        if i < cfg["first_k_dense_replace"]:
            mlp(f"{prefix}.mlp", I, _FFN_SCALE)
        else:
            moe(prefix)

    # The NextN/MTP layer lives at model.layers.{L} in GLM/DeepSeek checkpoints.
    for d in range(cfg["num_nextn_predict_layers"]):
        prefix = f"model.layers.{L + d}"
        w[f"{prefix}.enorm.weight"] = torch.ones(H)
        w[f"{prefix}.hnorm.weight"] = torch.ones(H)
        eh = torch.zeros(H, 2 * H)
        eh[:, :H] = torch.eye(H)  # keep the next token's embedding, drop the target hidden state
        eh[:, H:] = rnd(H, H, std=0.02 * H**-0.5)  # a trace of it, so the hidden input is used
        w[f"{prefix}.eh_proj.weight"] = eh
        w[f"{prefix}.shared_head.norm.weight"] = torch.ones(H)
        w[f"{prefix}.shared_head.head.weight"] = head.clone()
        w[f"{prefix}.embed_tokens.weight"] = embed.clone()
        attention(prefix)
        moe(prefix)
    return {k: v.contiguous().float() for k, v in w.items()}


def _fingerprint() -> str:
    blob = json.dumps({"cfg": EMBEDDED_CONFIG, "seed": SEED, "v": BUILD_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_embedded_model() -> Path:
    """Return the folder of the embedded model, building it on first use."""
    from safetensors.torch import save_file

    out = cache_root() / "models" / f"glm4moe-mtp-tiny-{_fingerprint()}"
    if (out / "model.safetensors").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    try:
        (tmp / "config.json").write_text(json.dumps(EMBEDDED_CONFIG, indent=2))
        (tmp / "generation_config.json").write_text(
            json.dumps({"eos_token_id": EOS_TOKEN_ID, "do_sample": False}, indent=2)
        )
        write_tokenizer(tmp)
        save_file(_weights(EMBEDDED_CONFIG, SEED), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        try:
            os.replace(tmp, out)  # atomic publish; a concurrent builder may have won
        except OSError:
            if not (out / "model.safetensors").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


__all__ = ["EMBEDDED_CONFIG", "SPECIAL_TOKENS", "ensure_embedded_model", "successor_table"]


def default_speculative_flags():
    """SGLang flags that turn on MTP (NextN) speculation for the embedded model."""
    return [
        "--speculative-algorithm", "EAGLE",
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    ]
