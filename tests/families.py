"""Tiny MoE checkpoints of each family, built and saved by transformers' own classes, and their
routers' top-k as transformers computes it (the oracle for tests/test_families.py).

Each checkpoint is what a trainer exporting with transformers 5 writes: ``<Family>ForCausalLM(config)``
with random weights (fixed seed), ``save_pretrained`` (config.json in the class's own spelling,
safetensors), plus the embedded byte-level tokenizer so text prompts work offline.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from sglang_r3.embedded.tokenizer import NUM_BYTE_TOKENS, write_tokenizer
from sglang_r3.paths import cache_root

VOCAB = 288  # >= the tokenizer's 260 ids
_TINY = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, tie_word_embeddings=False)


@dataclass(frozen=True)
class Family:
    name: str
    config_class: str  # transformers class names
    model_class: str
    config: Dict[str, Any]
    # Per decoder layer: is layer i's MLP a router + experts in transformers' module tree?
    is_moe_module: Callable[[Any], bool] = field(default=lambda mlp: hasattr(mlp, "gate") and hasattr(mlp, "experts"))
    seed: int = 0
    # Scale of the router weights: large enough that top-k gaps dwarf fp32 rounding differences
    # between two implementations (a tie broken differently is not a routing difference).
    router_std: float = 1.0
    # NextN MTP layers appended to the checkpoint as DeepSeek publishes them (model.layers.{L}.*);
    # transformers builds none (it skips those tensors when loading).
    mtp_layers: int = 0


FAMILIES: Dict[str, Family] = {
    # GLM-4.5: layer 0 dense (first_k_dense_replace), sigmoid scores with a correction bias, shared expert.
    "glm4_moe": Family(
        "glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
             num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, n_group=1, topk_group=1,
             norm_topk_prob=True, routed_scaling_factor=1.0, num_nextn_predict_layers=0, head_dim=16,
             partial_rotary_factor=0.5),
    ),
    # Qwen3-MoE: softmax top-k, every layer MoE; save_pretrained writes num_local_experts.
    "qwen3_moe": Family(
        "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, head_dim=16, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "mixtral": Family(
        "mixtral", "MixtralConfig", "MixtralForCausalLM",
        dict(_TINY, intermediate_size=64, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    # DeepSeek-V3: MLA attention (q/kv LoRA, decoupled RoPE, YaRN as published), layer 0 dense, sigmoid
    # scores with grouped top-k (noaux_tc: 4 groups, best 2), one NextN MTP layer. moe_layer_freq,
    # topk_method and scoring_func are keys of the published config.json that transformers' class
    # does not define (it keeps them) and SGLang's deepseek_v2.py reads.
    "deepseek_v3": Family(
        "deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
             n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
             n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, num_nextn_predict_layers=1,
             moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid",
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
        mtp_layers=1,
    ),
    # GLM-4.7-Flash: MLA (YaRN, as the CPU runtime needs), layer 0 dense (first_k_dense_replace, a published key
    # transformers' Glm4MoeLiteConfig keeps; its mlp_layer_types default agrees), sigmoid top-k with a correction
    # bias, one NextN MTP layer.
    "glm4_moe_lite": Family(
        "glm4_moe_lite", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
             n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
             n_shared_experts=1, routed_scaling_factor=1.8, norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, num_nextn_predict_layers=1,
             topk_method="noaux_tc",
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
        router_std=0.4,  # sigmoid scores off saturation: choices move from token to token
        mtp_layers=1,
    ),
    "olmoe": Family(
        "olmoe", "OlmoeConfig", "OlmoeForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
             norm_topk_prob=False),
    ),
}


def build(family: Family, out: Optional[Path] = None) -> Path:
    """The checkpoint folder (built once per family definition, cached like the embedded model)."""
    import torch
    import transformers

    key = hashlib.sha256(
        json.dumps([family.name, family.config_class, family.config, family.seed, family.router_std,
                    transformers.__version__], sort_keys=True).encode()
    ).hexdigest()[:12]
    out = out or cache_root() / "families" / f"{family.name}-{key}"
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config_class = getattr(transformers, family.config_class)
    special = dict(eos_token_id=NUM_BYTE_TOKENS, pad_token_id=NUM_BYTE_TOKENS, bos_token_id=None)
    L = family.config["num_hidden_layers"]
    # With MTP: a model one layer deeper, whose last decoder layer becomes the MTP block's layer.
    cfg = config_class(**{**family.config, "num_hidden_layers": L + family.mtp_layers}, **special)
    torch.manual_seed(family.seed)
    model = getattr(transformers, family.model_class)(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gate.weight") or name.endswith("router.weight"):
                p.normal_(0.0, family.router_std)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # sigmoid routers' selection bias (GLM, DeepSeek-V3)
                b.normal_(0.0, 0.1)
    model.save_pretrained(str(tmp))
    if family.mtp_layers:
        _keep_last_layers_as_mtp(tmp, config_class(**family.config, **special), family)
    write_tokenizer(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _keep_last_layers_as_mtp(folder: Path, main_config, family: Family) -> None:
    """Turn the saved (L + K)-layer checkpoint into an L-layer one with K NextN layers: transformers
    re-saves the first L layers under the L-layer config (num_nextn_predict_layers = K), and the
    layer tensors L.. stay, joined by the NextN-only ones (enorm, hnorm, eh_proj, shared_head)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    L, H = main_config.num_hidden_layers, main_config.hidden_size
    main = getattr(transformers, family.model_class).from_pretrained(str(folder), config=main_config,
                                                                     dtype=torch.float32)
    for p in folder.glob("*.safetensors"):
        p.unlink()
    main.save_pretrained(str(folder))
    (shard,) = folder.glob("*.safetensors")
    out = load_file(str(shard))
    gen = torch.Generator().manual_seed(family.seed + 1)
    for d in range(family.mtp_layers):
        prefix = f"model.layers.{L + d}."
        out.update({k: v for k, v in tensors.items() if k.startswith(prefix)})
        out[prefix + "enorm.weight"] = torch.ones(H)
        out[prefix + "hnorm.weight"] = torch.ones(H)
        out[prefix + "eh_proj.weight"] = torch.randn(H, 2 * H, generator=gen) * (2 * H) ** -0.5
        out[prefix + "shared_head.norm.weight"] = torch.ones(H)
        out[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
        out[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file({k: v.contiguous() for k, v in out.items()}, str(shard), metadata={"format": "pt"})


def load_transformers(path: Path):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def decoder_layers(model) -> List[Any]:
    return list(model.model.layers)


def dense_or_moe(model) -> List[str]:
    """transformers' module tree, per decoder layer: 'moe' where the MLP has a router and experts."""
    fam = next(f for f in FAMILIES.values() if f.model_class == type(model).__name__)
    return ["moe" if fam.is_moe_module(layer.mlp) else "dense" for layer in decoder_layers(model)]


class RouterTrace:
    """Forward hooks on transformers' own routers: the top-k expert ids each MoE layer chose per token.

    Families route in one of two places: a router module whose forward returns (logits, scores,
    indices) (Qwen3-MoE, Mixtral, OLMoE: ``mlp.gate``), or the MoE block's ``route_tokens_to_experts``
    that turns the gate's logits into (indices, weights) (GLM-4.5, DeepSeek-V3: grouping and the
    correction bias live there). Both are transformers' own code; we only read their outputs.
    """

    def __init__(self, model):
        self.model = model
        self.rows: Dict[int, List[np.ndarray]] = {}
        self._undo: List[Callable[[], None]] = []
        for i, layer in enumerate(decoder_layers(model)):
            mlp = layer.mlp
            if hasattr(mlp, "route_tokens_to_experts"):
                self._wrap_method(i, mlp)
            elif hasattr(mlp, "gate") and hasattr(mlp, "experts"):
                h = mlp.gate.register_forward_hook(self._module_hook(i))
                self._undo.append(h.remove)

    def _record(self, i, indices):
        self.rows.setdefault(i, []).append(indices.detach().reshape(-1, indices.shape[-1]).cpu().numpy())

    def _module_hook(self, i):
        def hook(module, args, out):
            self._record(i, out[-1] if isinstance(out, tuple) else out)
        return hook

    def _wrap_method(self, i, mlp):
        original = mlp.route_tokens_to_experts

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            self._record(i, out[0])
            return out

        mlp.route_tokens_to_experts = wrapped
        self._undo.append(lambda: delattr(mlp, "route_tokens_to_experts"))

    def topk(self, token_ids: List[int]) -> np.ndarray:
        """[len(token_ids), moe layers, topk] sorted ids from one forward over the whole sequence."""
        import torch

        self.rows.clear()
        with torch.no_grad():
            self.model(torch.tensor([token_ids]))
        layers = sorted(self.rows)
        per_layer = [np.concatenate(self.rows[i]) for i in layers]
        return np.sort(np.stack(per_layer, axis=1), axis=-1)

    def close(self):
        for undo in self._undo:
            undo()
        self._undo.clear()


# Flags every family server runs with: the user's launch (our launcher, fp32 for exactness), a KV pool
# of a fixed size (sized from free host memory otherwise, which other processes on a shared machine
# move) and a static fraction that keeps SGLang's memory profiling from refusing a model of a few MB
# when other processes allocate during its load.
SERVE_FLAGS = ["--dtype", "float32", "--max-total-tokens", "4096", "--mem-fraction-static", "0.99"]


# MTP speculation as the embedded model runs it (NextN drafts, a chain of 3, 4 draft tokens verified).
MTP_FLAGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]

# server name -> (family, extra flags): every family plain, and DeepSeek-V3 again with MTP speculation on.
SERVERS: Dict[str, tuple] = {**{n: (n, []) for n in FAMILIES}, "deepseek_v3_mtp": ("deepseek_v3", MTP_FLAGS),
                              # GLM-4.7-Flash: one server, MTP speculation on (its main rows against transformers)
                              "glm4_moe_lite": ("glm4_moe_lite", MTP_FLAGS)}
# Servers that run together (a test compares them); one group at a time: an idle CPU server holds
# ~2-3 GB of host memory, and the suite's own servers run alongside.
GROUPS: Dict[str, List[str]] = {n: [n] for n in FAMILIES}
GROUPS["deepseek_v3"] = ["deepseek_v3", "deepseek_v3_mtp"]


def server_flags(name: str) -> List[str]:
    family, extra = SERVERS[name]
    return ["--model-path", str(build(FAMILIES[family])), *SERVE_FLAGS, *extra]


@dataclass
class ServedGroup:
    family: str
    urls: Dict[str, str]  # server name -> base URL

    @property
    def url(self) -> str:
        return self.urls[self.family]


def serve_group(family: str):
    """Start the group's servers together (start-ups overlap), yield them ready, stop them."""
    from tests.servers import ServerProcess

    procs = {n: ServerProcess(server_flags(n)).start() for n in GROUPS[family]}
    try:
        yield ServedGroup(family, {n: p.wait_ready().url for n, p in procs.items()})
    finally:
        for p in procs.values():
            p.stop()
