"""Tiny checkpoints of the MoE families sglang-r3 refuses because SGLang serves them on GPU kernels only (DeepSeek-V4,
Inkling), each saved by transformers 5.19's own class, and where plain SGLang 0.5.23 stops launching each on the CPU
runtime (``LAUNCHES``). tests/test_gpu_only_families.py launches them; tests/generators/family_table.py names them in
docs/models.md's family table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import torch

from sglang_r3.dev.embedded.tokenizer import write_tokenizer


def _save(model, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    write_tokenizer(folder)
    return folder


def _deepseek_v4(folder: Path) -> Path:
    """transformers' DeepseekV4ForCausalLM, tiny: a hash-routed MoE layer, then learned routers; both attention
    kinds (compressed sparse, heavily compressed); mHC with 2 streams; one MTP layer."""
    import transformers

    torch.manual_seed(0)
    config = transformers.DeepseekV4Config(
        vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=64, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=8,
        n_shared_experts=1, o_groups=2, o_lora_rank=32, index_n_heads=2, index_head_dim=32, index_topk=16,
        sliding_window=16, hc_mult=2, num_nextn_predict_layers=1, max_position_embeddings=4096,
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"])
    return _save(transformers.DeepseekV4ForCausalLM(config), folder)


def _deepseek_v4_sglang_keys(folder: Path) -> Path:
    """The same checkpoint with the keys SGLang's DeepSeekV4Config reads (configs/deepseek_v4.py) that
    transformers' save renames or leaves out: per-layer compression ratios (the MTP layer's last), the hash-layer
    count, the router's top-k method and groups, YaRN scaling with its original context."""
    _deepseek_v4(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    ratios = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    config.update(
        compress_ratios=[ratios[t] for t in config["layer_types"]] + [0],
        n_hash_layers=config["mlp_layer_types"].count("hash_moe"), topk_method="noaux_tc", n_group=1, topk_group=1,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 32,
                      "beta_slow": 1})
    path.write_text(json.dumps(config, indent=2))
    return folder


def _inkling(folder: Path) -> Path:
    """transformers' InklingForConditionalGeneration, tiny: three sliding / relative-bias layers, each MoE."""
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
                sliding_window_size=16, d_rel=4, rel_extent=32, intermediate_size=64, moe_intermediate_size=32,
                n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=4096)
    config = transformers.InklingConfig(
        text_config=text, vision_config=dict(text_hidden_size=64, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2),
        audio_config=dict(text_hidden_size=64), image_token_id=500, audio_token_id=501, image_bos_token_id=502,
        audio_bos_token_id=503)
    return _save(transformers.InklingForConditionalGeneration(config), folder)


@dataclass(frozen=True)
class Launch:
    architecture: str
    build: Callable[[Path], Path]
    # Where SGLang stops, as its log shows it: each must be in the log, the first is what the refusal names.
    stops: List[str]


LAUNCHES: Dict[str, Launch] = {
    # SGLang's model config reads compress_ratios (model_config.py _derive_model_shapes), which transformers'
    # config class does not write: the checkpoint is not read at all.
    "deepseek_v4_as_transformers_saves_it": Launch(
        "DeepseekV4ForCausalLM", _deepseek_v4, ["compress_ratios", "_derive_model_shapes"]),
    # Read, built, and stopped at load: the mHC kernels compile for the CUDA device.
    "deepseek_v4": Launch("DeepseekV4ForCausalLM", _deepseek_v4_sglang_keys,
                          ["prewarm_mhc_pre", "_prewarm_mhc_kernels", "torch/cuda/__init__.py"]),
    # Stopped as SGLang resolves its arguments: inkling.py asks for the Mamba cache's extra buffer.
    "inkling": Launch("InklingForConditionalGeneration", _inkling,
                      ["validate_mamba_extra_buffer",
                       "extra_buffer requires platform support for Mamba cache state snapshots"]),
}
