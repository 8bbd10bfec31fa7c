"""The tiny checkpoints' specs: one ``CheckpointSpec`` per checkpoint the tests build (a family as published, its
variants refused at start-up, its flipped checkpoint), in ``SPECS``; ``FLIPPED`` (the keys each family's flipped
checkpoint sets the other way) and ``REFUSED_FLIPS`` (keys SGLang builds otherwise, each in a checkpoint of its own).

A spec names transformers' classes and the keywords its checkpoint is built with (``tests.family_specs.build``), how
the oracle reads its model (``tests.family_specs.oracle``) and what rewrites its folder as the release ships it
(``tests.family_specs.published``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from tests.family_specs.published import (
    GEMMA4_VISION_IDS, GLM_VISION_IDS, INTERNS1_VISION_IDS, INTERNS1_VISION_TOKENS, KIMI_MEDIA_IDS, QWEN_OMNI_IDS,
    QWEN_VISION_IDS, _add_vision_tokens, _bailing_as_published, _gemma4_as_published, _gemma4_processor,
    _glm4v_processors, _interns1_as_published, _joyai_llm_flash_as_published, _kimi_k25_as_published,
    _kimi_k25_processor, _nemotron_h_as_published, _qwen3_omni_processor, _qwen_vl_processors,
    _step3p5_as_published, _transpose_fused_experts, STEP3P7_VISION)

VOCAB = 288  # >= the tokenizer's 260 ids
_TINY = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, tie_word_embeddings=False)

@dataclass(frozen=True)
class CheckpointSpec:
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
                   floor_scale=4, attn_scale=0.5)  # the NoPE layer's query scaling on from position 3 (published: 8192)

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
# and output scales are drawn (tests/family_specs/build.py), not left at ones.
_GEMMA4 = CheckpointSpec(
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


# Step-3.5 (Step3p5ForCausalLM), the main model: transformers 5.19 has no class of that name; its Step3p7TextConfig
# (model_type step3p5) and Step3p7ForConditionalGeneration's text model are Step-3.5's decoder (SGLang's step3p5.py
# builds the same: sigmoid router over an expert bias, renormalised top-k, a shared expert beside the routed ones,
# Gemma norms, q/k norms, a sigmoid gate per attention head). Saved by Step3p7ForConditionalGeneration (a one-block
# vision tower beside it), rewritten as the release ships it (text-only, the published spellings:
# _step3p5_as_published) and read back by the oracle through transformers' own reading of those spellings
# (AS_TRANSFORMERS). Dense layer 0, MoE layers 1-3; sliding-attention layers (1, 3) with as many heads as the full
# ones (another count stops SGLang 0.5.23 in its own config parsing: see the family's KEYS,
# num_sliding_attention_heads); a window longer than every test sequence (KEYS: sliding_window). No MTP layers: SGLang
# builds Step-3.5's as layer 45 whatever the depth (tests/test_multi_layer_mtp.py serves them).
_STEP3P5 = CheckpointSpec(
    "step3p5", "Step3p7Config", "Step3p7ForConditionalGeneration",
    dict(_TINY, head_dim=16, intermediate_size=128, moe_intermediate_size=32, share_expert_dim=32, num_hidden_layers=4,
         n_routed_experts=8, num_experts_per_tok=2, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
         layer_types=["full_attention", "sliding_attention"] * 2, sliding_window=64),
    wrap=lambda text: dict(text_config=text, vision_config=STEP3P7_VISION, tie_word_embeddings=False),
    layers_of=lambda m: list(m.model.language_model.layers),
    experts_topk=lambda c: (c.text_config.n_routed_experts, c.text_config.num_experts_per_tok),
    published_as="Step3p5ForCausalLM",
    hub_tensors=lambda folder: _step3p5_as_published(folder),
)


# Qwen3-VL-MoE, text routing: the multimodal checkpoint (a one-block vision tower, processor configs), text-only
# prompts; softmax top-k in every text layer, interleaved M-RoPE; as the Hub ships it (Qwen/Qwen3-VL-30B-A3B-Instruct:
# fused experts stored [experts, in, out], the transpose of transformers 5's parameters; transformers'
# conversion_mapping.py "qwen3_vl_moe" transposes them back when it loads, which the oracle does from this folder).
# moe_intermediate_size 24: neither fused tensor is square, so a transposition cannot load silently.
_QWEN3_VL_MOE = CheckpointSpec(
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
_QWEN3_OMNI_MOE = CheckpointSpec(
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
    # a sampled image / video / audio placeholder with no media behind it: transformers finds no features for it; a
    # sampled <|audio_start|>: the thinker's get_rope_index counts every one over prompt + completion as an audio
    # segment and reads audio_seqlens for it (None: TypeError, 1 sampled response in CI), where SGLang's is text
    not_sampled=tuple(QWEN_OMNI_IDS[k] for k in ("image_token_id", "video_token_id", "audio_token_id",
                                                  "audio_start_token_id")),
    experts_topk=lambda c: (c.thinker_config.text_config.num_experts, c.thinker_config.text_config.num_experts_per_tok),
    extra_files=lambda folder: _qwen3_omni_processor(folder),
)

# MiniMax-M2: every layer MoE, sigmoid scores with a selection bias (e_score_correction_bias), q/k RMS norm over the
# whole attention width (on the CPU runtime through cpu_runtime/families/minimax_m2.py), partial RoPE. scoring_func,
# use_routing_bias, use_qk_norm, qk_norm_type and rotary_dim as MiniMax-M2 publishes them (transformers' class keeps
# them; SGLang's minimax_m2.py reads them); partial_rotary_factor as a transformers 5.19 save writes it beside
# rotary_dim. transformers 5.12 (SGLang 0.5.15's pin) ignores rotary_dim: without partial_rotary_factor its oracle
# rotates the whole head (served by 0.5.15, 39 of 159 sampled pairs differed from it; SGLang reads rotary_dim on both
# releases).
# DSA models (GLM-5, DeepSeek-V3.2): MLA (q/kv LoRA, YaRN) and MoE with a DSA indexer whose index_topk (2048, as
# published) is longer than every test sequence: its sparse attention attends to every key, as the CPU runtime serves
# it (sglang_r3/cpu_runtime/ops/dsa.py); index_head_dim 128, as published and as SGLang's DSA KV pool asserts; one
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

_MINIMAX_M2 = CheckpointSpec(
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
# sglang_r3/cpu_runtime/ops/mamba2.py.
_NEMOTRON_H = CheckpointSpec(
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

SPECS: Dict[str, CheckpointSpec] = {
    # GLM-4.5: layer 0 dense (first_k_dense_replace), sigmoid scores with a correction bias, shared expert.
    "glm4_moe": CheckpointSpec(
        "glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
             num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, n_group=1, topk_group=1,
             norm_topk_prob=True, routed_scaling_factor=1.0, num_nextn_predict_layers=0, head_dim=16,
             partial_rotary_factor=0.5),
    ),
    # Qwen3-MoE: softmax top-k, every layer MoE; save_pretrained writes num_local_experts.
    "qwen3_moe": CheckpointSpec(
        "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, head_dim=16, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "mixtral": CheckpointSpec(
        "mixtral", "MixtralConfig", "MixtralForCausalLM",
        dict(_TINY, intermediate_size=64, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    # DeepSeek-V3: MLA attention (q/kv LoRA, decoupled RoPE, YaRN as published), layer 0 dense, sigmoid
    # scores with grouped top-k (noaux_tc: 4 groups, best 2), one NextN MTP layer. moe_layer_freq,
    # topk_method and scoring_func are keys of the published config.json that transformers' class
    # does not define (it keeps them) and SGLang's deepseek_v2.py reads.
    "deepseek_v3": CheckpointSpec("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK_V3_TEXT,
                                  mtp_layers=1),
    # Moonlight-16B-A3B (slime's and verl's scripts) as moonshotai/Moonlight-16B-A3B publishes it: DeepSeek-V3's class
    # without q LoRA (q_lora_rank null: one q_proj), no RoPE scaling, one expert group, two shared experts, no MTP.
    "moonlight": CheckpointSpec(
        "moonlight", "DeepseekV3Config", "DeepseekV3ForCausalLM",
        {**{k: v for k, v in _DEEPSEEK_V3_TEXT.items() if k != "rope_scaling"}, "q_lora_rank": None, "n_group": 1,
         "topk_group": 1, "n_shared_experts": 2, "num_nextn_predict_layers": 0, "rope_theta": 50000.0},
        router_std=0.4,  # sigmoid scores off saturation (one group), as Kimi-K2.5's
        qk_scale=8.0,  # scores that depend on positions: the rotation cpu_runtime/ops/rope.py gives it is seen
    ),
    # DeepSeek-V2-Lite as deepseek-ai/DeepSeek-V2-Lite publishes it: MLA without q LoRA (one q_proj), YaRN, layer 0
    # dense, softmax scores, plain top-k (topk_method greedy) not renormalised, two shared experts, no MTP layers.
    "deepseek_v2": CheckpointSpec(
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
    "glm4_moe_lite": CheckpointSpec(
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
    "glm4_moe_lite_no_q_lora": CheckpointSpec(
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
    "glm_moe_dsa": CheckpointSpec("glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                                  dict(_DSA, n_group=1, topk_group=1), router_std=0.4, mtp_layers=1),
    # DeepSeek-V3.2: DeepSeek-V3 (grouped top-k over 4 groups) with the DSA indexer, served with MTP on.
    "deepseek_v32": CheckpointSpec("deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM",
                                   dict(_DSA, n_group=4, topk_group=2), mtp_layers=1),
    "minimax_m2": _MINIMAX_M2,
    "nemotron_h": _NEMOTRON_H,
    # Granite-MoE: every layer MoE (softmax over the top-k logits), the multipliers as
    # ibm-granite/granite-3.1-3b-a800m-instruct publishes them.
    "granitemoe": CheckpointSpec(
        "granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM",
        dict(_TINY, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
             embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=6.0),
        is_moe_module=lambda mlp: hasattr(mlp, "router") and hasattr(mlp, "experts"),
        mlp_of=lambda layer: layer.block_sparse_moe,
        router_ids=lambda mlp: (mlp.router, lambda out: out[0]),
    ),
    # LFM2-MoE: short-conv and attention layers (layer_types), the first num_dense_layers dense, sigmoid scores with
    # an expert bias, as LiquidAI/LFM2-8B-A1B publishes them.
    "lfm2_moe": CheckpointSpec(
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
    "afmoe": CheckpointSpec(
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
    "hunyuan_v1_moe": CheckpointSpec(
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
    "qwen2_moe": CheckpointSpec(
        "qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
        dict(_TINY, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
             num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
             mlp_only_layers=[]),
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
    ),
    "olmoe": CheckpointSpec(
        "olmoe", "OlmoeConfig", "OlmoeForCausalLM",
        dict(_TINY, num_key_value_heads=4, intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
             norm_topk_prob=False),
    ),
    # ERNIE-4.5-MoE: softmax scores, top-k chosen on scores + a correction bias (moe_statics), renormalized;
    # layer 0 dense (moe_layer_start_index), the last layer dense too (moe_layer_end_index), one shared expert.
    "ernie4_5_moe": CheckpointSpec(
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
    "llama4": CheckpointSpec(
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
    "glm4v_moe": CheckpointSpec(
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
    "joyai_llm_flash": CheckpointSpec(
        "joyai_llm_flash", "DeepseekV3Config", "DeepseekV3ForCausalLM",
        {**{k: v for k, v in _DEEPSEEK_V3_TEXT.items() if k != "rope_scaling"}, "n_group": 1, "topk_group": 1,
         "num_nextn_predict_layers": 0, "rope_theta": 32000000.0},
        hub_tensors=lambda folder: _joyai_llm_flash_as_published(folder),
        stand_in="joyai_llm_flash",
        router_std=0.4,  # sigmoid scores off saturation (one group), as Kimi-K2.5's
        qk_scale=8.0,  # scores that depend on positions (see CheckpointSpec.qk_scale)
    ),
    # Ling / Ring 2.0 (BailingMoeV2ForCausalLM) as inclusionAI/Ling-mini-2.0 publishes it: GQA through one
    # query_key_value projection, QK norm, RoPE over half of each head; layer 0 dense; sigmoid scores over an expert
    # bias with grouped top-k (4 groups, best 2), renormalised, scaled 2.5; one shared expert; one NextN MTP layer.
    # transformers has no class for it and its modeling code is the release's own (inclusionAI/Ling-V2 af8837e
    # models/modeling_bailing_moe_v2.py), whose math is transformers' GLM-4.5 (Glm4MoeForCausalLM) under other names:
    # so the checkpoint is saved by Glm4MoeForCausalLM and rewritten to the release's names and config
    # (_bailing_as_published: model_type bailing_moe, auto_map to a stand-in for its config code), and the oracle
    # reads it back as GLM-4.5's (_bailing_as_glm4_moe). Served with MTP speculation on and --trust-remote-code.
    "bailing_moe_v2": CheckpointSpec(
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
    "kimi_k25": CheckpointSpec(
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
        qk_scale=8.0,  # scores that depend on positions (see CheckpointSpec.qk_scale)
        not_sampled=(KIMI_MEDIA_IDS["image_token_id"], KIMI_MEDIA_IDS["video_token_id"]),
    ),
    # Intern-S1 as the Hub ships it (internlm/Intern-S1): its remote code is transformers' InternVL under its own
    # names (InternS1Config, model_type interns1) over Qwen3-MoE's text model (every layer MoE, softmax top-k
    # renormalised, QK norm) with a one-layer InternViT tower; text prompts. Built and saved by transformers'
    # InternVLForConditionalGeneration (tensor names as the release's: SGLang's interns1.py maps model.language_model.*
    # and model.vision_tower.*), configured as published (_interns1_as_published: architectures, model_type, auto_map
    # to a stand-in for its config code, tests/checkpoints/configuration_interns1.py); served with --trust-remote-code,
    # as the release is.
    "interns1": CheckpointSpec(
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
    "step3p5": _STEP3P5,
    # Gemma-4 with the published split of attention shapes (full-attention layers: head_dim 32, one kv head; sliding:
    # 16, two): the CPU runtime's one KV pool cannot hold both, and start-up refuses it there.
    "gemma4_published_shapes": replace(
        _GEMMA4, name="gemma4_published_shapes",
        config={**_GEMMA4.config, "global_head_dim": 32, "num_global_key_value_heads": 1},
        not_served="this model's sliding-window layers keep keys and values of head_dim 16 x 2 heads, its "
                   "full-attention layers of 32 x 1"),
    # gpt-oss: every layer MoE (softmax over the top-k logits, router bias), clamped SwiGLU experts with biases;
    # attention sinks, layers alternating sliding window (8 tokens, shorter than every test sequence) / full.
    # The CPU runtime adds the sinks to torch_native (sglang_r3/cpu_runtime/families/gpt_oss.py).
    "gpt_oss": CheckpointSpec(
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
    "llama4_text": CheckpointSpec(
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
    # its linear attention with sglang_r3/cpu_runtime/ops/gdn.py.
    "qwen3_next": CheckpointSpec(
        "qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", _QWEN_HYBRID,
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
        published=dict(full_attention_interval=2), mtp_layers=1, mtp_format="qwen",
        server_env=_MAMBA_CONV_FLOAT32,
    ),
    # Qwen3.5-MoE, text-only checkpoint (Qwen3_5MoeForCausalLM): Qwen3-Next's hybrid layers with Qwen3.5's attention
    # (q/k Gemma RMSNorm, interleaved q|gate, M-RoPE) and linear-attention projections; one MTP layer
    # (mtp_num_hidden_layers, as published).
    "qwen3_5_moe_text": CheckpointSpec(
        "qwen3_5_moe_text", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", _QWEN35_TEXT,
        experts_topk=lambda c: (c.num_experts, c.num_experts_per_tok),
        published=dict(full_attention_interval=2, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False),
        mtp_layers=1, mtp_format="qwen",
        server_env=_MAMBA_CONV_FLOAT32,
    ),
    # Qwen3.5-MoE as published (Qwen3_5MoeForConditionalGeneration: a one-block vision tower, processor configs), text
    # prompts: the same text model under model.language_model.
    "qwen3_5_moe": CheckpointSpec(
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
# rule (a ``not_served`` variant naming it: REFUSED_FLIPS). Query and key projections scaled as CheckpointSpec.qk_scale
# says, so RoPE keys are seen; attention biases drawn (CheckpointSpec.attn_bias_std), so a dropped one is seen.
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
    "llama4": dict(rms_norm_eps=0.1, rope_theta=1000.0, use_qk_norm=False, interleave_moe_layer_step=1,
                   attn_temperature_tuning=False),
    "gpt_oss": dict(rms_norm_eps=0.1, attention_bias=False, layer_types=["full_attention", "full_attention"],
                    swiglu_limit=0.5),
    "ernie4_5_moe": dict(rms_norm_eps=0.1, rope_theta=1000.0, tie_word_embeddings=True, moe_layer_end_index=-1,
                         head_dim=32),
    "qwen3_next": dict(rms_norm_eps=0.1, norm_topk_prob=False, num_key_value_heads=1, linear_conv_kernel_dim=3,
                       rope_theta=1000.0),
    "deepseek_v32": dict(n_shared_experts=2, norm_topk_prob=False, n_group=1, topk_group=1, first_k_dense_replace=0,
                         routed_scaling_factor=1.0, tie_word_embeddings=True),
    "kimi_k25": dict(n_shared_experts=2, norm_topk_prob=False, n_group=4, topk_group=2, first_k_dense_replace=0, routed_scaling_factor=1.0,
                     rope_interleave=False),
    "glm4v_moe": dict(rms_norm_eps=0.1, n_shared_experts=2, attention_bias=False, norm_topk_prob=False, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                      first_k_dense_replace=0, tie_word_embeddings=True),
    "qwen3_vl_moe": dict(rms_norm_eps=0.1, attention_bias=True),
    "qwen3_omni_moe": dict(rms_norm_eps=0.1, attention_bias=True, norm_topk_prob=False),
    "interns1": dict(rms_norm_eps=0.1, rope_theta=1000.0, norm_topk_prob=False, attention_bias=True),
    # (moe_latent_size: the routed experts run in a 16-wide latent between two projections, as Nemotron-3-Super /
    # Ultra publish theirs; the router and the shared expert see the full width)
    "nemotron_h": dict(layer_norm_epsilon=0.1, norm_topk_prob=False, n_group=4, topk_group=2, routed_scaling_factor=1.0, use_conv_bias=False,
                       moe_latent_size=16, n_groups=2, mamba_n_groups=2, conv_kernel=3, use_bias=True),
    # Qwen3.5's text-only checkpoint: M-RoPE over half the head (sections to match, the factor given as the
    # published config gives it: beside rope_parameters too), embeddings tied
    "qwen3_5_moe_text": dict(rms_norm_eps=0.1, tie_word_embeddings=True, partial_rotary_factor=0.5,
                             rope_parameters={**_QWEN35_TEXT["rope_parameters"], "partial_rotary_factor": 0.5,
                                              "mrope_section": [4, 2, 2]},
                             num_key_value_heads=1, linear_conv_kernel_dim=3),
    # DeepSeek-V2 (the full model's keys): q LoRA, grouped top-k (group_limited_greedy: 4 groups, the best one; with
    # top-2 the best two would hold the top-2 anyway), scaled routed experts, no RoPE scaling, embeddings tied
    "deepseek_v2": dict(n_shared_experts=1, q_lora_rank=32, topk_method="group_limited_greedy", n_group=4, topk_group=1,
                        routed_scaling_factor=16.0, rope_scaling=None, tie_word_embeddings=True),
    "granitemoe": dict(rms_norm_eps=0.1, rope_theta=1000.0, tie_word_embeddings=True),
    "lfm2_moe": dict(norm_eps=0.1, rope_theta=1000.0, use_expert_bias=False, norm_topk_prob=False, routed_scaling_factor=2.0, conv_bias=True,
                     num_dense_layers=0, tie_word_embeddings=True, conv_L_cache=2),
    "afmoe": dict(rms_norm_eps=0.1, rope_theta=1000.0, mup_enabled=False, num_dense_layers=0, num_shared_experts=2, route_scale=1.0,
                  head_dim=32),
    # MiniMax-M2: head_dim apart from hidden_size // num_attention_heads (as published: 128 against 3072 / 48), RoPE
    # over the whole head, linear RoPE scaling
    "minimax_m2": dict(rms_norm_eps=0.1, head_dim=32, rotary_dim=32, partial_rotary_factor=1.0,
                       rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    # Step-3.5: a RoPE base per layer type and partial RoPE on the sliding-attention layers (published as per-layer
    # rope_theta / partial_rotary_factors), clamped SwiGLU in the dense MLP and the shared experts (layers 0, 1, 3),
    # the routed output scaled, another dense layer (2, not 0), the routed experts' SwiGLU clamped in every MoE layer
    # (on the CPU runtime by its step3p5 port, as SGLang's CUDA runner)
    # a window shorter than every test sequence (SGLang attends one key more: published.STEP3P5_SGLANG_WINDOW_EXTRA)
    "step3p5": dict(rms_norm_eps=0.1, moe_router_scaling_factor=2.0, sliding_window=4, swiglu_limits=[0.002, 0.002, 0, 0.002],
                    swiglu_limits_shared=[0.05, 0.05, 0, 0.05], mlp_layer_types=["sparse", "sparse", "dense", "sparse"],
                    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 50000.0,
                                                           "partial_rotary_factor": 0.5}}),
    "gemma4": dict(rms_norm_eps=0.1, attention_k_eq_v=False, final_logit_softcapping=None, hidden_size_per_layer_input=16,
                   num_kv_shared_layers=2, attention_bias=True, use_double_wide_mlp=True,
                   vocab_size_per_layer_input=VOCAB,
                   rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000.0,
                                                       "rope_type": "proportional"},
                                    "sliding_attention": {"rope_theta": 1000.0, "rope_type": "default"}}),
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
    # Step-3.5: transformers' Step3p7Attention scales scores by query_pre_attn_scalar ** -0.5, step3p5.py by
    # head_dim ** -0.5 whatever it says
    "step3p5_query_pre_attn_scalar": ("step3p5", dict(query_pre_attn_scalar=64),
                                      "query_pre_attn_scalar=64: transformers' Step3p7Attention scales"),
    # the factor given in rope_parameters only: transformers 5.19 saves the attribute beside it at its class default
    # (0.25), which SGLang's qwen3_5.py reads; served, 26 of 212 greedy pairs differed from transformers' rows
    "qwen3_5_moe_text_rope_factor_inside": (
        "qwen3_5_moe_text", dict(rope_parameters={**_QWEN35_TEXT["rope_parameters"], "partial_rotary_factor": 0.5,
                                                  "mrope_section": [4, 2, 2]}),
        "partial_rotary_factor=0.25 and rope_parameters.partial_rotary_factor=0.5"),
}


# Keys a flipped checkpoint's config.json carries beside transformers' save, in the spelling SGLang's config class
# reads: Qwen3-Next's RoPE base at the top level too (SGLang's Qwen3NextConfig reads only that; a transformers-5 save
# writes it inside rope_parameters, which start-up refuses); Nemotron-H's Mamba groups as mamba_n_groups too (SGLang
# builds the mixer from it, default 8; transformers' save writes n_groups only, which start-up refuses when not 8).
FLIPPED_PUBLISHED: Dict[str, Dict[str, Any]] = {"qwen3_next": dict(rope_theta=1000.0),
                                                "nemotron_h": dict(mamba_n_groups=2)}


def _flip(base: str, name: str, keys: Dict[str, Any], not_served: str = "") -> CheckpointSpec:
    published = {**SPECS[base].published, **FLIPPED_PUBLISHED.get(base, {})} if not not_served else SPECS[base].published
    return replace(SPECS[base], name=name, config={**SPECS[base].config, **keys}, qk_scale=8.0,
                   attn_bias_std=0.1, not_served=not_served, published=published)


for _base, _keys in FLIPPED.items():
    SPECS[f"{_base}_flipped"] = _flip(_base, f"{_base}_flipped", _keys)
for _name, (_base, _keys, _exit) in REFUSED_FLIPS.items():
    SPECS[_name] = _flip(_base, _name, _keys, _exit)

