"""Load a GLM-4.5/4.7 MoE+MTP HF checkpoint into a megatron-core ``GPTModel`` with its MTP block.

R3 is only meaningful when the trainer holds the rollout engine's weights; this
module puts SGLang's checkpoint into Megatron so the two can be compared token
for token. megatron-bridge has such a mapping (models/glm/glm45_bridge.py) but
needs Python >= 3.12, so the facts are restated here for the one family we serve.

Config (HF ``Glm4MoeForCausalLM`` -> ``TransformerConfig``):

* routing: sigmoid scores, ``e_score_correction_bias`` as Megatron's ``expert_bias``
  (used for the choice only, as in HF), top-k weights renormalised (Megatron always
  renormalises sigmoid top-k, so ``norm_topk_prob: false`` is refused) and scaled by
  ``routed_scaling_factor``; router math in fp32.
* ``n_group > 1`` is refused: Megatron scores a group by the sum of its top
  ``topk / group_topk`` experts, HF by its top 2, so the chosen groups can differ.
* ``first_k_dense_replace`` dense layers, then MoE; shared expert of
  ``n_shared_experts * moe_intermediate_size``, no shared-expert gate.
* RMSNorm (``rms_norm_eps``), SwiGLU, QKV bias as ``attention_bias``, no other
  linear bias, qk-norm as ``use_qk_norm``, GQA, rope on the first
  ``partial_rotary_factor`` of each head (non-interleaved, SGLang's neox style).

Weights: Q/K/V are packed per query group ``[q heads of the group, k, v]``;
gate/up are stacked into ``linear_fc1``; the NextN layer at ``model.layers.{L+d}``
becomes ``mtp.layers.{d}`` (its ``embed_tokens`` and ``shared_head.head`` must equal
the main model's, since Megatron's MTP shares them). Every checkpoint tensor must
be used and every Megatron parameter filled, or loading fails listing which.

Tensor/expert/pipeline parallel loading is not implemented: a model built with
any of them is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from sglang_r3.trainer.errors import ModelMismatchError

ARCHITECTURES = ("Glm4MoeForCausalLM",)


class ConversionError(ModelMismatchError):
    """The checkpoint cannot be represented exactly by the Megatron model (or does not fit it)."""


@dataclass(frozen=True)
class GlmMoeConfig:
    """The fields of a GLM-4.5-family HF config that decide the Megatron model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    routed_scaling_factor: float
    num_nextn_predict_layers: int
    attention_bias: bool
    use_qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @property
    def moe_layer_pattern(self) -> List[int]:
        return [0] * self.first_k_dense_replace + [1] * (self.num_hidden_layers - self.first_k_dense_replace)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "GlmMoeConfig":
        arch = list(cfg.get("architectures") or [])
        if not any(a in ARCHITECTURES for a in arch):
            raise ConversionError(f"architectures {arch} are not a GLM MoE model ({list(ARCHITECTURES)})")
        problems = []
        if cfg.get("hidden_act", "silu") != "silu":
            problems.append(f"hidden_act {cfg.get('hidden_act')!r} (only silu/SwiGLU is mapped)")
        if not cfg.get("norm_topk_prob", True):
            problems.append("norm_topk_prob false (Megatron always renormalises sigmoid top-k weights)")
        if int(cfg.get("n_group", 1) or 1) != 1 or int(cfg.get("topk_group", 1) or 1) != 1:
            problems.append(
                f"n_group {cfg.get('n_group')} / topk_group {cfg.get('topk_group')} (Megatron scores groups "
                f"by their top topk/group_topk experts, HF by their top 2: group choices could differ)"
            )
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling")
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type")) or rope.get("rope_type", "default")
        if rope_type not in ("default", None):
            problems.append(f"rope scaling {rope_type!r} (only plain rope is mapped)")
        if problems:
            raise ConversionError("cannot convert this GLM config exactly: " + "; ".join(problems))
        partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        heads = int(cfg["num_attention_heads"])
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            moe_intermediate_size=int(cfg["moe_intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            first_k_dense_replace=int(cfg.get("first_k_dense_replace", 0)),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            partial_rotary_factor=float(partial),
            n_routed_experts=int(cfg["n_routed_experts"]),
            num_experts_per_tok=int(cfg["num_experts_per_tok"]),
            n_shared_experts=int(cfg.get("n_shared_experts", 0) or 0),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers", 0) or 0),
            attention_bias=bool(cfg.get("attention_bias", False)),
            use_qk_norm=bool(cfg.get("use_qk_norm", False)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )


def read_hf_config(model_path: str | Path) -> GlmMoeConfig:
    return GlmMoeConfig.from_hf(json.loads((Path(model_path) / "config.json").read_text()))


def transformer_config(glm: GlmMoeConfig, dtype: torch.dtype = torch.float32, **overrides: Any):
    """megatron-core TransformerConfig equal in function to the HF model. overrides: any config field
    that does not change the forward (recompute, aux loss, parallel sizes, ...)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    fields = dict(
        num_layers=glm.num_hidden_layers,
        hidden_size=glm.hidden_size,
        num_attention_heads=glm.num_attention_heads,
        num_query_groups=glm.num_key_value_heads,
        kv_channels=glm.head_dim,
        ffn_hidden_size=glm.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=glm.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=glm.attention_bias,
        qk_layernorm=glm.use_qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_moe_experts=glm.n_routed_experts,
        moe_ffn_hidden_size=glm.moe_intermediate_size,
        moe_router_topk=glm.num_experts_per_tok,
        moe_layer_freq=glm.moe_layer_pattern,
        moe_shared_expert_intermediate_size=(glm.n_shared_experts * glm.moe_intermediate_size) or None,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_topk_scaling_factor=glm.routed_scaling_factor,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
        moe_enable_routing_replay=True,
        mtp_num_layers=glm.num_nextn_predict_layers or None,
        mtp_loss_scaling_factor=0.1,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight comes from the checkpoint
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def build_gpt_model(glm: GlmMoeConfig, config: Any, vocab_size: Optional[int] = None):
    """An empty GPTModel (local, non-TE layers) of the GLM shape; megatron's parallel state must be up."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec

    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    mtp = get_gpt_mtp_block_spec(config, block, use_transformer_engine=False) if config.mtp_num_layers else None
    return GPTModel(
        config=config,
        transformer_layer_spec=block,
        vocab_size=vocab_size or glm.vocab_size,
        max_sequence_length=glm.max_position_embeddings,
        position_embedding_type="rope",
        rotary_percent=glm.partial_rotary_factor,
        rotary_base=int(glm.rope_theta) if float(glm.rope_theta).is_integer() else glm.rope_theta,
        share_embeddings_and_output_weights=glm.tie_word_embeddings,
        mtp_block_spec=mtp,
    )


# -- checkpoint -> Megatron names ----------------------------------------------


def read_safetensors(model_path: str | Path) -> Dict[str, torch.Tensor]:
    """Every tensor of a (possibly sharded) safetensors checkpoint, on CPU."""
    from safetensors.torch import load_file

    path = Path(model_path)
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out: Dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(path / f), device="cpu"))
    return out


def _qkv(glm: GlmMoeConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's linear_qkv packs per query group: [q heads of group g, k_g, v_g] for each g."""
    ng, hd = glm.num_key_value_heads, glm.head_dim
    per = glm.num_attention_heads // ng
    tail = q.shape[1:]
    q = q.reshape(ng, per * hd, *tail)
    k = k.reshape(ng, hd, *tail)
    v = v.reshape(ng, hd, *tail)
    return torch.cat([q, k, v], dim=1).reshape(ng * (per + 2) * hd, *tail)


def _layer_map(glm: GlmMoeConfig, hf: str, mg: str, moe: bool, w: Mapping[str, torch.Tensor], used: set) -> Dict[str, torch.Tensor]:
    """One HF decoder layer (prefix hf) as Megatron TransformerLayer tensors (prefix mg)."""

    def take(name: str) -> torch.Tensor:
        key = f"{hf}.{name}"
        if key not in w:
            raise ConversionError(f"checkpoint has no tensor {key!r}")
        used.add(key)
        return w[key]

    out = {
        f"{mg}.input_layernorm.weight": take("input_layernorm.weight"),
        f"{mg}.pre_mlp_layernorm.weight": take("post_attention_layernorm.weight"),
        f"{mg}.self_attention.linear_qkv.weight": _qkv(
            glm, take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"), take("self_attn.v_proj.weight")
        ),
        f"{mg}.self_attention.linear_proj.weight": take("self_attn.o_proj.weight"),
    }
    if glm.attention_bias:
        out[f"{mg}.self_attention.linear_qkv.bias"] = _qkv(
            glm, take("self_attn.q_proj.bias"), take("self_attn.k_proj.bias"), take("self_attn.v_proj.bias")
        )
    if glm.use_qk_norm:
        out[f"{mg}.self_attention.q_layernorm.weight"] = take("self_attn.q_norm.weight")
        out[f"{mg}.self_attention.k_layernorm.weight"] = take("self_attn.k_norm.weight")

    def mlp(src: str, dst: str) -> None:
        out[f"{dst}.linear_fc1.weight"] = torch.cat([take(f"{src}.gate_proj.weight"), take(f"{src}.up_proj.weight")])
        out[f"{dst}.linear_fc2.weight"] = take(f"{src}.down_proj.weight")

    if not moe:
        mlp("mlp", f"{mg}.mlp")
        return out
    out[f"{mg}.mlp.router.weight"] = take("mlp.gate.weight")
    out[f"{mg}.mlp.router.expert_bias"] = take("mlp.gate.e_score_correction_bias").float()
    for e in range(glm.n_routed_experts):
        mlp(f"mlp.experts.{e}", f"{mg}.mlp.experts.local_experts.{e}")
    if glm.n_shared_experts:
        mlp("mlp.shared_experts", f"{mg}.mlp.shared_experts")
    return out


def megatron_state_from_hf(glm: GlmMoeConfig, w: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Megatron GPTModel state (names as model.state_dict()) from HF tensors; refuses unused tensors."""
    used: set = set()

    def take(key: str) -> torch.Tensor:
        if key not in w:
            raise ConversionError(f"checkpoint has no tensor {key!r}")
        used.add(key)
        return w[key]

    L = glm.num_hidden_layers
    out: Dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": take("model.embed_tokens.weight"),
        "decoder.final_layernorm.weight": take("model.norm.weight"),
    }
    if not glm.tie_word_embeddings:
        out["output_layer.weight"] = take("lm_head.weight")
    pattern = glm.moe_layer_pattern
    for i in range(L):
        out.update(_layer_map(glm, f"model.layers.{i}", f"decoder.layers.{i}", bool(pattern[i]), w, used))
    for d in range(glm.num_nextn_predict_layers):
        hf, mg = f"model.layers.{L + d}", f"mtp.layers.{d}"
        out[f"{mg}.enorm.weight"] = take(f"{hf}.enorm.weight")
        out[f"{mg}.hnorm.weight"] = take(f"{hf}.hnorm.weight")
        out[f"{mg}.eh_proj.weight"] = take(f"{hf}.eh_proj.weight")
        out[f"{mg}.final_layernorm.weight"] = take(f"{hf}.shared_head.norm.weight")
        # Megatron's MTP layer embeds with the main embedding and predicts with the main output layer.
        for own, main in ((f"{hf}.embed_tokens.weight", "model.embed_tokens.weight"),
                          (f"{hf}.shared_head.head.weight", "lm_head.weight")):
            if own in w:
                if not torch.equal(take(own), w[main]):
                    raise ConversionError(
                        f"{own} differs from {main}; Megatron's MTP layer shares the main model's, so this "
                        f"checkpoint cannot be represented"
                    )
        out.update(_layer_map(glm, hf, f"{mg}.transformer_layer", True, w, used))
    unused = sorted(set(w) - used)
    if unused:
        more = f" (and {len(unused) - 8} more)" if len(unused) > 8 else ""
        raise ConversionError(f"checkpoint tensors with no place in the Megatron model: {unused[:8]}{more}")
    return out


def load_state_into(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Copy every tensor into the model's parameters/buffers; both sides must match name for name."""
    target = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    missing = sorted(set(target) - set(state))
    extra = sorted(set(state) - set(target))
    if missing or extra:
        raise ConversionError(
            f"Megatron model and converted checkpoint differ: model tensors not filled {missing[:8]}, "
            f"converted tensors the model lacks {extra[:8]}"
        )
    bad = [f"{k}: model {tuple(target[k].shape)} vs checkpoint {tuple(state[k].shape)}"
           for k in target if tuple(target[k].shape) != tuple(state[k].shape)]
    if bad:
        raise ConversionError("shape mismatch: " + "; ".join(bad[:8]))
    with torch.no_grad():
        for k, t in target.items():
            t.copy_(state[k].to(t.dtype))


def _refuse_parallel() -> None:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        raise ConversionError("megatron's parallel state is not initialised (initialize_model_parallel first)")
    sizes = {
        "tensor": ps.get_tensor_model_parallel_world_size(),
        "pipeline": ps.get_pipeline_model_parallel_world_size(),
        "expert": ps.get_expert_model_parallel_world_size(),
    }
    parallel = {k: v for k, v in sizes.items() if v != 1}
    if parallel:
        raise ConversionError(f"converter loads unsharded weights only; model-parallel sizes {parallel} are not 1")


def load_glm_megatron(
    model_path: str | Path, dtype: torch.dtype = torch.float32, **config_overrides: Any
) -> Tuple[Any, GlmMoeConfig]:
    """(GPTModel holding the checkpoint's weights, parsed config). Unsharded (TP = PP = EP = 1)."""
    _refuse_parallel()
    glm = read_hf_config(model_path)
    config = transformer_config(glm, dtype=dtype, **config_overrides)
    model = build_gpt_model(glm, config)
    load_state_into(model, megatron_state_from_hf(glm, read_safetensors(model_path)))
    return model, glm


__all__ = [
    "ConversionError",
    "GlmMoeConfig",
    "build_gpt_model",
    "load_glm_megatron",
    "load_state_into",
    "megatron_state_from_hf",
    "read_hf_config",
    "read_safetensors",
    "transformer_config",
]
