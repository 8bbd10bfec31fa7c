"""Tiny MoE checkpoints of each family, built and saved by transformers' own classes, and their
routers' top-k as transformers computes it (the oracle for tests/test_families.py).

Each checkpoint is what a trainer exporting with transformers 5 writes: ``<Family>ForCausalLM(config)``
with random weights (fixed seed), ``save_pretrained`` (config.json in the class's own spelling,
safetensors), plus the embedded byte-level tokenizer so text prompts work offline.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from sglang_r3.dev.embedded.tokenizer import NUM_BYTE_TOKENS, write_tokenizer
from sglang_r3.core.paths import cache_root

VOCAB = 288  # >= the tokenizer's 260 ids
_TINY = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, tie_word_embeddings=False)


# Qwen3-VL / Qwen3.5's vision tokens, after the embedded tokenizer's 260 ids, and the config keys naming them.
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_VISION_IDS = dict(vision_start_token_id=260, vision_end_token_id=261, image_token_id=262, video_token_id=263)

# Qwen3-Omni-MoE's vision and audio tokens (Qwen/Qwen3-Omni-30B-A3B-Instruct's tokenizer names them), likewise; the
# keys are the thinker config's (vision_start / vision_end / audio_end: published keys its transformers class keeps,
# SGLang's processor reads vision_start_token_id and audio_start_token_id from the thinker config).
QWEN_OMNI_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|audio_start|>",
                    "<|audio_end|>", "<|audio_pad|>")
QWEN_OMNI_IDS = dict(vision_start_token_id=260, vision_end_token_id=261, image_token_id=262, video_token_id=263,
                     audio_start_token_id=264, audio_end_token_id=265, audio_token_id=266)
# The names its tokenizer_config.json gives them, which transformers' Qwen3OmniMoeProcessor reads off the tokenizer.
QWEN_OMNI_TOKEN_NAMES = dict(zip(("vision_bos_token", "vision_eos_token", "image_token", "video_token",
                                  "audio_bos_token", "audio_eos_token", "audio_token"), QWEN_OMNI_TOKENS))

# GLM-4.5V's, likewise.
GLM_VISION_TOKENS = ("<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
                     "<|video|>")
GLM_VISION_IDS = dict(image_start_token_id=260, image_end_token_id=261, image_token_id=262, video_start_token_id=263,
                      video_end_token_id=264, video_token_id=265)


# Gemma-4's media tokens (google/gemma-4-26B-A4B-it's tokenizer names: image soft token, begin / end of image, the
# same for audio, and the video token its processor adds), likewise. transformers 5.19's Gemma4Processor refuses
# every input of a tokenizer without the audio tokens (its validate_inputs), so they are there too.
GEMMA4_VISION_TOKENS = ("<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>", "<|video|>")
GEMMA4_VISION_IDS = dict(image_token_id=260, boi_token_id=261, eoi_token_id=262, audio_token_id=263,
                         boa_token_id=264, eoa_token_id=265, video_token_id=266)


# Kimi-K2.5's media tokens (its tokenizer's names), likewise; image_token_id is the published
# media_placeholder_token_id, the others are the keys transformers' Kimi_K25Config names them by.
KIMI_MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
                     "<|kimi_k25_video_placeholder|>")
KIMI_MEDIA_IDS = dict(vision_start_token_id=260, media_content=261, vision_end_token_id=262, image_token_id=263,
                      video_token_id=264)

# Intern-S1's image tokens (SGLang's InternVLProcessor expands a prompt's <image> to <img>, 256 <IMG_CONTEXT> per tile,
# </img>; the release's tokenizer holds them as special tokens) and its video pad, after the embedded tokenizer's
# 260 ids; image_token_id is the config's.
INTERNS1_VISION_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<|video_pad|>")
INTERNS1_VISION_IDS = dict(image_start=260, image_end=261, image_token_id=262, video=263)

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
    bias_std: float = 0.1  # the selection bias of routers that have one (e_score_correction_bias)
    # Attention projections' biases (q/k/v/o_proj.bias) drawn N(0, attn_bias_std); 0 keeps transformers' init, zeros,
    # under which a bias SGLang dropped or never loaded would pass unseen.
    attn_bias_std: float = 0.0
    # Factor on the text attention's query and key projections. At transformers' init (std 0.02) a tiny model's
    # attention scores are near zero and its softmax near uniform: the rows then hardly depend on positions, and a
    # wrong rotation passes (Moonlight at 1: RoPE's pair layout moved 0 of 120 pairs; at 8: 74).
    qk_scale: float = 1.0
    # NextN MTP layers appended to the checkpoint as DeepSeek publishes them (model.layers.{L}.*);
    # transformers builds none (it skips those tensors when loading).
    mtp_layers: int = 0
    # How the checkpoint carries them: "nextn" (DeepSeek/GLM: model.layers.{L+d}.* plus enorm/hnorm/eh_proj),
    # "ernie" (ERNIE-4.5: model.mtp_block.{d}.* -- a dense decoder layer -- and mtp_emb_norm / mtp_hidden_norm /
    # mtp_linear_proj, as SGLang's ernie4_eagle.py loads them) or "qwen" (Qwen3-Next / Qwen3.5: mtp.layers.{d}.* -- a
    # full-attention MoE decoder layer, experts one by one -- and mtp.fc / mtp.pre_fc_norm_{embedding,hidden} /
    # mtp.norm, as the releases ship them and SGLang's qwen3_next.py load_weights(is_mtp=True) reads them) or
    # "nemotron_h" (Nemotron-3-Ultra: mtp.layers.{b}.* -- one block per character of mtp_hybrid_override_pattern, as
    # the backbone's blocks are named -- the first with enorm / hnorm / eh_proj, the last with final_layernorm).
    mtp_format: str = "nextn"
    # transformers' config -> (experts, top-k) of its routers (the spelling differs between classes).
    experts_topk: Callable[[Any], tuple] = field(default=lambda c: (c.num_local_experts, c.num_experts_per_tok))
    # transformers' model -> its decoder layers (multimodal wrappers keep the text model deeper).
    layers_of: Callable[[Any], List[Any]] = field(default=lambda m: list(m.model.layers))
    # transformers' model -> the module the oracle runs its forward through: the model itself, but Qwen3-Omni-MoE's
    # wrapper only generates (no forward); its thinker, the part SGLang builds, computes the text model's logits.
    forward_of: Callable[[Any], Any] = field(default=lambda m: m)
    # A decoder layer -> its MLP (dense or MoE block).
    mlp_of: Callable[[Any], Any] = field(default=lambda layer: layer.mlp)
    # Routers whose output is neither (.., indices) nor route_tokens_to_experts': MoE block -> (router module,
    # its forward output -> [tokens, topk] ids, read from what transformers returned).
    router_ids: Optional[Callable[[Any], tuple]] = None
    # Parameters (name suffixes) drawn N(0, 1) and rounded to bfloat16: SGLang keeps them in bfloat16 whatever
    # --dtype says (gpt-oss's attention sinks), so the checkpoint's values are ones both sides hold exactly.
    bf16_params: tuple = ()
    # Not served on the CPU runtime: what the launcher exits with ("": served); tests/test_families.py checks it.
    not_served: str = ""
    # Files a published checkpoint ships beside the weights that SGLang reads at start-up (checkpoint folder -> None).
    extra_files: Optional[Callable[[Path], None]] = None
    # Multimodal wrappers: the text model's keyword dict (``config`` above) -> the wrapper config's keywords.
    wrap: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None
    # Tensors rewritten as the published checkpoint stores them, after transformers' save (checkpoint folder -> None):
    # Qwen3-VL-MoE's fused experts, transposed as transformers' own conversion mapping reads the Hub files; Kimi-K2.5's
    # tensor names and config.json, where transformers' save spells them otherwise.
    hub_tensors: Optional[Callable[[Path], None]] = None
    # Token ids a completion must not sample (their logits biased away): ids transformers' class embeds as another id
    # where no image stands behind them (Kimi-K2.5's media placeholders: Kimi_K25Model embeds them as id 0, SGLang
    # as themselves), so a text-sampled one is a different forward on each side.
    not_sampled: tuple = ()
    # Keys the published config.json carries that transformers' class takes but does not save (Qwen3-Next / Qwen3.5:
    # full_attention_interval, from which it derives layer_types; SGLang builds the layers from it): written into the
    # saved config.json (a wrapper's text_config; a dotted key names another section) as the release spells them.
    published: Dict[str, Any] = field(default_factory=dict)
    # Parameters set after transformers' init, where that init puts tokens on an edge where transformers and SGLang
    # compute differently (model -> None, under no_grad; Nemotron-H's Mamba time steps: _nemotron_h_time_steps).
    post_init: Optional[Callable[[Any], None]] = None
    # Environment the family's servers run with (SGLang settings read from the environment, e.g. a state dtype).
    server_env: Dict[str, str] = field(default_factory=dict)
    # The architecture the checkpoint names where transformers has no class for it and ``model_class`` is another
    # architecture's that computes the same (Ling 2.0 as GLM-4.5: AS_TRANSFORMERS); "" : model_class's own.
    published_as: str = ""
    # The model type whose release config class the checkpoint carries a stand-in for (STAND_INS; its hub_tensors
    # writes it, served with --trust-remote-code); "": transformers' own config class.
    stand_in: str = ""


_LLAMA4_TEXT = dict(_TINY, head_dim=16, intermediate_size=32, intermediate_size_mlp=128, num_hidden_layers=4,
                   num_local_experts=8, num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True,
                   attention_chunk_size=256, no_rope_layer_interval=4, attn_temperature_tuning=True,
                   floor_scale=8192, attn_scale=0.1)

# SGLang keeps a linear-attention layer's convolution window in bfloat16 whatever --dtype says (SGLANG_MAMBA_CONV_DTYPE,
# default bfloat16): served with it in float32, as --dtype (Nemotron-H served so moved 1 to 3 of ~400 sampled pairs).
_MAMBA_CONV_FLOAT32 = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}

# Qwen3-Next / Qwen3.5 hybrid layers: linear attention (layers 0, 2) and full attention (1, 3).
_QWEN_HYBRID = dict(_TINY, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                    shared_expert_intermediate_size=32, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                    full_attention_interval=2)
# Qwen3.5's text model: M-RoPE over a quarter of a 32-wide head (the published partial_rotary_factor).
_QWEN35_TEXT = dict(_TINY, head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                    num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                    full_attention_interval=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True})

# Gemma-4 26B-A4B as published (Gemma4ForConditionalGeneration; google/gemma-4-26B-A4B-it's text keys): every
# layer runs a dense MLP and, beside it, a router (norm, learned scale, projection; softmax top-k renormalised,
# a per-expert output scale) over GELU experts; sliding-window layers (8 tokens here) alternate with full ones
# (keys are values, proportional RoPE over a quarter of the head); q/k/v norms, logit soft-capping, tied
# embeddings; a one-layer vision tower; text prompts. The full-attention layers' head_dim and kv heads
# (global_head_dim, num_global_key_value_heads) equal the sliding ones here: the CPU runtime's one KV pool holds
# one shape, and start-up refuses the published split there (gemma4_published_shapes). The router's learned input
# and output scales are drawn (tests/families.py build), not left at ones.
_GEMMA4 = Family(
    "gemma4", "Gemma4Config", "Gemma4ForConditionalGeneration",
    dict(_TINY, head_dim=16, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4,
         enable_moe_block=True, num_experts=8, top_k_experts=2, global_head_dim=16, num_global_key_value_heads=2,
         attention_k_eq_v=True, sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
         hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
         final_logit_softcapping=30.0, use_bidirectional_attention="vision", tie_word_embeddings=True),
    wrap=lambda text: dict(
        text_config=text, tie_word_embeddings=True, audio_config=None, **GEMMA4_VISION_IDS,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, patch_size=16, position_embedding_size=64)),
    layers_of=lambda m: list(m.model.language_model.layers),
    experts_topk=lambda c: (c.text_config.num_experts, c.text_config.top_k_experts),
    mlp_of=lambda layer: layer,  # the router and experts sit on the decoder layer, beside its dense MLP
    is_moe_module=lambda layer: getattr(layer, "enable_moe_block", False),
    router_ids=lambda layer: (layer.router, lambda out: out[-1]),
    hub_tensors=lambda folder: _gemma4_as_published(folder),
    extra_files=lambda folder: _gemma4_processor(folder),
    # transformers' Gemma4Model embeds its image (and video, audio) placeholder ids as the pad token whether or not
    # media stands behind them, SGLang as themselves (seen: one sampled run, every layer at exactly that token).
    not_sampled=tuple(GEMMA4_VISION_IDS[k] for k in ("image_token_id", "audio_token_id", "video_token_id")),
)


# Qwen3-VL-MoE, text routing: the multimodal checkpoint (a one-block vision tower, processor configs), text-only
# prompts; softmax top-k in every text layer, interleaved M-RoPE; as the Hub ships it (Qwen/Qwen3-VL-30B-A3B-Instruct:
# fused experts stored [experts, in, out], the transpose of transformers 5's parameters; transformers'
# conversion_mapping.py "qwen3_vl_moe" transposes them back when it loads, which the oracle does from this folder).
# moe_intermediate_size 24: neither fused tensor is square, so a transposition cannot load silently.
_QWEN3_VL_MOE = Family(
    "qwen3_vl_moe", "Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
    dict(_TINY, head_dim=16, intermediate_size=128, moe_intermediate_size=24, num_hidden_layers=2, num_experts=8,
         num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                          "mrope_interleaved": True}),
    wrap=lambda text: dict(
        text_config=text, tie_word_embeddings=False, **QWEN_VISION_IDS,
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                           num_position_embeddings=64, deepstack_visual_indexes=[])),
    layers_of=lambda m: list(m.model.language_model.layers),
    # a sampled image / video placeholder with no pixels behind it: transformers finds no features for it
    not_sampled=(QWEN_VISION_IDS["image_token_id"], QWEN_VISION_IDS["video_token_id"]),
    experts_topk=lambda c: (c.text_config.num_experts, c.text_config.num_experts_per_tok),
    extra_files=lambda folder: _qwen_vl_processors(folder, patch_size=16, merge_size=2, temporal_patch_size=2),
    hub_tensors=lambda folder: _transpose_fused_experts(folder),
)

# Qwen3-Omni-MoE, the thinker's text routing: the omni checkpoint as transformers' Qwen3OmniMoeForConditionalGeneration
# saves it (thinker.* tensors, experts one by one: the Hub's layout, which transformers' conversion mapping for
# qwen3_omni_moe reads), text prompts and with an image. The thinker's text model is Qwen3-MoE's decoder (softmax
# top-k in every layer, q/k norm, interleaved M-RoPE); one-block vision and audio towers; no talker
# (enable_audio_output false, which the config allows: transformers then builds none, and SGLang builds none either
# way). moe_intermediate_size 24, as Qwen3-VL-MoE's: no expert tensor is square.
_QWEN3_OMNI_MOE = Family(
    "qwen3_omni_moe", "Qwen3OmniMoeConfig", "Qwen3OmniMoeForConditionalGeneration",
    dict(_TINY, head_dim=16, intermediate_size=128, moe_intermediate_size=24, num_hidden_layers=2, num_experts=8,
         num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
         # transformers' thinker always interleaves its M-RoPE sections; SGLang reads mrope_interleaved (the release's
         # rope_scaling names both). Text-only prompts give the three sections one position anyway.
         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                          "interleaved": True, "mrope_interleaved": True}),
    wrap=lambda text: dict(
        enable_audio_output=False,
        thinker_config=dict(
            text_config=text, tie_word_embeddings=False, **QWEN_OMNI_IDS,
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                               spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                               num_position_embeddings=64, deepstack_visual_indexes=[]),
            audio_config=dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                              output_dim=text["hidden_size"], downsample_hidden_size=16))),
    layers_of=lambda m: list(m.thinker.model.layers),
    forward_of=lambda m: m.thinker,
    # a sampled image / video / audio placeholder with no media behind it: transformers finds no features for it
    not_sampled=tuple(QWEN_OMNI_IDS[k] for k in ("image_token_id", "video_token_id", "audio_token_id")),
    experts_topk=lambda c: (c.thinker_config.text_config.num_experts, c.thinker_config.text_config.num_experts_per_tok),
    extra_files=lambda folder: _qwen3_omni_processor(folder),
)

# MiniMax-M2: every layer MoE, sigmoid scores with a selection bias (e_score_correction_bias), q/k RMS norm over the
# whole attention width (on the CPU runtime through patches/cpu/minimax_m2.py), partial RoPE. scoring_func,
# use_routing_bias, use_qk_norm, qk_norm_type and rotary_dim as MiniMax-M2 publishes them (transformers' class keeps
# them; SGLang's minimax_m2.py reads them); partial_rotary_factor as a transformers 5.19 save writes it beside
# rotary_dim. transformers 5.12 (SGLang 0.5.15's pin) ignores rotary_dim: without partial_rotary_factor its oracle
# rotates the whole head (served by 0.5.15, 39 of 159 sampled pairs differed from it; SGLang reads rotary_dim on both
# releases).
# DSA models (GLM-5, DeepSeek-V3.2): MLA (q/kv LoRA, YaRN) and MoE with a DSA indexer whose index_topk (2048, as
# published) is longer than every test sequence: its sparse attention attends to every key, as the CPU runtime serves
# it (sglang_r3/serving/patches/cpu/dsa.py); index_head_dim 128, as published and as SGLang's DSA KV pool asserts; one
# NextN layer; moe_layer_freq, topk_method and scoring_func as the published config.json carries them.
_DSA = dict(_TINY, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
            n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1,
            routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=16, v_head_dim=16, index_topk=2048, index_head_dim=128, index_n_heads=4,
            num_nextn_predict_layers=1, moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid",
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})

_DEEPSEEK_V3_TEXT = dict(
    _TINY, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
    n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
    qk_rope_head_dim=16, v_head_dim=16, num_nextn_predict_layers=1, moe_layer_freq=1, topk_method="noaux_tc",
    scoring_func="sigmoid", rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})

_MINIMAX_M2 = Family(
    "minimax_m2", "MiniMaxM2Config", "MiniMaxM2ForCausalLM",
    dict(_TINY, head_dim=16, intermediate_size=32, num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2,
         scoring_func="sigmoid", use_routing_bias=True, use_qk_norm=True, qk_norm_type="per_layer", rotary_dim=8,
         partial_rotary_factor=0.5),
    router_std=0.4,  # sigmoid scores off saturation: choices move from token to token
)


# Nemotron-3-Nano (NemotronHForCausalLM): Mamba-2 (M), attention (*), MLP (-) and MoE (E) blocks of one pattern, each a
# decoder layer; MoE at E (sigmoid scores with a selection bias, one group, routed_scaling_factor, renormalized, one
# ReLU^2 shared expert, non-gated ReLU^2 experts). The published keys (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16):
# n_groups 8 (SGLang builds the mixer from mamba_n_groups, default 8: another count is refused by the layout rule),
# conv_kernel, chunk_size, ...; one MLP block, which the release has none of, so that every block kind is served.
# Saved by transformers' class (the Hub's tensor names: backbone.*, experts one by one), config.json rewritten as the
# release spells it (_nemotron_h_as_published). The CPU runtime runs its Mamba-2 mixers with
# sglang_r3/serving/patches/cpu/mamba2.py.
_NEMOTRON_H = Family(
    "nemotron_h", "NemotronHConfig", "NemotronHForCausalLM",
    dict(_TINY, head_dim=16, hybrid_override_pattern="ME*EM-E", num_hidden_layers=7, intermediate_size=64,
         moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
         n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
         mamba_num_heads=8, mamba_head_dim=8, n_groups=8, ssm_state_size=16, conv_kernel=4, expand=2, chunk_size=128,
         mamba_hidden_act="silu", mlp_hidden_act="relu2", use_conv_bias=True, use_bias=False, mlp_bias=False,
         layer_norm_epsilon=1e-5, rope_theta=10000, partial_rotary_factor=1.0),
    mlp_of=lambda layer: layer.mixer,
    experts_topk=lambda c: (c.n_routed_experts, c.num_experts_per_tok),
    hub_tensors=lambda folder: _nemotron_h_as_published(folder),
    router_std=0.4,  # sigmoid scores off saturation, as GLM-4.5's (one group)
    post_init=lambda model: _nemotron_h_time_steps(model),
    mtp_layers=1, mtp_format="nemotron_h",  # Nemotron-3-Ultra's MTP head (Nano publishes none)
    # SGLang keeps a Mamba layer's convolution window in bfloat16 whatever --dtype says (mamba_utils.py
    # mamba2_state_dtype: SGLANG_MAMBA_CONV_DTYPE, default bfloat16; on CUDA too), so a float32 model's decode
    # convolves the last width - 1 inputs rounded to bfloat16: served so, 1 to 3 of ~400 sampled (token, layer) pairs
    # moved (decode logprobs ~1e-4 off transformers', prefill ~5e-7). Served with the window in float32, as --dtype.
    server_env=_MAMBA_CONV_FLOAT32,
)


def _nemotron_h_time_steps(model) -> None:
    """Each Mamba head's time-step bias at softplus^-1 of 0.01 .. 0.1 (transformers' init draws the step from
    [time_step_min, time_step_max] = [0.001, 0.1]). transformers' chunked scan (its prefill, and the oracle's one
    forward over the whole sequence) clamps the step at time_step_min, its recurrent decode and SGLang's kernels (as
    Megatron's mixer) do not: a head initialised near 0.001 falls below it for some tokens (dt noise ~0.16 on a bias
    of -6.6: ~2% of tokens), and the two part there. Kept above it, both compute the same model."""
    import torch

    for layer in model.model.layers:
        mixer = layer.mixer
        if hasattr(mixer, "dt_bias"):
            steps = torch.linspace(0.01, 0.1, mixer.dt_bias.numel())
            mixer.dt_bias.copy_(steps + torch.log(-torch.expm1(-steps)))  # softplus^-1


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
    "deepseek_v3": Family("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK_V3_TEXT, mtp_layers=1),
    # Moonlight-16B-A3B (slime's and verl's scripts) as moonshotai/Moonlight-16B-A3B publishes it: DeepSeek-V3's class
    # without q LoRA (q_lora_rank null: one q_proj), no RoPE scaling, one expert group, two shared experts, no MTP.
    "moonlight": Family(
        "moonlight", "DeepseekV3Config", "DeepseekV3ForCausalLM",
        {**{k: v for k, v in _DEEPSEEK_V3_TEXT.items() if k != "rope_scaling"}, "q_lora_rank": None, "n_group": 1,
         "topk_group": 1, "n_shared_experts": 2, "num_nextn_predict_layers": 0, "rope_theta": 50000.0},
        router_std=0.4,  # sigmoid scores off saturation (one group), as Kimi-K2.5's
        qk_scale=8.0,  # scores that depend on positions: the rotation cpu/rope.py gives it is seen
    ),
    # DeepSeek-V2-Lite as deepseek-ai/DeepSeek-V2-Lite publishes it: MLA without q LoRA (one q_proj), YaRN, layer 0
    # dense, softmax scores, plain top-k (topk_method greedy) not renormalised, two shared experts, no MTP layers.
    "deepseek_v2": Family(
        "deepseek_v2", "DeepseekV2Config", "DeepseekV2ForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
             n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
             n_shared_experts=2, routed_scaling_factor=1.0, norm_topk_prob=False, q_lora_rank=None, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, moe_layer_freq=1, topk_method="greedy",
             scoring_func="softmax",
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32,
                           "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
        qk_scale=8.0,  # scores that depend on positions: a wrong rotation is seen
        experts_topk=lambda c: (c.n_routed_experts, c.num_experts_per_tok),
    ),
    # GLM-4.7-Flash: MLA (YaRN, as published), layer 0 dense (first_k_dense_replace, a published key
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
    # The same with DeepSeek-V2-Lite-style attention (q_lora_rank null: one q_proj): refused at start-up by its
    # layout rule (SGLang's glm4_moe_lite.py never loads q_proj; served, 3% of pairs agreed with transformers).
    "glm4_moe_lite_no_q_lora": Family(
        "glm4_moe_lite_no_q_lora", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
             n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
             n_shared_experts=1, routed_scaling_factor=1.8, norm_topk_prob=True, q_lora_rank=None, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, num_nextn_predict_layers=0,
             topk_method="noaux_tc",
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
        router_std=0.4,
        not_served="q_lora_rank=None",
    ),
    # GLM-5: GLM-4.7-Flash's MLA + MoE (one expert group) with the DSA indexer, served with MTP on.
    "glm_moe_dsa": Family("glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                          dict(_DSA, n_group=1, topk_group=1), router_std=0.4, mtp_layers=1),
    # DeepSeek-V3.2: DeepSeek-V3 (grouped top-k over 4 groups) with the DSA indexer, served with MTP on.
    "deepseek_v32": Family("deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM",
                           dict(_DSA, n_group=4, topk_group=2), mtp_layers=1),
    "minimax_m2": _MINIMAX_M2,
    "nemotron_h": _NEMOTRON_H,
    # Granite-MoE: every layer MoE (softmax over the top-k logits), the multipliers as
    # ibm-granite/granite-3.1-3b-a800m-instruct publishes them.
    "granitemoe": Family(
        "granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM",
        dict(_TINY, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
             embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=6.0),
        is_moe_module=lambda mlp: hasattr(mlp, "router") and hasattr(mlp, "experts"),
        mlp_of=lambda layer: layer.block_sparse_moe,
        router_ids=lambda mlp: (mlp.router, lambda out: out[0]),
    ),
    # LFM2-MoE: short-conv and attention layers (layer_types), the first num_dense_layers dense, sigmoid scores with
    # an expert bias, as LiquidAI/LFM2-8B-A1B publishes them.
    "lfm2_moe": Family(
        "lfm2_moe", "Lfm2MoeConfig", "Lfm2MoeForCausalLM",
        dict(_TINY, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_experts=8,
             num_experts_per_tok=2, num_dense_layers=1, use_expert_bias=True, conv_L_cache=3,
             layer_types=["conv", "full_attention", "conv", "full_attention"]),
        router_std=0.4,
        mlp_of=lambda layer: layer.feed_forward,
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
    ),
    # AFMoE (arcee-ai/Trinity): sigmoid scores with an expert bias, renormalised and scaled, a shared expert, the
    # first num_dense_layers dense, sliding and full attention, muP, as published.
    "afmoe": Family(
        "afmoe", "AfmoeConfig", "AfmoeForCausalLM",
        dict(_TINY, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_experts=8,
             num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1, score_func="sigmoid", route_norm=True,
             route_scale=2.826, n_group=1, topk_group=1, global_attn_every_n_layers=2, sliding_window=16,
             layer_types=["sliding_attention", "full_attention"] * 2, mup_enabled=True, rope_theta=10000),
        router_std=0.4,
        is_moe_module=lambda mlp: hasattr(mlp, "router") and hasattr(mlp, "experts"),
        router_ids=lambda mlp: (mlp.router, lambda out: out[-1]),
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
    ),
    # Hunyuan-MoE v1: per-layer lists (moe_topk, num_shared_expert, moe_intermediate_size), use_mixed_mlp_moe,
    # use_qk_norm, use_cla as tencent/Hunyuan-A13B-Instruct publishes them: refused at start-up. Served (its
    # per-layer sizes padded past the CPU runtime's TP alignment, which stops on a list), SGLang's first prefill
    # stopped in torch_native's extend: "shape '[-1, 4, 16]' is invalid for input of size 464" (29 tokens of 4 heads
    # read as 29 rows; sglang_r3/core/families/refused.py _HUNYUAN_V1_MOE_REFUSAL).
    "hunyuan_v1_moe": Family(
        "hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM",
        dict(_TINY, intermediate_size=32, num_hidden_layers=3, num_experts=8, moe_topk=[2, 2, 2],
             num_shared_expert=[1, 1, 1], moe_intermediate_size=[32, 32, 32], use_mixed_mlp_moe=1, use_qk_norm=True,
             use_cla=False, cla_share_factor=2, head_dim=16),
        experts_topk=lambda c: (c.num_experts, c.moe_topk[0]),
        not_served="as transformers' HunYuanMoEV1 computes it",
    ),
    # The same with use_routing_bias false (transformers' class still saves and adds its bias): refused at start-up by
    # the layout rule. Served, 56 of 159 greedy (token, layer) pairs differed: SGLang builds no bias and drops it.
    "minimax_m2_no_routing_bias": replace(
        _MINIMAX_M2, name="minimax_m2_no_routing_bias", config={**_MINIMAX_M2.config, "use_routing_bias": False},
        not_served="use_routing_bias=False"),
    # The same with partial RoPE given only as transformers 5.19 spells it (partial_rotary_factor, no rotary_dim):
    # refused at start-up by the layout rule. Served, 46 of 159 greedy pairs differed: SGLang rotates the whole head.
    "minimax_m2_rope_factor_only": replace(
        _MINIMAX_M2, name="minimax_m2_rope_factor_only",
        config={k: v for k, v in _MINIMAX_M2.config.items() if k != "rotary_dim"},
        not_served="rotary_dim=None with partial_rotary_factor=0.5"),
    # Qwen2-MoE (Qwen1.5-MoE, as verl trains it): softmax top-k without renormalising (norm_topk_prob false, as
    # published), every layer MoE, a shared expert behind a sigmoid gate.
    "qwen2_moe": Family(
        "qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
             num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
             mlp_only_layers=[]),
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
    ),
    "olmoe": Family(
        "olmoe", "OlmoeConfig", "OlmoeForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
             norm_topk_prob=False),
    ),
    # ERNIE-4.5-MoE: softmax scores, top-k chosen on scores + a correction bias (moe_statics), renormalized;
    # layer 0 dense (moe_layer_start_index), the last layer dense too (moe_layer_end_index), one shared expert.
    "ernie4_5_moe": Family(
        "ernie4_5_moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4, moe_num_experts=8, moe_k=2,
             moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=2, moe_layer_interval=1,
             use_bias=False, num_nextn_predict_layers=1),
        router_std=0.15, bias_std=0.02,  # softmax scores spread out, the bias moves some choices
        experts_topk=lambda c: (c.moe_num_experts, c.moe_k),
        mtp_layers=1, mtp_format="ernie", seed=1,  # one dense MTP layer (it routes nothing: the draft's section stays empty)
    ),
    # Llama 4 as published (Llama4ForConditionalGeneration: a one-layer vision tower, text-only prompts): MoE every
    # 2nd layer (interleave_moe_layer_step), top-1 with a sigmoid weight on the expert input, a shared expert;
    # chunked attention on RoPE layers (chunk longer than every test sequence), every 4th layer NoPE with
    # temperature tuning, q/k L2 norm. The MoE block is layer.feed_forward, its router .router.
    "llama4": Family(
        "llama4", "Llama4Config", "Llama4ForConditionalGeneration", _LLAMA4_TEXT,
        wrap=lambda text: dict(
            text_config=text, tie_word_embeddings=False, image_token_index=287,
            vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               vision_output_dim=64, image_size=28, patch_size=14, projector_input_dim=64,
                               projector_output_dim=64, pixel_shuffle_ratio=0.5)),
        layers_of=lambda m: list(m.language_model.model.layers),
        experts_topk=lambda c: (c.text_config.num_local_experts, c.text_config.num_experts_per_tok),
        mlp_of=lambda layer: layer.feed_forward,
        is_moe_module=lambda ff: hasattr(ff, "router") and hasattr(ff, "experts"),
        router_ids=lambda ff: (ff.router, _llama4_router_ids(ff.router.top_k)),
    ),
    # GLM-4.5V / 4.6V as published (Glm4vMoeForConditionalGeneration: a one-block vision tower, processor configs,
    # text prompts): GLM-4.5's text model (layer 0 dense, sigmoid router with a selection bias, a shared expert),
    # attention bias, partial M-RoPE (its sections fill the rotary half-width, as zai-org/GLM-4.5V's do).
    "glm4v_moe": Family(
        "glm4v_moe", "Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration",
        dict(_TINY, head_dim=32, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
             n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
             attention_bias=True, partial_rotary_factor=0.5,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                              "partial_rotary_factor": 0.5}),
        wrap=lambda text: dict(
            text_config=text, tie_word_embeddings=False, **GLM_VISION_IDS,
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"])),
        layers_of=lambda m: list(m.model.language_model.layers),
        experts_topk=lambda c: (c.text_config.n_routed_experts, c.text_config.num_experts_per_tok),
        extra_files=lambda folder: _glm4v_processors(folder),
        # a sampled image / video placeholder with no pixels behind it: transformers finds no features for it
        not_sampled=(GLM_VISION_IDS["image_token_id"], GLM_VISION_IDS["video_token_id"]),
        router_std=0.4,  # sigmoid scores off saturation, as GLM-4.5's
    ),
    # JoyAI-LLM-Flash (Miles scripts/models/joyai-llm-flash.py): DeepSeek-V3's architecture (DeepseekV3ForCausalLM:
    # radixark/miles issue 606) under its own model type, joyai_llm_flash (mbridge's JoyAILLMFlashBridge in Miles, a
    # DeepseekV3Bridge), whose config class is the release's code, not read here: a stand-in, DeepSeek-V3's class
    # renamed (tests/checkpoints/configuration_joyai_llm_flash.py), served with --trust-remote-code. The keys are the
    # script's Megatron shapes: MLA with q LoRA, RoPE base 3.2e7 unscaled, sigmoid top-k with a selection bias in one
    # group, routed scaling 2.5, one shared expert, layer 0 dense; no MTP layers (Miles converts it without them).
    "joyai_llm_flash": Family(
        "joyai_llm_flash", "DeepseekV3Config", "DeepseekV3ForCausalLM",
        {**{k: v for k, v in _DEEPSEEK_V3_TEXT.items() if k != "rope_scaling"}, "n_group": 1, "topk_group": 1,
         "num_nextn_predict_layers": 0, "rope_theta": 32000000.0},
        hub_tensors=lambda folder: _joyai_llm_flash_as_published(folder),
        stand_in="joyai_llm_flash",
        router_std=0.4,  # sigmoid scores off saturation (one group), as Kimi-K2.5's
        qk_scale=8.0,  # scores that depend on positions (see Family.qk_scale)
    ),
    # Ling / Ring 2.0 (BailingMoeV2ForCausalLM) as inclusionAI/Ling-mini-2.0 publishes it: GQA through one
    # query_key_value projection, QK norm, RoPE over half of each head; layer 0 dense; sigmoid scores over an expert
    # bias with grouped top-k (4 groups, best 2), renormalised, scaled 2.5; one shared expert; one NextN MTP layer.
    # transformers has no class for it and its modeling code is the release's own (inclusionAI/Ling-V2 af8837e
    # models/modeling_bailing_moe_v2.py), whose math is transformers' GLM-4.5 (Glm4MoeForCausalLM) under other names:
    # so the checkpoint is saved by Glm4MoeForCausalLM and rewritten to the release's names and config
    # (_bailing_as_published: model_type bailing_moe, auto_map to a stand-in for its config code), and the oracle
    # reads it back as GLM-4.5's (_bailing_as_glm4_moe). Served with MTP speculation on and --trust-remote-code.
    "bailing_moe_v2": Family(
        "bailing_moe_v2", "Glm4MoeConfig", "Glm4MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
             num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, n_group=4, topk_group=2,
             norm_topk_prob=True, routed_scaling_factor=2.5, head_dim=16, partial_rotary_factor=0.5, use_qk_norm=True,
             attention_bias=False),
        mtp_layers=1,
        published_as="BailingMoeV2ForCausalLM",
        hub_tensors=lambda folder: _bailing_as_published(folder),
        stand_in="bailing_moe",
        router_std=0.4,  # sigmoid scores off saturation, as GLM-4.5's
    ),
    # Kimi-K2.5 as the Hub ships it (moonshotai/Kimi-K2.5): DeepSeek-V3's text model (MLA, YaRN, sigmoid top-k with a
    # selection bias, one group as published, layer 0 dense, no MTP layers) under KimiK25ForConditionalGeneration
    # with a one-block MoonViT tower; text prompts. Built and saved by transformers' Kimi_K25ForConditionalGeneration,
    # then renamed and configured as published (_kimi_k25_as_published); served with --trust-remote-code, as the
    # release needs for its processor (here a stand-in: tests/checkpoints/kimi_k25_processor.py).
    "kimi_k25": Family(
        "kimi_k25", "Kimi_K25Config", "Kimi_K25ForConditionalGeneration",
        dict(_DEEPSEEK_V3_TEXT, n_group=1, topk_group=1, num_nextn_predict_layers=0),
        wrap=lambda text: dict(
            text_config=text, tie_word_embeddings=False, projection_hidden_size=32,
            **{k: v for k, v in KIMI_MEDIA_IDS.items() if k != "media_content"},
            vision_config=dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                               patch_size=14, pos_emb_height=8, pos_emb_width=8, pos_emb_time=4)),
        layers_of=lambda m: list(m.model.language_model.layers),
        experts_topk=lambda c: (c.text_config.n_routed_experts, c.text_config.num_experts_per_tok),
        extra_files=lambda folder: _kimi_k25_processor(folder),
        hub_tensors=lambda folder: _kimi_k25_as_published(folder),
        router_std=0.4,  # sigmoid scores off saturation, as GLM-4.5's (one group: no group choice spreads them)
        qk_scale=8.0,  # scores that depend on positions (see Family.qk_scale)
        not_sampled=(KIMI_MEDIA_IDS["image_token_id"], KIMI_MEDIA_IDS["video_token_id"]),
    ),
    # Intern-S1 as the Hub ships it (internlm/Intern-S1): its remote code is transformers' InternVL under its own
    # names (InternS1Config, model_type interns1) over Qwen3-MoE's text model (every layer MoE, softmax top-k
    # renormalised, QK norm) with a one-layer InternViT tower; text prompts. Built and saved by transformers'
    # InternVLForConditionalGeneration (tensor names as the release's: SGLang's interns1.py maps model.language_model.*
    # and model.vision_tower.*), configured as published (_interns1_as_published: architectures, model_type, auto_map
    # to a stand-in for its config code, tests/checkpoints/configuration_interns1.py); served with --trust-remote-code,
    # as the release is.
    "interns1": Family(
        "interns1", "InternVLConfig", "InternVLForConditionalGeneration",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, head_dim=16, decoder_sparse_step=1, mlp_only_layers=[]),
        wrap=lambda text: dict(
            text_config=dict(text, model_type="qwen3_moe"), tie_word_embeddings=False,
            image_token_id=INTERNS1_VISION_IDS["image_token_id"],
            # 448-pixel tiles of 14-pixel patches, as published: SGLang's processor cuts 448-pixel tiles whatever the
            # config says
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=[448, 448], patch_size=[14, 14])),
        layers_of=lambda m: list(m.model.language_model.layers),
        experts_topk=lambda c: (c.text_config.num_experts, c.text_config.num_experts_per_tok),
        hub_tensors=lambda folder: _interns1_as_published(folder),
        stand_in="interns1",
        extra_files=lambda folder: _add_vision_tokens(folder, INTERNS1_VISION_TOKENS, INTERNS1_VISION_IDS),
        # transformers' InternVL embeds a context token as an image feature only with pixels behind it; a sampled
        # one would stop its forward ("Image features and image tokens do not match")
        not_sampled=(INTERNS1_VISION_IDS["image_token_id"],),
    ),
    "gemma4": _GEMMA4,
    # Gemma-4 with the published split of attention shapes (full-attention layers: head_dim 32, one kv head; sliding:
    # 16, two): the CPU runtime's one KV pool cannot hold both, and start-up refuses it there.
    "gemma4_published_shapes": replace(
        _GEMMA4, name="gemma4_published_shapes",
        config={**_GEMMA4.config, "global_head_dim": 32, "num_global_key_value_heads": 1},
        not_served="this model's sliding-window layers keep keys and values of head_dim 16 x 2 heads, its "
                   "full-attention layers of 32 x 1"),
    # gpt-oss: every layer MoE (softmax over the top-k logits, router bias), clamped SwiGLU experts with biases;
    # attention sinks, layers alternating sliding window (8 tokens, shorter than every test sequence) / full.
    # The CPU runtime adds the sinks to torch_native (sglang_r3/serving/patches/cpu/gpt_oss.py).
    "gpt_oss": Family(
        "gpt_oss", "GptOssConfig", "GptOssForCausalLM",
        dict(_TINY, head_dim=16, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
             sliding_window=8, layer_types=["sliding_attention", "full_attention"], attention_bias=True,
             rope_parameters={"rope_type": "default", "rope_theta": 150000.0}),
        is_moe_module=lambda mlp: hasattr(mlp, "router") and hasattr(mlp, "experts"),
        router_ids=lambda mlp: (mlp.router, lambda out: out[-1]),
        bf16_params=("sinks",),
        # openai/gpt-oss-20b's config.json carries it; transformers 5.12 (0.5.15's pin) neither takes nor saves it
        # (its experts clamp at a constant 7.0), SGLang reads it.
        published={"swiglu_limit": 7.0},
    ),
    # The same text model as transformers' Llama4ForCausalLM saves it: refused at start-up (not served).
    "llama4_text": Family(
        "llama4_text", "Llama4TextConfig", "Llama4ForCausalLM", _LLAMA4_TEXT,
        mlp_of=lambda layer: layer.feed_forward,
        is_moe_module=lambda ff: hasattr(ff, "router") and hasattr(ff, "experts"),
        router_ids=lambda ff: (ff.router, _llama4_router_ids(ff.router.top_k)),
        not_served="Llama4ForCausalLM",  # refused by its layout rule (sglang_r3/core/families/llama4.py)
    ),
    "qwen3_vl_moe": _QWEN3_VL_MOE,
    "qwen3_omni_moe": _QWEN3_OMNI_MOE,
    # The same saved by transformers 5.19's save_pretrained, which keeps its own fused layout (moe_intermediate_size
    # 32, as first tried): qwen3_vl_moe.py load_fused_expert_weights -> FusedMoE._load_w2 stops on the down_proj.
    "qwen3_vl_moe_transformers_save": replace(
        _QWEN3_VL_MOE, name="qwen3_vl_moe_transformers_save", config={**_QWEN3_VL_MOE.config, "moe_intermediate_size": 32},
        hub_tensors=None, not_served="The size of tensor a (64) must match the size of tensor b (32)"),
    # Qwen3-Next: gated delta-net (linear attention: causal conv, gated delta rule, gated RMSNorm) and full attention
    # (every 2nd layer: full_attention_interval, as published; output gate, partial RoPE), every layer MoE (softmax
    # top-k) with a sigmoid-gated shared expert, one MTP layer (published: mtp.* tensors, no count in the config).
    # Key and value head dims differ (16, 8) so that a transposed recurrent state cannot pass. The CPU runtime runs
    # its linear attention with sglang_r3/serving/patches/cpu/gdn.py.
    "qwen3_next": Family(
        "qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", _QWEN_HYBRID,
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
        published=dict(full_attention_interval=2), mtp_layers=1, mtp_format="qwen",
        server_env=_MAMBA_CONV_FLOAT32,
    ),
    # Qwen3.5-MoE, text-only checkpoint (Qwen3_5MoeForCausalLM): Qwen3-Next's hybrid layers with Qwen3.5's attention
    # (q/k Gemma RMSNorm, interleaved q|gate, M-RoPE) and linear-attention projections; one MTP layer
    # (mtp_num_hidden_layers, as published).
    "qwen3_5_moe_text": Family(
        "qwen3_5_moe_text", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", _QWEN35_TEXT,
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
        published=dict(full_attention_interval=2, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False),
        mtp_layers=1, mtp_format="qwen",
        server_env=_MAMBA_CONV_FLOAT32,
    ),
    # Qwen3.5-MoE as published (Qwen3_5MoeForConditionalGeneration: a one-block vision tower, processor configs), text
    # prompts: the same text model under model.language_model.
    "qwen3_5_moe": Family(
        "qwen3_5_moe", "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", _QWEN35_TEXT,
        wrap=lambda text: dict(
            text_config=text, tie_word_embeddings=False, **QWEN_VISION_IDS,
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                               spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                               num_position_embeddings=64)),
        layers_of=lambda m: list(m.model.language_model.layers),
        # a sampled image / video placeholder with no pixels behind it: transformers finds no features for it
        not_sampled=(QWEN_VISION_IDS["image_token_id"], QWEN_VISION_IDS["video_token_id"]),
        experts_topk=lambda c: (c.text_config.num_experts, c.text_config.num_experts_per_tok),
        extra_files=lambda folder: _qwen_vl_processors(folder, patch_size=16, merge_size=2, temporal_patch_size=2),
        # The releases' vision_config says no deepstack; transformers' Qwen3.5 vision config neither takes nor saves
        # the key, and SGLang's (a Qwen3-VL vision config) then defaults it to [8, 16, 24].
        published={"full_attention_interval": 2, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
                   "vision_config.deepstack_visual_indexes": []},
        mtp_layers=1, mtp_format="qwen",
        server_env=_MAMBA_CONV_FLOAT32,
    ),
}


# The config space (issue 33, item 3): per served family, the optional keys of its transformers config class that
# change the modules built or the math, each set the other way from the family's checkpoint in one more checkpoint,
# ``<family>_flipped``, served beside it (same group) and held to transformers' router top-k like any family. So each
# key is served both ways; a key that then disagrees is fixed in the CPU runtime or refused at start-up by the layout
# rule (a ``not_served`` variant naming it: REFUSED_FLIPS). Query and key projections scaled as Family.qk_scale
# says, so RoPE keys are seen; attention biases drawn (Family.attn_bias_std), so a dropped one is seen.
# ``test_every_flipped_key_changes_transformers_model`` checks each key changes transformers' modules or logits.
FLIPPED: Dict[str, Dict[str, Any]] = {
    "glm4_moe": dict(rms_norm_eps=0.1, rope_theta=1000.0, n_shared_experts=2, attention_bias=True, use_qk_norm=True, routed_scaling_factor=2.5, n_group=4, topk_group=2,
                     norm_topk_prob=False, partial_rotary_factor=1.0, first_k_dense_replace=0),
    # the norms' epsilon and RoPE's base, read by both sides (issue 52: every key transformers reads accounted for)
    "mixtral": dict(rms_norm_eps=0.1, rope_theta=1000.0),
    "olmoe": dict(rope_theta=1000.0),
    "qwen3_moe": dict(rms_norm_eps=0.1, rope_theta=1000.0, norm_topk_prob=False, attention_bias=True),
    # Ling 2.0 in GLM-4.5's keys (written as use_qkv_bias, num_shared_experts, ...: _bailing_as_published); the keys
    # on which SGLang and the release's code compute otherwise are refused instead (tests/test_layout.py).
    "bailing_moe_v2": dict(attention_bias=True, use_qk_norm=False, n_group=1, topk_group=1, partial_rotary_factor=1.0,
                           n_shared_experts=2, first_k_dense_replace=0, routed_scaling_factor=1.0),
    "qwen2_moe": dict(rms_norm_eps=0.1, rope_theta=1000.0, norm_topk_prob=True, qkv_bias=False),
    "glm4_moe_lite": dict(n_shared_experts=2, norm_topk_prob=False, rope_scaling=None, n_group=4, topk_group=2, routed_scaling_factor=1.0,
                          rope_interleave=False, qk_nope_head_dim=24, v_head_dim=8),
    "deepseek_v3": dict(norm_topk_prob=False, first_k_dense_replace=0, routed_scaling_factor=1.0,
                        n_shared_experts=2, tie_word_embeddings=True, rope_interleave=False, qk_rope_head_dim=8,
                        v_head_dim=24),
    "glm_moe_dsa": dict(n_shared_experts=2, norm_topk_prob=False, n_group=4, topk_group=2, routed_scaling_factor=1.0,
                        tie_word_embeddings=True),
    "llama4": dict(rms_norm_eps=0.1, rope_theta=1000.0, use_qk_norm=False, interleave_moe_layer_step=1),
    "gpt_oss": dict(rms_norm_eps=0.1, attention_bias=False, layer_types=["full_attention", "full_attention"]),
    "ernie4_5_moe": dict(rms_norm_eps=0.1, rope_theta=1000.0, tie_word_embeddings=True, moe_layer_end_index=-1),
    "qwen3_next": dict(rms_norm_eps=0.1, norm_topk_prob=False),
    "deepseek_v32": dict(n_shared_experts=2, norm_topk_prob=False, n_group=1, topk_group=1, first_k_dense_replace=0,
                         routed_scaling_factor=1.0),
    "kimi_k25": dict(n_shared_experts=2, norm_topk_prob=False, n_group=4, topk_group=2, first_k_dense_replace=0, routed_scaling_factor=1.0,
                     rope_interleave=False),
    "glm4v_moe": dict(rms_norm_eps=0.1, n_shared_experts=2, attention_bias=False, norm_topk_prob=False, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                      first_k_dense_replace=0),
    "qwen3_vl_moe": dict(rms_norm_eps=0.1, attention_bias=True),
    "qwen3_omni_moe": dict(rms_norm_eps=0.1, attention_bias=True, norm_topk_prob=False),
    "interns1": dict(rms_norm_eps=0.1, rope_theta=1000.0, norm_topk_prob=False, attention_bias=True),
    # (moe_latent_size: the routed experts run in a 16-wide latent between two projections, as Nemotron-3-Super /
    # Ultra publish theirs; the router and the shared expert see the full width)
    "nemotron_h": dict(layer_norm_epsilon=0.1, norm_topk_prob=False, n_group=4, topk_group=2, routed_scaling_factor=1.0, use_conv_bias=False,
                       moe_latent_size=16),
    # Qwen3.5's text-only checkpoint: M-RoPE over half the head (sections to match, the factor given as the
    # published config gives it: beside rope_parameters too), embeddings tied
    "qwen3_5_moe_text": dict(rms_norm_eps=0.1, tie_word_embeddings=True, partial_rotary_factor=0.5,
                             rope_parameters={**_QWEN35_TEXT["rope_parameters"], "partial_rotary_factor": 0.5,
                                              "mrope_section": [4, 2, 2]}),
    # DeepSeek-V2 (the full model's keys): q LoRA, grouped top-k (group_limited_greedy: 4 groups, the best one; with
    # top-2 the best two would hold the top-2 anyway), scaled routed experts, no RoPE scaling, embeddings tied
    "deepseek_v2": dict(n_shared_experts=1, q_lora_rank=32, topk_method="group_limited_greedy", n_group=4, topk_group=1,
                        routed_scaling_factor=16.0, rope_scaling=None, tie_word_embeddings=True),
    "granitemoe": dict(rms_norm_eps=0.1, rope_theta=1000.0, tie_word_embeddings=True),
    "lfm2_moe": dict(norm_eps=0.1, rope_theta=1000.0, use_expert_bias=False, norm_topk_prob=False, routed_scaling_factor=2.0, conv_bias=True,
                     num_dense_layers=0, tie_word_embeddings=True),
    "afmoe": dict(rms_norm_eps=0.1, rope_theta=1000.0, mup_enabled=False, num_dense_layers=0, num_shared_experts=2, route_scale=1.0),
    # MiniMax-M2: head_dim apart from hidden_size // num_attention_heads (as published: 128 against 3072 / 48), RoPE
    # over the whole head, linear RoPE scaling
    "minimax_m2": dict(rms_norm_eps=0.1, head_dim=32, rotary_dim=32, partial_rotary_factor=1.0,
                       rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "gemma4": dict(rms_norm_eps=0.1, attention_k_eq_v=False, final_logit_softcapping=None, hidden_size_per_layer_input=16,
                   num_kv_shared_layers=2),
}
# Keys SGLang 0.5.23 builds otherwise than transformers (found by a flipped checkpoint): each set alone the other
# way in a checkpoint of its own, refused at start-up by the layout rule naming it. name -> (family, keys, the
# launcher's exit message).
REFUSED_FLIPS: Dict[str, tuple] = {
    "qwen3_moe_mlp_only_layers": ("qwen3_moe", dict(mlp_only_layers=[0]), "mlp_only_layers=[0] put dense MLPs"),
    # held out, found served with other rows (issue 52): transformers windows every layer, qwen3_moe.py none
    "qwen3_moe_sliding_window": ("qwen3_moe", dict(use_sliding_window=True, sliding_window=8),
                                 "use_sliding_window=True with sliding_window=8"),
    "mixtral_head_dim": ("mixtral", dict(head_dim=32), "head_dim=32 is not hidden_size // num_attention_heads"),
    "mixtral_sliding_window": ("mixtral", dict(sliding_window=8), "sliding_window=8: SGLang 0.5.23 (mixtral.py)"),
    "ernie4_5_moe_use_bias": ("ernie4_5_moe", dict(use_bias=True), "use_bias=True: transformers' Ernie4_5_Moe"),
    "qwen3_next_attention_bias": ("qwen3_next", dict(attention_bias=True), "attention_bias=True: SGLang 0.5.23"),
    "granitemoe_attention_bias": ("granitemoe", dict(attention_bias=True), "attention_bias=True: SGLang 0.5.23"),
    "afmoe_attention_bias": ("afmoe", dict(attention_bias=True), "attention_bias=True: SGLang 0.5.23 (afmoe.py)"),
    "olmoe_tie_word_embeddings": ("olmoe", dict(tie_word_embeddings=True), "tie_word_embeddings=True: SGLang 0.5.23"),
    "olmoe_attention_bias": ("olmoe", dict(attention_bias=True), "attention_bias=True: SGLang 0.5.23 (olmoe.py)"),
    "olmoe_clip_qkv": ("olmoe", dict(clip_qkv=0.5), "clip_qkv=0.5: SGLang 0.5.23 (olmoe.py)"),
    "olmoe_norm_topk_prob": ("olmoe", dict(norm_topk_prob=True), "norm_topk_prob=True: SGLang 0.5.23 (olmoe.py)"),
    # the factor given in rope_parameters only: transformers 5.19 saves the attribute beside it at its class default
    # (0.25), which SGLang's qwen3_5.py reads; served, 26 of 212 greedy pairs differed from transformers' rows
    "qwen3_5_moe_text_rope_factor_inside": (
        "qwen3_5_moe_text", dict(rope_parameters={**_QWEN35_TEXT["rope_parameters"], "partial_rotary_factor": 0.5,
                                                  "mrope_section": [4, 2, 2]}),
        "partial_rotary_factor=0.25 and rope_parameters.partial_rotary_factor=0.5"),
}


def _flip(base: str, name: str, keys: Dict[str, Any], not_served: str = "") -> Family:
    return replace(FAMILIES[base], name=name, config={**FAMILIES[base].config, **keys}, qk_scale=8.0,
                   attn_bias_std=0.1, not_served=not_served)


for _base, _keys in FLIPPED.items():
    FAMILIES[f"{_base}_flipped"] = _flip(_base, f"{_base}_flipped", _keys)
for _name, (_base, _keys, _exit) in REFUSED_FLIPS.items():
    FAMILIES[_name] = _flip(_base, _name, _keys, _exit)


def _qwen_vl_processors(folder: Path, **sizes) -> None:
    """What a Qwen3-VL / Qwen3.5 checkpoint ships for images: the image and video processor configs (SGLang builds
    its processor from them at start-up, text-only prompts included) and the vision special tokens in its tokenizer,
    at the ids its config names (``QWEN_VISION_IDS``), so a prompt can hold an image."""
    import transformers

    transformers.Qwen2VLImageProcessor(**sizes).save_pretrained(str(folder))
    transformers.Qwen3VLVideoProcessor(**sizes).save_pretrained(str(folder))
    _add_vision_tokens(folder, QWEN_VISION_TOKENS, QWEN_VISION_IDS)


def _qwen3_omni_processor(folder: Path) -> None:
    """What a Qwen3-Omni checkpoint ships for its media (SGLang builds its processor at start-up, text-only prompts
    included): transformers' Qwen3OmniMoeProcessor over its image, video and audio processors, the tokenizer naming
    its vision and audio tokens at the ids the thinker config names."""
    import transformers

    _add_vision_tokens(folder, QWEN_OMNI_TOKENS, QWEN_OMNI_IDS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=QWEN_OMNI_TOKEN_NAMES)
    sizes = dict(patch_size=16, merge_size=2, temporal_patch_size=2)
    processor = transformers.Qwen3OmniMoeProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**sizes),
        video_processor=transformers.Qwen2VLVideoProcessor(**sizes),
        feature_extractor=transformers.WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer)
    processor.save_pretrained(str(folder))


def _add_vision_tokens(folder: Path, tokens, ids: Dict[str, int]) -> None:
    """The release's vision special tokens in the embedded tokenizer, at the ids the config names."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens(list(tokens))
    assert [tokenizer.token_to_id(t) for t in tokens] == list(ids.values())
    tokenizer.save(str(folder / "tokenizer.json"))


def _glm4v_processors(folder: Path) -> None:
    """The image and video processor configs a GLM-4.5V checkpoint ships (SGLang builds its processor at start-up)
    and its vision special tokens in the tokenizer."""
    import transformers

    transformers.Glm4vImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(str(folder))
    transformers.Glm4vVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(str(folder))
    _add_vision_tokens(folder, GLM_VISION_TOKENS, GLM_VISION_IDS)


def _gemma4_processor(folder: Path) -> None:
    """The processor a Gemma-4 checkpoint ships (SGLang builds it at start-up, for text prompts too): transformers'
    Gemma4Processor over its image, video and audio processors, the tokenizer naming its vision tokens."""
    import transformers

    _add_vision_tokens(folder, GEMMA4_VISION_TOKENS, GEMMA4_VISION_IDS)
    names = dict(zip(("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token"),
                     GEMMA4_VISION_TOKENS))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=names)
    processor = transformers.Gemma4Processor(
        feature_extractor=transformers.Gemma4AudioFeatureExtractor(),
        image_processor=transformers.Gemma4ImageProcessor(patch_size=16),
        video_processor=transformers.Gemma4VideoProcessor(patch_size=16), tokenizer=tokenizer)
    processor.save_pretrained(str(folder))


def _gemma4_as_published(folder: Path) -> None:
    """config.json as google/gemma-4-26B-A4B-it ships it: the full-attention layers' shape as ``global_head_dim`` /
    ``num_global_key_value_heads``, which transformers' Gemma4TextConfig turns into the ``per_layer_config`` its save
    writes instead."""
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    text = saved["text_config"]
    # (one override per full-attention layer, all alike; none where they equal the sliding layers')
    shapes = {json.dumps(o, sort_keys=True) for o in text.pop("per_layer_config").values()}
    shape = json.loads(shapes.pop()) if shapes else {}
    assert not shapes
    text["global_head_dim"] = shape.get("head_dim", text["head_dim"])
    text["num_global_key_value_heads"] = shape.get("num_key_value_heads", text["num_key_value_heads"])
    path.write_text(json.dumps(saved, indent=2, sort_keys=True))


# transformers 5.19's save of Kimi_K25ForConditionalGeneration -> the Hub's tensor names (moonshotai/Kimi-K2.5,
# which transformers' conversion_mapping.py "kimi_k25" reads): its reverse mapping renames every "layers" to
# "blocks" and leaves two vision prefixes.
_KIMI_K25_HUB_NAMES = {"language_model.model.blocks.": "language_model.model.layers.",
                       "model.mm_projector.pre_norm.": "mm_projector.pre_norm.",
                       "vision_tower.encoder.patch_embed.": "vision_tower.patch_embed."}


def _rename_tensors(folder: Path, prefixes: Dict[str, str]) -> None:
    """Each saved tensor whose name starts with a key of ``prefixes`` renamed to start with its value."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        renamed = {}
        for k, v in load_file(str(shard)).items():
            old = next((o for o in prefixes if k.startswith(o)), None)
            renamed[prefixes[old] + k[len(old):] if old else k] = v
        save_file(renamed, str(shard), metadata={"format": "pt"})


def _kimi_k25_as_published(folder: Path) -> None:
    """Tensor names and config.json as moonshotai/Kimi-K2.5 ships them. Its vision_config spells the tower's sizes
    vt_* and its position grid init_pos_emb_*, and SGLang's projector reads them; SGLang's MoonViT and transformers'
    vision config read the unprefixed sizes (which default to the release's values), so both are written."""
    _rename_tensors(folder, _KIMI_K25_HUB_NAMES)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    cfg["architectures"] = ["KimiK25ForConditionalGeneration"]
    cfg["media_placeholder_token_id"] = cfg["image_token_id"]
    text["architectures"] = ["DeepseekV3ForCausalLM"]
    vision.update({f"vt_{k}": vision[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_hidden_layers")})
    vision.update({f"init_{k}": vision[k] for k in ("pos_emb_height", "pos_emb_width", "pos_emb_time")})
    vision.update(mm_hidden_size=vision["hidden_size"], text_hidden_size=text["hidden_size"], merge_type="sd2_tpool",
                  mm_projector_type="patchmerger", pos_emb_type="divided_fixed", projector_hidden_act="gelu",
                  projector_ln_eps=1e-5, video_attn_type="spatial_temporal")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _joyai_llm_flash_as_published(folder: Path) -> None:
    """config.json under JoyAI-LLM-Flash's model type, auto_map to the stand-in for its config class (copied beside
    it); the architecture and tensors stay DeepSeek-V3's."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["model_type"] = "joyai_llm_flash"
    STAND_INS["joyai_llm_flash"].carry(folder, cfg)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


# transformers 5.19's save of InternVLForConditionalGeneration (its conversion mapping reversed: the InternVL-hf
# names) -> the module names Intern-S1 ships, which SGLang's interns1.py maps (_mapping_interns1_name) and
# transformers loads as they are.
_INTERNS1_HUB_NAMES = {"language_model.model.": "model.language_model.", "language_model.lm_head.": "lm_head.",
                       "vision_tower.": "model.vision_tower.", "multi_modal_projector.": "model.multi_modal_projector."}


def _interns1_as_published(folder: Path) -> None:
    """Tensor names and config.json as internlm/Intern-S1 ships them: its architecture and model types, auto_map to
    its config code (the stand-in, copied beside it), the text model's architecture (interns1.py picks its language
    model by it), and the vision keys SGLang's InternVisionModel reads that transformers' InternVL vision config does
    not save (dropout, drop_path_rate, initializer_factor: published in the release's vision_config)."""
    _rename_tensors(folder, _INTERNS1_HUB_NAMES)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(architectures=["InternS1ForConditionalGeneration"], model_type="interns1")
    STAND_INS["interns1"].carry(folder, cfg)
    cfg["text_config"]["architectures"] = ["Qwen3MoeForCausalLM"]
    cfg["vision_config"].update(model_type="interns1_vision", dropout=0.0, drop_path_rate=0.0, initializer_factor=0.1)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


# GLM-4.5's tensor names (transformers 5.19's save) -> Ling 2.0's (the release's modeling code; SGLang's bailing_moe.py
# load_weights): q/k/v_proj are fused into query_key_value ([q heads; k heads; v heads] rows), the NextN layer's
# shared_head.norm is its final_layernorm, and its own head and embedding are not stored (the release's MTP layer
# uses the model's).
_BAILING_NAMES = {"model.embed_tokens.": "model.word_embeddings.", ".self_attn.o_proj.": ".attention.dense.",
                  ".self_attn.q_norm.": ".attention.query_layernorm.",
                  ".self_attn.k_norm.": ".attention.key_layernorm.",
                  ".mlp.gate.e_score_correction_bias": ".mlp.gate.expert_bias",
                  ".shared_head.norm.": ".final_layernorm."}
_BAILING_QKV = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.")
# Ling 2.0's config keys -> GLM-4.5's, where they differ; the keys both spell alike, read as they are.
_BAILING_KEYS = {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                 "use_qkv_bias": "attention_bias"}
_BAILING_SAME_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                      "partial_rotary_factor", "use_qk_norm", "num_experts_per_tok", "n_group", "topk_group",
                      "moe_intermediate_size", "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor",
                      "num_nextn_predict_layers", "tie_word_embeddings", "eos_token_id", "pad_token_id",
                      "bos_token_id")


def _rewrite(name: str, table: Dict[str, str]) -> str:
    for old, new in table.items():
        if old in name:
            return name.replace(old, new)
    return name


def _bailing_as_published(folder: Path) -> None:
    """Tensors and config.json as Ling 2.0 ships them (from transformers' GLM-4.5 save, _BAILING_NAMES)."""
    import torch
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    out = {}
    for k, t in tensors.items():
        if k.endswith(".shared_head.head.weight") or (k.startswith("model.layers.") and ".embed_tokens." in k):
            continue  # the NextN layer's own head and embedding: the release's MTP layer uses the model's
        if _BAILING_QKV[0] in k:
            parts = [tensors[k.replace(_BAILING_QKV[0], p)] for p in _BAILING_QKV]
            out[k.replace(_BAILING_QKV[0], ".attention.query_key_value.")] = torch.cat(parts)
        elif not any(p in k for p in _BAILING_QKV):
            out[_rewrite(k, _BAILING_NAMES)] = t
    save_file(out, str(shard), metadata={"format": "pt"})
    path = folder / "config.json"
    glm = json.loads(path.read_text())
    cfg = {k: glm[k] for k in _BAILING_SAME_KEYS}
    cfg.update({k: glm[g] for k, g in _BAILING_KEYS.items()})
    cfg.update(architectures=["BailingMoeV2ForCausalLM"], model_type="bailing_moe", torch_dtype="float32",
               rope_theta=glm["rope_parameters"]["rope_theta"], rope_scaling=None, use_bias=False,
               score_function="sigmoid", moe_router_enable_expert_bias=True, router_dtype="fp32",
               moe_shared_expert_intermediate_size=glm["moe_intermediate_size"], embedding_dropout=0.0,
               attention_dropout=0.0, output_dropout=0.0)
    STAND_INS["bailing_moe"].carry(folder, cfg)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _bailing_as_glm4_moe(path: Path) -> Path:
    """The oracle's copy of a Ling 2.0 checkpoint: its tensors and config under GLM-4.5's names (the inverse of
    _bailing_as_published; query_key_value split by the config's heads), beside it, written once."""
    import transformers
    from safetensors.torch import load_file, save_file

    out = path.with_name(path.name + ".as-glm4_moe")
    if (out / "config.json").is_file():
        return out
    cfg = json.loads((path / "config.json").read_text())
    glm = {k: cfg[k] for k in _BAILING_SAME_KEYS}
    glm.update({g: cfg[k] for k, g in _BAILING_KEYS.items()})
    glm.update(rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                "partial_rotary_factor": cfg["partial_rotary_factor"]})
    config = transformers.Glm4MoeConfig(**glm)
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    back = {v: k for k, v in _BAILING_NAMES.items()}
    tensors = {}
    for shard in path.glob("*.safetensors"):
        for k, t in load_file(str(shard)).items():
            if k.startswith(f"model.layers.{config.num_hidden_layers}."):
                continue  # the NextN layer: transformers' GLM-4.5 builds none
            if ".attention.query_key_value." in k:
                for part, piece in zip(_BAILING_QKV, t.split([q, kv, kv])):
                    tensors[k.replace(".attention.query_key_value.", part)] = piece.contiguous()
            else:
                tensors[_rewrite(k, back)] = t
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


# Block names transformers 5.19 saves (layers_block_type) -> hybrid_override_pattern's characters.
_NEMOTRON_H_BLOCKS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h_as_published(folder: Path) -> None:
    """config.json as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 spells it: the blocks as hybrid_override_pattern and
    num_hidden_layers (transformers 5.19 writes layers_block_type with its own names, which SGLang 0.5.23's
    NemotronHConfig refuses: "contains invalid types"), no mtp_layers_block_type (Nemotron-3-Ultra spells its MTP head
    mtp_hybrid_override_pattern: _append_nemotron_h_mtp) and no time_step_limit (neither is published; transformers
    writes its defaults). The tensors are already the Hub's names."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    blocks = cfg.pop("layers_block_type")
    cfg["hybrid_override_pattern"] = "".join(_NEMOTRON_H_BLOCKS[b] for b in blocks)
    cfg["num_hidden_layers"] = len(blocks)
    for key in ("mtp_layers_block_type", "time_step_limit"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _kimi_k25_processor(folder: Path) -> None:
    """Kimi-K2.5's processor files: transformers' image and video processor configs, the release's media_proc_cfg
    and auto_map (to the stand-in for its remote code, copied beside them), its media tokens in the tokenizer."""
    import transformers

    transformers.Kimi_K25ImageProcessor().save_pretrained(str(folder))
    transformers.Kimi_K25VideoProcessor().save_pretrained(str(folder))
    path = folder / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    cfg["auto_map"] = {"AutoProcessor": "kimi_k25_processor.KimiK25Processor"}
    cfg["media_proc_cfg"] = {"patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 16384,
                             "patch_limit_on_one_side": 512, "fixed_output_tokens": None,
                             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    shutil.copy(Path(__file__).parent / "checkpoints" / "kimi_k25_processor.py", folder)
    _add_vision_tokens(folder, KIMI_MEDIA_TOKENS, KIMI_MEDIA_IDS)


def _llama4_router_ids(k: int):
    """Llama4Router returns (scores, logits): scores are sigmoid(top-k logits) scattered into -inf, i.e. 0
    everywhere but at the ids it chose. The ids are the scores' k non-zero columns."""

    def ids(out):
        import torch

        scores = out[0]
        chosen = torch.topk(scores, k, dim=-1).indices
        assert bool((torch.gather(scores, -1, chosen) > 0).all()) and int((scores != 0).sum()) == chosen.numel()
        return chosen

    return ids


# What makes a query or a key: per head (q_proj, k_proj) and MLA's (q_b_proj after its LoRA norm; kv_a_proj_with_mqa
# for the rotated key, kv_b_proj for the rest; q_a_proj's output is normalized, so scaling it would do nothing).
_QK_PROJECTIONS = ("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                   "kv_b_proj.weight")


def initialized(family: Family, text: Dict[str, Any]):
    """transformers' model of ``family`` with text config ``text``, its weights drawn as the checkpoint's are
    (seeded; routers, scales, biases and query/key projections as the fields above say), float32, eval."""
    import torch
    import transformers

    special = dict(eos_token_id=NUM_BYTE_TOKENS, pad_token_id=NUM_BYTE_TOKENS, bos_token_id=None)
    cfg = getattr(transformers, family.config_class)(**_keywords(family, text, special))
    torch.manual_seed(family.seed)
    model = getattr(transformers, family.model_class)(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".gate.weight", "router.weight", "router.proj.weight")):
                p.normal_(0.0, family.router_std)
            elif name.endswith(("router.scale", "router.per_expert_scale")):  # Gemma-4's router input and output
                p.uniform_(0.5, 1.5)  # scales (ones at init: a scale dropped would pass unseen)
            elif name.endswith(("e_score_correction_bias", "expert_bias")):  # ERNIE-4.5's moe_statics, AFMoE
                p.normal_(0.0, family.bias_std)
            elif name.endswith(family.bf16_params or ("\0",)):
                p.copy_(torch.randn_like(p).to(torch.bfloat16).to(p.dtype))
            elif ".self_attn." in name and name.endswith(_QK_PROJECTIONS):
                p.mul_(family.qk_scale)
            elif family.attn_bias_std and ".self_attn." in name and name.endswith("_proj.bias"):
                p.normal_(0.0, family.attn_bias_std)
        for name, b in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # sigmoid routers' selection bias (GLM,
                # DeepSeek-V3, LFM2-MoE)
                b.normal_(0.0, family.bias_std)
        if family.post_init is not None:
            family.post_init(model)
    return model


def build(family: Family, out: Optional[Path] = None) -> Path:
    """The checkpoint folder (built once per family definition, cached like the embedded model)."""
    import transformers

    key = hashlib.sha256(
        json.dumps([family.name, family.config_class, family.wrap(family.config) if family.wrap else family.config,
                    family.seed, family.router_std,
                    transformers.__version__] + ([family.bias_std] if family.bias_std != 0.1 else [])
                   + ([family.qk_scale] if family.qk_scale != 1.0 else [])
                   + ([["attn_bias_std", family.attn_bias_std]] if family.attn_bias_std else [])
                   + (["extra_files"] if family.extra_files else [])
                   + (["hub_tensors"] if family.hub_tensors else [])
                   + ([family.published, family.mtp_format] if family.published else [])
                   + (["qwen mtp drafts close"] if family.mtp_format == "qwen" else [])
                   + ([family.mtp_format, family.mtp_layers, "mtp blocks as saved"] if family.mtp_format == "nemotron_h" else [])
                   + (["post_init"] if family.post_init else []), sort_keys=True).encode()
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
    # With NextN MTP: a model one layer deeper, whose last decoder layer becomes the MTP block's layer.
    nextn = family.mtp_layers if family.mtp_format == "nextn" else 0
    model = initialized(family, {**family.config, "num_hidden_layers": L + nextn})
    model.save_pretrained(str(tmp))
    if nextn:
        _keep_last_layers_as_mtp(tmp, config_class(**_keywords(family, family.config, special)), family)
    elif family.mtp_format == "qwen":
        _append_qwen_mtp(tmp, family, special)
    elif family.mtp_format == "nemotron_h":
        _append_nemotron_h_mtp(tmp, family)
    elif family.mtp_layers:
        _append_ernie_mtp(tmp, model.config, family)
    if family.published:
        _write_published_keys(tmp, family)
    if family.hub_tensors is not None:
        family.hub_tensors(tmp)
    write_tokenizer(tmp)
    if family.extra_files is not None:
        family.extra_files(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _keywords(family: Family, text: Dict[str, Any], special: Dict[str, Any]) -> Dict[str, Any]:
    if family.wrap is None:
        return {**text, **special}
    return {**family.wrap({**text, **special}), **special}


def _write_published_keys(folder: Path, family: Family) -> None:
    """A wrapper's keys go into its text_config, but a dotted key names its section (``vision_config.x``)."""
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    for key, value in family.published.items():
        section, _, name = key.rpartition(".")
        owner = saved[section] if section else saved["text_config"] if family.wrap is not None else saved
        owner[name] = value
    path.write_text(json.dumps(saved, indent=2, sort_keys=True))


def _append_qwen_mtp(folder: Path, family: Family, special: Dict[str, Any]) -> None:
    """Qwen3-Next / Qwen3.5's MTP layers as their releases ship them: per depth d, ``mtp.layers.{d}.*`` (a
    full-attention MoE decoder layer of transformers' own class, built one-layer and seeded; experts one by one),
    and ``mtp.fc`` (the projection of [embedding; hidden]), ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.norm``
    (Gemma-style norms: 0 is the identity)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    config_class = getattr(transformers, family.config_class)
    one = {**family.config, "num_hidden_layers": 1, "layer_types": ["full_attention"]}
    one.pop("full_attention_interval", None)
    torch.manual_seed(family.seed + 1)
    model = getattr(transformers, family.model_class)(config_class(**_keywords(family, one, special))).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gate.weight"):
                p.normal_(0.0, family.router_std)
    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    H = family.config["hidden_size"]
    I = family.config["moe_intermediate_size"]
    for d in range(family.mtp_layers):
        prefix = f"mtp.layers.{d}."
        for key, value in family.layers_of(model)[0].state_dict().items():
            if key.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
                for e in range(value.shape[0]):
                    base = prefix + key.replace("gate_up_proj", f"{e}.")
                    tensors[base + "gate_proj.weight"] = value[e, :I].clone()
                    tensors[base + "up_proj.weight"] = value[e, I:].clone()
            elif key.endswith("mlp.experts.down_proj"):  # [E, H, I]
                for e in range(value.shape[0]):
                    tensors[prefix + key.replace("down_proj", f"{e}.down_proj.weight")] = value[e].clone()
            else:
                tensors[prefix + key] = value.clone()
    # The draft guesses close to the main model, so that some drafts are accepted and a verify commits states past
    # its first step: fc passes the embedding of token t+1 on and the layer adds little (its output projections
    # scaled down), so the draft says what the head makes of token t+1 -- near what this tiny main model, whose
    # prediction leans on the current token, predicts there (passing the hidden state on instead: none accepted).
    for key in [k for k in tensors if k.startswith("mtp.layers.") and k.endswith(("o_proj.weight", "down_proj.weight"))]:
        tensors[key] = tensors[key] * 0.1
    gen = torch.Generator().manual_seed(family.seed + 2)
    fc = torch.randn(H, 2 * H, generator=gen) * 0.01
    fc[:, :H] += torch.eye(H)  # [embedding; hidden]: SGLang's qwen3_next_mtp.py concatenates in that order
    tensors["mtp.fc.weight"] = fc
    for norm in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        tensors[norm] = torch.zeros(H)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard), metadata={"format": "pt"})


# Nemotron-3-Ultra's MTP head (Miles' nemotron-3-ultra-550b-a55b-4layer.py: "MTP head: attention + moe -> *E").
_NEMOTRON_H_MTP_PATTERN = "*E"


def _append_nemotron_h_mtp(folder: Path, family: Family) -> None:
    """Nemotron-H's MTP layer as Nemotron-3-Ultra ships it: config.json's num_nextn_predict_layers and
    mtp_hybrid_override_pattern, and per block b of that pattern ``mtp.layers.{b}.*`` named as the backbone's blocks
    (``norm``, ``mixer.*``: SGLang's nemotron_h.py load_weights(is_mtp=True) maps ``mtp.layers.`` to its draft's
    ``model.layers.``), the first block with ``enorm`` / ``hnorm`` / ``eh_proj`` (the projection of [embedding;
    hidden]), the last with ``final_layernorm``. The blocks are transformers' own, from a model of that pattern built
    as the checkpoint's (seeded, routers and biases drawn alike). transformers' NemotronH builds no MTP layer."""
    import torch
    from safetensors.torch import load_file, save_file

    blocks = initialized(family, {**family.config, "hybrid_override_pattern": _NEMOTRON_H_MTP_PATTERN,
                                  "num_hidden_layers": len(_NEMOTRON_H_MTP_PATTERN)})
    # Saved as the checkpoint is (the Hub's names: backbone.layers.*, experts one by one), then renamed: the
    # in-memory state_dict names them model.layers.* with the experts fused, which no release carries.
    with tempfile.TemporaryDirectory() as saved:
        blocks.save_pretrained(saved)
        (block_shard,) = Path(saved).glob("*.safetensors")
        head = {k.replace("backbone.layers.", "mtp.layers."): v for k, v in load_file(str(block_shard)).items()
                if k.startswith("backbone.layers.")}
    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    H = family.config["hidden_size"]
    assert head and not set(head) & set(tensors), "the MTP blocks' tensors are missing or clash"
    tensors.update(head)
    # Drafts close to the main model, so that some are accepted and a verify commits Mamba states past its first
    # step (as _append_qwen_mtp): eh_proj passes the embedding of token t+1 on, the blocks add little.
    for key in [k for k in tensors if k.startswith("mtp.layers.") and k.endswith(("o_proj.weight", "down_proj.weight"))]:
        tensors[key] = tensors[key] * 0.1
    gen = torch.Generator().manual_seed(family.seed + 2)
    proj = torch.randn(H, 2 * H, generator=gen) * 0.01
    proj[:, :H] += torch.eye(H)  # [embedding; hidden]: nemotron_h_mtp.py concatenates in that order
    last = len(_NEMOTRON_H_MTP_PATTERN) - 1
    tensors.update({"mtp.layers.0.enorm.weight": torch.ones(H), "mtp.layers.0.hnorm.weight": torch.ones(H),
                    "mtp.layers.0.eh_proj.weight": proj, f"mtp.layers.{last}.final_layernorm.weight": torch.ones(H)})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard), metadata={"format": "pt"})
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(num_nextn_predict_layers=family.mtp_layers, mtp_hybrid_override_pattern=_NEMOTRON_H_MTP_PATTERN)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _append_ernie_mtp(folder: Path, config, family: Family) -> None:
    """ERNIE-4.5's MTP layers as its checkpoints carry them: per depth d, ``model.mtp_block.{d}.*`` (a dense
    decoder layer; here layer 0's tensors, dense by moe_layer_start_index, perturbed) and the norms and the
    projection of [embedding; hidden] that feed it. The projection passes the hidden half on and the block
    adds little, so the draft guesses close to the main model and some drafts are accepted."""
    import torch
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    H = config.hidden_size
    gen = torch.Generator().manual_seed(family.seed + 1)
    for d in range(family.mtp_layers):
        for k, v in list(tensors.items()):
            if k.startswith("model.layers.0."):
                noise = torch.randn(v.shape, generator=gen) * 0.02 if v.dim() > 1 else 0.0
                scale = 0.1 if k.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                tensors[k.replace("model.layers.0.", f"model.mtp_block.{d}.")] = ((v + noise) * scale).contiguous()
        tensors[f"model.mtp_emb_norm.{d}.weight"] = torch.ones(H)
        tensors[f"model.mtp_hidden_norm.{d}.weight"] = torch.ones(H)
        proj = torch.randn(H, 2 * H, generator=gen) * 0.01
        proj[:, H:] += torch.eye(H)
        tensors[f"model.mtp_linear_proj.{d}.weight"] = proj
    save_file(tensors, str(shard), metadata={"format": "pt"})


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
        # the model's head: lm_head, or the embedding a tied checkpoint keeps in its place
        head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
        out[prefix + "shared_head.head.weight"] = head.clone()
        out[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file({k: v.contiguous() for k, v in out.items()}, str(shard), metadata={"format": "pt"})


def _transpose_fused_experts(folder: Path) -> None:
    """Each ``mlp.experts.gate_up_proj`` / ``down_proj`` tensor [experts, a, b] stored as [experts, b, a]."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for k, v in tensors.items():
            if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                tensors[k] = v.transpose(1, 2).contiguous()
        save_file(tensors, str(shard), metadata={"format": "pt"})


# The Hub's architecture name -> transformers' class, where they differ.
TRANSFORMERS_CLASS = {"KimiK25ForConditionalGeneration": "Kimi_K25ForConditionalGeneration",
                      "InternS1ForConditionalGeneration": "InternVLForConditionalGeneration"}
# Architectures transformers has no class for, whose math is another class's under other names (Family.published_as):
# architecture -> (that class, checkpoint folder -> a copy under its names, which the oracle loads).
AS_TRANSFORMERS: Dict[str, tuple] = {
    "BailingMoeV2ForCausalLM": ("Glm4MoeForCausalLM", lambda p: _bailing_as_glm4_moe(p)),
}


# The published spelling of a family's config keys where its checkpoint renames transformers' (Family.published_as).
PUBLISHED_KEYS: Dict[str, Dict[str, str]] = {"bailing_moe_v2": {g: k for k, g in _BAILING_KEYS.items()}}


def architecture_of(family: Family) -> str:
    """The architecture a family's checkpoint names (config.json ``architectures``)."""
    if family.published_as:
        return family.published_as
    return {cls: arch for arch, cls in TRANSFORMERS_CLASS.items()}.get(family.model_class, family.model_class)


@dataclass(frozen=True)
class StandIn:
    """A release's config class that is its own code (served with --trust-remote-code), which a host without the
    Hub cannot fetch: the STAND-IN the tests' checkpoints carry (tests/checkpoints/<module>.py, copied beside
    config.json, auto_map to it) and the transformers model type whose classes it renames."""

    module: str
    config_class: str
    renames: Optional[str]  # None: a class of its own (the oracle reads the checkpoint another way)

    @property
    def source(self) -> Path:
        return Path(__file__).parent / "checkpoints" / f"{self.module}.py"

    def load(self):
        """The stand-in class, as --trust-remote-code imports it (the sweep's module-tree build uses it)."""
        import importlib.util

        spec = importlib.util.spec_from_file_location(self.module, self.source)
        code = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(code)
        return getattr(code, self.config_class)

    def carry(self, folder: Path, cfg: Dict[str, Any]) -> None:
        """config.json's auto_map to the stand-in, and its file beside it, as the release ships its own."""
        cfg["auto_map"] = {"AutoConfig": f"{self.module}.{self.config_class}"}
        shutil.copy(self.source, folder)


# model_type -> its stand-in. transformers picks its weight conversions by model type (DeepSeek-V3's fuses the experts
# stored one by one): the oracle reads these checkpoints under the type renamed (load_transformers), since under the
# release's name JoyAI-LLM-Flash's experts were left at their initial values.
STAND_INS: Dict[str, StandIn] = {
    "interns1": StandIn("configuration_interns1", "InternS1Config", "internvl"),
    "joyai_llm_flash": StandIn("configuration_joyai_llm_flash", "JoyAILLMFlashConfig", "deepseek_v3"),
    "bailing_moe": StandIn("configuration_bailing_moe_v2", "BailingMoeV2Config", None),
}


def load_transformers(path: Path, *, strict: bool = False):
    """transformers' model of the checkpoint at ``path``, float32, eval (``strict``: every parameter from the
    checkpoint, none left at its initial value)."""
    import torch
    import transformers

    saved = json.loads((path / "config.json").read_text())
    (arch,) = saved["architectures"]
    if arch in AS_TRANSFORMERS:
        arch, as_transformers = AS_TRANSFORMERS[arch]
        path = as_transformers(path)
        saved = json.loads((path / "config.json").read_text())
    cls = getattr(transformers, TRANSFORMERS_CLASS.get(arch, arch))
    kwargs = {}
    stand_in = STAND_INS.get(saved.get("model_type"))
    if stand_in is not None and stand_in.renames:
        fields = {k: v for k, v in saved.items() if k != "auto_map"}
        kwargs["config"] = cls.config_class(**{**fields, "model_type": stand_in.renames})
    model, info = cls.from_pretrained(str(path), dtype=torch.float32, output_loading_info=True, **kwargs)
    assert not (strict and info["missing_keys"]), f"{path}: not in the checkpoint: {sorted(info['missing_keys'])}"
    return model.eval()


def family_of_model(model) -> Family:
    return next(f for f in FAMILIES.values() if f.model_class == type(model).__name__)


def decoder_layers(model) -> List[Any]:
    return family_of_model(model).layers_of(model)


def dense_or_moe(model) -> List[str]:
    """transformers' module tree, per decoder layer: 'moe' where the MLP has a router and experts."""
    fam = family_of_model(model)
    return ["moe" if fam.is_moe_module(fam.mlp_of(layer)) else "dense" for layer in decoder_layers(model)]


# How far (in router logits) a float32 near tie may sit for RouterTrace.near_tie: the few (token, layer) pairs of a
# sampled completion where SGLang's and transformers' op orders pick different experts of (almost) equal score.
# Measured: the MLA families served with MTP speculation (SGLang's absorbed attention, transformers' naive one) now and
# then meet one a move of 1e-4 to 1e-3 decides (GLM-5, sampled: one pair in a full run); the wrong rows found so far
# needed 0.1 and more (Ling 2.0 without its routed scaling factor).
NEAR_TIE_LOGIT = 1e-3
# At most this many near ties per response, each named in the failure message of the comparison that allowed it.
NEAR_TIES_PER_RESPONSE = 2


class RouterTrace:
    """Forward hooks on transformers' own routers: the top-k expert ids each MoE layer chose per token.

    Families route in one of three places: a router module whose forward returns (logits, scores,
    indices) (Qwen3-MoE, Mixtral, OLMoE, ERNIE-4.5, Qwen3-VL-MoE: ``mlp.gate``), the MoE block's
    ``route_tokens_to_experts`` that turns the gate's logits into (indices, weights) (GLM-4.5, DeepSeek-V3:
    grouping and the correction bias live there), or a router the family names (``Family.router_ids``:
    Llama 4's ``feed_forward.router``, whose scores are non-zero at the chosen ids only; gpt-oss's
    ``mlp.router``). All are transformers' own code; we only read their outputs.
    """

    def __init__(self, model):
        self.model = model
        self.rows: Dict[int, List[np.ndarray]] = {}
        self._inputs: Dict[int, List[Any]] = {}  # a router module's hidden-state input, per call (near_tie)
        self._gates: Dict[int, Any] = {}
        self._gate_args: Dict[int, tuple] = {}
        self._probing = False
        self._undo: List[Callable[[], None]] = []
        fam = family_of_model(model)
        self._forward = fam.forward_of(model)
        for i, layer in enumerate(decoder_layers(model)):
            mlp = fam.mlp_of(layer)
            if not fam.is_moe_module(mlp):
                continue
            if fam.router_ids is not None:
                router, ids = fam.router_ids(mlp)
                h = router.register_forward_hook(lambda m, a, out, i=i, ids=ids: self._record(i, ids(out)))
                self._undo.append(h.remove)
            elif hasattr(mlp, "route_tokens_to_experts"):
                self._wrap_method(i, mlp)
            else:
                h = mlp.gate.register_forward_hook(self._module_hook(i))
                self._undo.append(h.remove)
                self._gates[i] = mlp.gate

    def _record(self, i, indices):
        self.rows.setdefault(i, []).append(indices.detach().reshape(-1, indices.shape[-1]).cpu().numpy())

    def _module_hook(self, i):
        def hook(module, args, out):
            if self._probing:  # near_tie's own call
                return
            self._record(i, out[-1] if isinstance(out, tuple) else out)
            self._inputs.setdefault(i, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).clone())
            self._gate_args[i] = args[1:]  # a router's other inputs (LFM2-MoE's expert bias), for near_tie
        return hook

    def near_tie(self, column: int, token: int, chosen, delta: float = NEAR_TIE_LOGIT) -> bool:
        """Whether transformers' own router, from the last ``topk`` forward, picks ``chosen`` at (token, MoE layer
        column) once its logits move by at most ``delta``: up for the experts only ``chosen`` has, down for those
        only transformers chose. The move is made on the router's input (the least-squares hidden-state change
        that shifts the logits so), so grouping, bias and scoring stay the router's own code. A float32 near tie
        that another op order decides is one; a wrong row is not. Routers read another way: never."""
        import torch

        layer = sorted(self.rows)[column]
        gate = self._gates.get(layer)
        weight = getattr(gate, "weight", None)
        if gate is None or weight is None or weight.dim() != 2:
            return False
        hidden = torch.cat(self._inputs[layer])[token]
        mine = set(np.concatenate(self.rows[layer])[token].tolist())
        theirs = {int(e) for e in chosen}
        shift = torch.zeros(weight.shape[0], dtype=torch.float64)
        shift[sorted(theirs - mine)] = delta
        shift[sorted(mine - theirs)] = -delta
        move = torch.linalg.lstsq(weight.detach().double(), shift[:, None]).solution[:, 0]
        self._probing = True
        try:
            with torch.no_grad():
                out = gate((hidden.double() + move).to(hidden.dtype)[None], *self._gate_args.get(layer, ()))
        finally:
            self._probing = False
        picked = out[-1] if isinstance(out, tuple) else out
        return set(picked.reshape(-1).tolist()) == theirs

    def _wrap_method(self, i, mlp):
        original = mlp.route_tokens_to_experts

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            self._record(i, out[0])
            return out

        mlp.route_tokens_to_experts = wrapped
        self._undo.append(lambda: delattr(mlp, "route_tokens_to_experts"))

    def topk(self, token_ids: List[int], **inputs) -> np.ndarray:
        """[len(token_ids), moe layers, topk] sorted ids from one forward over the whole sequence (``inputs``: the
        model's other inputs, e.g. an image's pixel values from its processor)."""
        import torch

        self.rows.clear()
        self._inputs.clear()
        with torch.no_grad():
            out = self._forward(torch.tensor([token_ids]), **inputs)
        self.logits = out.logits[0].double()  # [len(token_ids), vocab]
        layers = sorted(self.rows)
        per_layer = [np.concatenate(self.rows[i]) for i in layers]
        return np.sort(np.stack(per_layer, axis=1), axis=-1)

    def close(self):
        for undo in self._undo:
            undo()
        self._undo.clear()


# Multimodal MoE wrappers whose processor runs on CPU, served with an image in the prompt: its tokens pass through the
# MoE layers as tokens, so their rows are in the record (ours and upstream's routed_experts) like any other.
# family -> (its prompt with the release's image placeholder, the image's side: a multiple of patch x merge within the
# processor's pixel bounds, so neither side resizes it)
IMAGE_FAMILIES = {
    "glm4v_moe": ("Look: <|begin_of_image|><|image|><|end_of_image|> What is it?", 112),
    "qwen3_5_moe": ("Look: <|vision_start|><|image_pad|><|vision_end|> What is it?", 64),
    "qwen3_vl_moe": ("Look: <|vision_start|><|image_pad|><|vision_end|> What is it?", 64),
    "qwen3_omni_moe": ("Look: <|vision_start|><|image_pad|><|vision_end|> What is it?", 64),
    "kimi_k25": ("Look: <|media_begin|><|media_pad|><|media_end|> What is it?", 56),
    # (its processor resizes any image to its soft-token budget, 256 tokens here, on both sides alike)
    "gemma4": ("Look: <|image|> What is it?", 96),
    # one 448-pixel tile (the request's image_max_dynamic_patch: 1; SGLang's default cuts up to 12 and a thumbnail)
    "interns1": ("Look: <image> What is it?", 448),
}
# What a family's image request carries beyond the prompt and the image.
IMAGE_REQUEST = {"interns1": {"image_max_dynamic_patch": 1}}


def _interns1_image_inputs(folder: Path, text: str, image) -> tuple:
    """Intern-S1's model inputs for ``text`` with ``image``, as SGLang prepares them: the release's processor is not
    transformers' (SGLang runs its own InternVLProcessor, multimodal/processors/internvl.py
    process_qwen_mm_data_async), so the oracle takes that processor's pixels: the image scaled to [0, 1], normalised
    by its ImageNet mean and std, cut into tiles by its own dynamic_preprocess (one tile here, as the request asks),
    and the prompt's <image> expanded to <img>, the context token per tile feature, </img>."""
    import numpy
    import torch
    import transformers
    from sglang.srt.multimodal.processors.internvl import InternVLProcessor as SGLangProcessor

    config = json.loads((folder / "config.json").read_text())
    vision = config["vision_config"]
    per_tile = int((vision["image_size"][0] // vision["patch_size"][0]) ** 2 * config["downsample_ratio"] ** 2)
    pixels = torch.from_numpy(numpy.array(image.convert("RGB"))).permute(2, 0, 1).float() / 255.0
    mean = torch.tensor(SGLangProcessor.IMAGENET_MEAN).view(-1, 1, 1)
    std = torch.tensor(SGLangProcessor.IMAGENET_STD).view(-1, 1, 1)
    tiles = SGLangProcessor.dynamic_preprocess((pixels - mean) / std, image_size=448,
                                               max_num=IMAGE_REQUEST["interns1"]["image_max_dynamic_patch"],
                                               use_thumbnail=True)
    expanded = text.replace(SGLangProcessor.IMAGE_PLACEHOLDER_TOKEN, SGLangProcessor.IMG_START
                            + SGLangProcessor.IMG_CONTEXT * (per_tile * tiles.shape[0]) + SGLangProcessor.IMG_END)
    ids = transformers.AutoTokenizer.from_pretrained(str(folder))(expanded)["input_ids"]
    return ids, {"pixel_values": tiles.to(torch.float32)}


# Families whose release's processor is not transformers': folder, prompt, image -> (input ids, pixel inputs) as
# SGLang's own processor makes them.
SGLANG_PROCESSED = {"interns1": _interns1_image_inputs}
# Where SGLang's model builds a norm with another eps than transformers' (on every device), the oracle takes SGLang's,
# so the rows compared are of one computation; tests/test_families.py pins each difference on both sides.
# GLM-4.5V: glm4v.py builds the patch merger's post_projection_norm as SGLang's own LayerNorm (eps 1e-6), transformers
# as nn.LayerNorm (1e-5). Traced op by op (every vision op before it agrees within float32): with transformers' eps,
# SGLang's logprobs after an image were 4.3e-4 off (text-only: 3.8e-7) and sampled completions differed at a pair
# now and then (8 of 44 responses, 1e-3 to 1e-2 of a logit from a tie); with SGLang's, 4.3e-7 and 0 of 40.
SGLANG_NORM_EPS = {"glm4v_moe": {"model.visual.merger.post_projection_norm": 1e-6}}


def with_sglang_norm_eps(name: str, model):
    """``model`` (transformers') with the norms SGLang builds with another eps set to SGLang's (SGLANG_NORM_EPS)."""
    for path, eps in SGLANG_NORM_EPS.get(name, {}).items():
        model.get_submodule(path).eps = eps
    return model


# Flags every family server runs with: the user's launch (our launcher, fp32 for exactness), a KV pool
# of a fixed size (sized from free host memory otherwise, which other processes on a shared machine
# move) and a static fraction that keeps SGLang's memory profiling from refusing a model of a few MB
# when other processes allocate during its load.
SERVE_FLAGS = ["--dtype", "float32", "--max-total-tokens", "4096", "--mem-fraction-static", "0.99"]


# MTP speculation as the embedded model runs it (NextN drafts, a chain of 3, 4 draft tokens verified).
MTP_FLAGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]

# Linear-attention families: SGLang sizes the recurrent-state pool from free host memory otherwise (GBs for a
# tiny model, which the host's other servers then compete for).
HYBRID_FLAGS = ["--max-mamba-cache-size", "64"]

# server name -> (family, extra flags): every family plain, and DeepSeek-V3 again with MTP speculation on.
SERVED = [n for n, f in FAMILIES.items() if not f.not_served]
SERVERS: Dict[str, tuple] = {**{n: (n, []) for n in SERVED}, "deepseek_v3_mtp": ("deepseek_v3", MTP_FLAGS),
                              # GLM-4.7-Flash: one server, MTP speculation on (its main rows against transformers)
                              "glm4_moe_lite": ("glm4_moe_lite", MTP_FLAGS),
                              # GLM-5: the same, its NextN layer drafting through the DSA model's MTP path
                              "glm_moe_dsa": ("glm_moe_dsa", MTP_FLAGS),
                              "deepseek_v32": ("deepseek_v32", MTP_FLAGS),
                              # Kimi-K2.5: its processor is the checkpoint's own code, as the release's is
                              "kimi_k25": ("kimi_k25", ["--trust-remote-code"]),
                              # Intern-S1: its config class is the checkpoint's own code, as the release's is
                              "interns1": ("interns1", ["--trust-remote-code"]),
                              # JoyAI-LLM-Flash: likewise (a stand-in for it)
                              "joyai_llm_flash": ("joyai_llm_flash", ["--trust-remote-code"]),
                              # Ling 2.0: its config class is the checkpoint's own code (a stand-in); MTP speculation
                              # on (its NextN layer drafting)
                              "bailing_moe_v2": ("bailing_moe_v2", MTP_FLAGS + ["--trust-remote-code"]),
                              # ERNIE-4.5: one server, MTP speculation on (its dense MTP layer drafts)
                              "ernie4_5_moe": ("ernie4_5_moe", MTP_FLAGS),
                              # the hybrid (linear-attention) families: a bounded state pool, and MTP speculation
                              # on (their MTP layer drafting): main rows against transformers, as GLM-4.7-Flash's
                              **{n: (n, HYBRID_FLAGS + MTP_FLAGS)
                                 for n in ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe")},
                              # Nemotron-H: a bounded state pool, and MTP speculation on (Nemotron-3-Ultra's MTP
                              # head drafting: attention then MoE blocks)
                              "nemotron_h": ("nemotron_h", HYBRID_FLAGS + MTP_FLAGS),
                              # LFM2-MoE: its short convolutions' state pool bounded likewise (unbounded, one
                              # server's scheduler held ~5 GB and was killed for memory beside the suite's others)
                              "lfm2_moe": ("lfm2_moe", HYBRID_FLAGS)}
# A flipped checkpoint is served as its family is, but without MTP speculation: the flip is of the target model.
SERVERS.update({n: (n, [f for f in SERVERS[n[:-8]][1] if f not in MTP_FLAGS])
                for n in FAMILIES if n.endswith("_flipped")})
# Servers that run together (a test compares them); one group at a time: an idle CPU server holds
# ~2-3 GB of host memory, and the suite's own servers run alongside.
GROUPS: Dict[str, List[str]] = {n: [n] for n in SERVED if n != "qwen3_5_moe_text"}
GROUPS["deepseek_v3"] = ["deepseek_v3", "deepseek_v3_mtp"]
# Qwen3.5-MoE as published and its text-only checkpoint: the same text model, two servers starting together.
GROUPS["qwen3_5_moe"] = ["qwen3_5_moe", "qwen3_5_moe_text"]
# Each flipped checkpoint starts with its family (start-ups overlap), on the release the main CI stage serves
# (0.5.23). The 0.5.15.post1 stage serves its families as published, not their flips.
for _base in FLIPPED:
    del GROUPS[f"{_base}_flipped"]
    if importlib.metadata.version("sglang") != "0.5.15.post1":
        next(g for g in GROUPS.values() if _base in g).append(f"{_base}_flipped")


# Groups served on SGLang 0.5.15.post1 too (-m release; CI's 0.5.15.post1 stage): families whose routers 0.5.15 builds
# without a layer id (Mixtral, OLMoE: the adapter files their rows under the layer of the experts beside them) and
# one it numbers; what slime's scripts train on 0.5.15's image that its CPU runtime starts (GLM-4.5 / 4.7, GLM-4.7-Flash
# with MTP speculation, DeepSeek-V3 with it on and off, MiniMax-M2); Qwen2-MoE, whose CPU ops are hooked on both.
RELEASE_FAMILIES = ("mixtral", "olmoe", "qwen3_moe", "minimax_m2", "qwen2_moe", "glm4_moe", "glm4_moe_lite",
                    "deepseek_v3")


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

    @property
    def families(self) -> List[str]:
        """The group's servers that serve a family as it is named (not a second server of it, e.g. with MTP)."""
        return [n for n in self.urls if SERVERS[n][0] == n]


# The groups pytest runs next start while this group's tests run: a CPU server's start-up is mostly one process
# importing, and the tests mostly wait on one server's forward (servers and tests run one thread each), so the
# second core is otherwise idle. Bounded by memory: an idle CPU server holds about 1 GB of host memory of its own,
# and the suite's own servers run alongside, so this group and those started ahead run at most AHEAD_MAX_SERVERS.
AHEAD_MAX_SERVERS = 5
_ahead: Dict[str, Dict[str, Any]] = {}  # group -> its servers, started, not yet waited on


def _start_group(family: str) -> Dict[str, Any]:
    from tests.servers import ServerProcess

    return {n: ServerProcess(server_flags(n), env=FAMILIES[SERVERS[n][0]].server_env).start() for n in GROUPS[family]}


def serve_group(family: str, then: Sequence[str] = ()):
    """Start the group's servers together (start-ups overlap), yield them ready, stop them. ``then``: the groups
    that run next, in order; as many as fit start once these are ready (each waited on when its turn comes)."""
    procs = _ahead.pop(family, None) or _start_group(family)
    try:
        urls = {n: p.wait_ready().url for n, p in procs.items()}
        alive = len(procs) + sum(len(g) for g in _ahead.values())
        for group in (g for g in then if g != family and g not in _ahead):
            if alive + len(GROUPS[group]) > AHEAD_MAX_SERVERS:
                break
            _ahead[group] = _start_group(group)
            alive += len(GROUPS[group])
        yield ServedGroup(family, urls)
    finally:
        for p in procs.values():
            p.stop()


def stop_ahead() -> None:
    """Stop the servers of groups started ahead that never ran (a run cut short, or ``-x``)."""
    while _ahead:
        for p in _ahead.popitem()[1].values():
            p.stop()
