"""The registry-wide sweep: every MoE architecture SGLang 0.5.23 serves, built from a tiny config, its routers
read from the module tree SGLang builds -- captured exactly by sglang-r3's layout, or refused by name.

Run in a fresh process (``python -m tests.scripts.sweep [--json OUT]``; tests/test_sweep.py does): it starts SGLang's
CPU runtime, a one-process gloo group and SGLang's model-parallel groups at tp=1 (as SGLang's own layer tests
do, ``sglang.test.layer_ut_utils``), then for each architecture:

* **which architectures**: SGLang's registry as SGLang builds it (``import_model_classes``: every module of
  ``sglang.srt.models`` with an ``EntryClass``), read from the modules' source so that modules the CPU host
  cannot import are listed too; an entry is MoE when its module (or a ``sglang.srt.models`` module it imports
  from) builds ``TopK`` / ``FusedMoE`` / ``get_moe_impl_class``.
* **with a layout rule** (``sglang_r3.core.families``): the tiny config below (the config class SGLang builds: its
  own or transformers'), SGLang's model class built on the meta device, its routers read by the same code the
  server's start-up check runs (``adapter/served_layout.py``: ``TopK`` layer ids and routed top-k, ``FusedMoE``
  experts) must be the layout's main MoE layers; its draft model (the architecture SGLang's own
  ``ModelConfig._config_draft_model`` picks) must route as the layout's MTP layers; where transformers has a
  class of that name, its module tree (which decoder layers hold experts) must agree too; the layout from the
  config object must equal the layout (and fingerprint) from the config's dict (the trainer's side, no SGLang).
* **without one**: ``layout_from_hf_config`` must refuse it naming the architecture (the server's start-up
  refusal) and the reason.
* **classes SGLang's loader substitutes** (``get_model_architecture``, asked for every registered architecture with
  every quantization method SGLang registers: ``QuantMixtralForCausalLM`` for some quantized Mixtral checkpoints):
  the substitute built from the original's tiny config, its routers checked against the original's layout by the
  start-up check; captured if they fit, else the start-up refusal that check gives.

No status is written by hand: a row is captured only if its build above passed, refused only with the refusal the
code gives, and an error otherwise (tests/test_sweep.py fails on it). The CPU runtime's patches are installed first,
as in a server's processes (Qwen3.5's module imports, Qwen3-Next's layers build, on CPU only with them).

It prints / writes a JSON list of rows, one per architecture; ``markdown(rows)`` is the table in docs/models.md.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from tests.support import step3p5

# MLA's rotary embedding: YaRN as DeepSeek-V3 publishes it.
_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1,
         "mscale": 1.0, "mscale_all_dim": 1.0}
# Keys of DeepSeek-V3's published config.json that transformers' class does not define (it keeps them) and
# SGLang's deepseek_v2.py reads.
_DEEPSEEK_PUBLISHED = dict(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid")
_T = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
          max_position_embeddings=512, tie_word_embeddings=False)

_LLAMA4_TEXT = dict(_T, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=4, num_local_experts=4,
                    num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=4,
                    attention_chunk_size=64)

_QWEN35_TEXT = dict(_T, head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                    num_hidden_layers=4, full_attention_interval=2, num_experts=8, num_experts_per_tok=2,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                    mtp_num_hidden_layers=1,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True})

# Nemotron-H's published keys (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json), tiny.
_NEMOTRON_H = dict(_T, intermediate_size=64, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                   n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5, mamba_num_heads=8, mamba_head_dim=8, n_groups=8,
                   ssm_state_size=16, conv_kernel=4, expand=2, chunk_size=128, mamba_hidden_act="silu",
                   mlp_hidden_act="relu2", use_conv_bias=True, use_bias=False, mlp_bias=False, layer_norm_epsilon=1e-5,
                   mamba_proj_bias=False, mamba_ssm_cache_dtype="float32", residual_in_fp32=False, time_step_min=0.001,
                   time_step_max=0.1, time_step_floor=0.0001, rope_theta=10000, partial_rotary_factor=1.0,
                   sliding_window=None, attention_bias=False)

# A one-block Qwen3-VL vision tower (Qwen3-VL-MoE's, and Qwen3-Omni-MoE's thinker's).
_QWEN3_VL_VISION = dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=4, out_hidden_size=64, patch_size=16,
                        temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64,
                        deepstack_visual_indexes=[0])

# Tiny configs, per architecture with a rule: (model_type of the config class, values). Values not named
# take the class defaults.
SPECS: Dict[str, tuple] = {
    "Glm4MoeForCausalLM": ("glm4_moe", dict(_T, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
                                            n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=2,
                                            n_shared_experts=1, n_group=1, topk_group=1,
                                            num_nextn_predict_layers=1)),
    "DeepseekV3ForCausalLM": ("deepseek_v3", dict(_T, num_key_value_heads=4, intermediate_size=128,
                                                  moe_intermediate_size=32, num_hidden_layers=4, n_routed_experts=8,
                                                  num_experts_per_tok=2, n_group=4, topk_group=2,
                                                  first_k_dense_replace=1, n_shared_experts=1, q_lora_rank=32,
                                                  kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                                                  v_head_dim=16, num_nextn_predict_layers=1,
                                                  rope_scaling=_YARN, **_DEEPSEEK_PUBLISHED)),
    "DeepseekV2ForCausalLM": ("deepseek_v2", dict(_T, num_key_value_heads=4, intermediate_size=128,
                                                  moe_intermediate_size=32, num_hidden_layers=5, n_routed_experts=8,
                                                  num_experts_per_tok=2, first_k_dense_replace=1, moe_layer_freq=1,
                                                  n_shared_experts=1, q_lora_rank=32, kv_lora_rank=32,
                                                  qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                                                  rope_scaling=_YARN, topk_method="greedy", n_group=1, topk_group=1,
                                                  scoring_func="softmax")),
    "Qwen3MoeForCausalLM": ("qwen3_moe", dict(_T, intermediate_size=128, moe_intermediate_size=32,
                                              num_hidden_layers=3, num_experts=8, num_experts_per_tok=2)),
    "Qwen2MoeForCausalLM": ("qwen2_moe", dict(_T, intermediate_size=128, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32, num_hidden_layers=3, num_experts=8,
                                              num_experts_per_tok=2)),
    "MixtralForCausalLM": ("mixtral", dict(_T, intermediate_size=64, num_hidden_layers=2, num_local_experts=4,
                                           num_experts_per_tok=2)),
    "OlmoeForCausalLM": ("olmoe", dict(_T, intermediate_size=32, num_hidden_layers=2, num_experts=8,
                                       num_experts_per_tok=2)),
    "Qwen3NextForCausalLM": ("qwen3_next", dict(_T, intermediate_size=128, moe_intermediate_size=32,
                                                shared_expert_intermediate_size=32, num_hidden_layers=4,
                                                full_attention_interval=2, num_experts=8, num_experts_per_tok=2,
                                                linear_num_key_heads=2, linear_num_value_heads=4,
                                                linear_key_head_dim=16, linear_value_head_dim=16)),
    # Qwen3.5-MoE: Qwen3-Next's hybrid layers, mtp_num_hidden_layers as Qwen/Qwen3.5-35B-A3B publishes it; text-only
    # and as published (a one-block vision tower).
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe_text", dict(_QWEN35_TEXT)),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", dict(
        text_config=dict(_QWEN35_TEXT, model_type="qwen3_5_moe_text"),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=4, out_hidden_size=64,
                           patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64),
        tie_word_embeddings=False)),
    # tests/support/step3p5.py's tiny Step-3.5 (the one served with multi-layer MTP in tests/test_multi_layer_mtp.py).
    "Step3p5ForCausalLM": ("step3p5", {k: v for k, v in step3p5.config().items() if k not in ("architectures",
                                                                                               "model_type")}),
    "MiniMaxM2ForCausalLM": ("minimax_m2", dict(_T, intermediate_size=32, num_hidden_layers=3, num_local_experts=8,
                                                num_experts_per_tok=2, scoring_func="sigmoid",
                                                use_routing_bias=True, qk_norm_type="per_layer", use_qk_norm=True,
                                                rotary_dim=8)),  # as MiniMax-M2 publishes them
    # GLM-4.7-Flash: first_k_dense_replace, num_nextn_predict_layers and topk_method as zai-org/GLM-4.7-Flash
    # publishes them (keys transformers' Glm4MoeLiteConfig keeps; SGLang reads them).
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", dict(_T, num_key_value_heads=4, intermediate_size=128,
                                                     moe_intermediate_size=32, num_hidden_layers=4,
                                                     n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                                                     q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                                                     qk_rope_head_dim=16, v_head_dim=16, first_k_dense_replace=1,
                                                     num_nextn_predict_layers=1, topk_method="noaux_tc",
                                                     rope_scaling=_YARN)),
    # GLM-5 / DeepSeek-V3.2: MLA + DSA indexer; moe_layer_freq, num_nextn_predict_layers, scoring as published.
    "GlmMoeDsaForCausalLM": ("glm_moe_dsa", dict(_T, num_key_value_heads=4, intermediate_size=128,
                                                 moe_intermediate_size=32, num_hidden_layers=4, n_routed_experts=8,
                                                 num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=2,
                                                 q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                                                 qk_rope_head_dim=16, v_head_dim=16, index_topk=16, index_head_dim=128,
                                                 index_n_heads=2, num_nextn_predict_layers=1, rope_scaling=_YARN,
                                                 **_DEEPSEEK_PUBLISHED)),
    "DeepseekV32ForCausalLM": ("deepseek_v32", dict(_T, num_key_value_heads=4, intermediate_size=128,
                                                    moe_intermediate_size=32, num_hidden_layers=4, n_routed_experts=8,
                                                    num_experts_per_tok=2, n_group=4, topk_group=2,
                                                    first_k_dense_replace=1, n_shared_experts=1, q_lora_rank=32,
                                                    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                                                    v_head_dim=16, index_topk=16, index_head_dim=128, index_n_heads=2,
                                                    num_nextn_predict_layers=1, rope_scaling=_YARN,
                                                    **_DEEPSEEK_PUBLISHED)),
    # gpt-oss: sliding_window, swiglu_limit and rope_scaling (YaRN) as openai/gpt-oss-20b publishes them.
    "GptOssForCausalLM": ("gpt_oss", dict(_T, intermediate_size=32, num_hidden_layers=3, num_local_experts=8,
                                          num_experts_per_tok=2, sliding_window=128, swiglu_limit=7.0,
                                          rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                        "beta_slow": 1.0, "truncate": False,
                                                        "original_max_position_embeddings": 4096},
                                          rope_theta=150000)),
    # Llama 4: MoE every interleave_moe_layer_step-th layer (Maverick publishes 2), top-1; NoPE every 4th layer.
    "Llama4ForCausalLM": ("llama4_text", dict(_LLAMA4_TEXT)),
    "Llama4ForConditionalGeneration": ("llama4", dict(text_config=dict(_LLAMA4_TEXT, model_type="llama4_text"),
                                                      vision_config=dict(hidden_size=64, num_attention_heads=4,
                                                                         num_hidden_layers=1, intermediate_size=64,
                                                                         vision_output_dim=64, image_size=56,
                                                                         patch_size=14,
                                                                         projector_input_dim=64,
                                                                         projector_output_dim=64),
                                                      tie_word_embeddings=False)),
    # Qwen3-VL-MoE: the text model routes (mrope as Qwen/Qwen3-VL-30B-A3B publishes it); a one-block vision tower.
    "Qwen3VLMoeForConditionalGeneration": ("qwen3_vl_moe", dict(
        text_config=dict(_T, model_type="qwen3_vl_moe_text", intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                         rope_theta=5000000),
        vision_config=dict(_QWEN3_VL_VISION),
        tie_word_embeddings=False)),
    # Qwen3-Omni-MoE: the thinker's text model routes (thinker_config.text_config; interleaved M-RoPE as
    # Qwen/Qwen3-Omni-30B-A3B-Instruct spells it); one-block vision and audio towers; a talker (an MoE of its own,
    # 2 layers of 4 experts) that SGLang does not build: the layout and both module trees are the thinker's.
    "Qwen3OmniMoeForConditionalGeneration": ("qwen3_omni_moe", dict(
        thinker_config=dict(
            text_config=dict(_T, model_type="qwen3_omni_moe_text", intermediate_size=128, moe_intermediate_size=32,
                             num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                             rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "interleaved": True},
                             rope_theta=1000000),
            vision_config=dict(_QWEN3_VL_VISION),
            audio_config=dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                              output_dim=64, num_mel_bins=32, downsample_hidden_size=16, max_source_positions=64),
            tie_word_embeddings=False),
        talker_config=dict(
            text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                             num_experts=4, num_experts_per_tok=2,
                             # a published key transformers 5.19's talker text class neither defines nor defaults,
                             # yet its talker MoE block reads (its shared expert)
                             shared_expert_intermediate_size=32),
            code_predictor_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16),
            # spatial_merge_size: published, read by transformers' talker, not a field of its config class
            thinker_hidden_size=64, num_code_groups=4, spatial_merge_size=2),
        code2wav_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, codebook_size=64, num_quantizers=4, decoder_dim=32),
        enable_audio_output=True)),
    # GLM-4.5V: the text model routes (attention bias, partial M-RoPE as zai-org/GLM-4.5V publishes it); a one-block
    # vision tower.
    "Glm4vMoeForConditionalGeneration": ("glm4v_moe", dict(
        text_config=dict(_T, model_type="glm4v_moe_text", intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                         first_k_dense_replace=1, attention_bias=True, partial_rotary_factor=0.5,
                         rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2]}),  # rotary half-width 4
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=4, out_hidden_size=64,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=False)),
    # Kimi-K2.5: DeepSeek-V3's text model (one expert group, no MTP layers, as moonshotai/Kimi-K2.5 publishes it) and
    # its vision_config's published keys (vt_*, init_pos_emb_*), with the unprefixed sizes SGLang's MoonViT reads
    # (which default to the release's): a one-block tower.
    "KimiK25ForConditionalGeneration": ("kimi_k25", dict(
        text_config=dict(_T, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                         num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                         n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                         n_shared_experts=1, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                         qk_rope_head_dim=16, v_head_dim=16, num_nextn_predict_layers=0, rope_scaling=_YARN,
                         **_DEEPSEEK_PUBLISHED),
        vision_config=dict(vt_hidden_size=32, vt_intermediate_size=64, vt_num_attention_heads=2,
                           vt_num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                           num_hidden_layers=1, patch_size=14, init_pos_emb_height=8, init_pos_emb_width=8,
                           init_pos_emb_time=4, merge_kernel_size=[2, 2], mm_hidden_size=32, text_hidden_size=64),
        media_placeholder_token_id=255, tie_word_embeddings=False)),
    # Gemma-4 26B-A4B's text keys (google/gemma-4-26B-A4B-it): the MoE block on every layer beside the dense MLP,
    # 5 sliding : 1 full attention (here 1 : 1), full layers with their own head_dim and kv heads (k = v), logit
    # soft-capping; no per-layer embeddings.
    "Gemma4ForConditionalGeneration": ("gemma4", dict(
        text_config=dict(_T, model_type="gemma4_text", intermediate_size=64, moe_intermediate_size=32,
                         num_hidden_layers=4, enable_moe_block=True, num_experts=8, top_k_experts=2,
                         global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=8,
                         layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=0,
                         num_kv_shared_layers=0, use_double_wide_mlp=False, final_logit_softcapping=30.0,
                         use_bidirectional_attention="vision", hidden_activation="gelu_pytorch_tanh",
                         tie_word_embeddings=True),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, patch_size=16, position_embedding_size=64),
        audio_config=None, tie_word_embeddings=True)),
    # ERNIE-4.5-MoE: moe_layer_start_index, moe_num_shared_experts and the MTP layer count as
    # baidu/ERNIE-4.5-21B-A3B-PT publishes them.
    "Ernie4_5_MoeForCausalLM": ("ernie4_5_moe", dict(_T, intermediate_size=128, moe_intermediate_size=32,
                                                     num_hidden_layers=4, moe_num_experts=8, moe_k=2,
                                                     moe_layer_start_index=1, moe_layer_end_index=-1,
                                                     moe_layer_interval=1, moe_num_shared_experts=2, use_bias=False,
                                                     num_nextn_predict_layers=1)),
    # Granite-MoE: the multipliers as ibm-granite/granite-3.1-3b-a800m-instruct publishes them.
    "GraniteMoeForCausalLM": ("granitemoe", dict(_T, intermediate_size=32, num_hidden_layers=2, num_local_experts=8,
                                                 num_experts_per_tok=2, embedding_multiplier=12.0,
                                                 residual_multiplier=0.22, attention_multiplier=0.015625,
                                                 logits_scaling=6.0)),
    # LFM2-MoE: short-conv and attention layers (layer_types), num_dense_layers, expert bias as
    # LiquidAI/LFM2-8B-A1B publishes them.
    "Lfm2MoeForCausalLM": ("lfm2_moe", dict(_T, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4,
                                            num_experts=8, num_experts_per_tok=2, num_dense_layers=2,
                                            use_expert_bias=True, conv_L_cache=3,
                                            layer_types=["conv", "full_attention", "conv", "full_attention"])),
    # AFMoE (arcee-ai/Trinity): every key whose SGLang and transformers defaults differ given, as published
    # (layer_types, sliding_window, num_dense_layers, score_func, route_norm, ...).
    "AfmoeForCausalLM": ("afmoe", dict(_T, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4,
                                       num_experts=8, num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1,
                                       score_func="sigmoid", route_norm=True, route_scale=2.826, n_group=1,
                                       topk_group=1, global_attn_every_n_layers=2, sliding_window=64,
                                       layer_types=["sliding_attention", "full_attention"] * 2, mup_enabled=True,
                                       rope_theta=10000)),
    # Nemotron-3-Nano: its blocks as hybrid_override_pattern, Mamba-2 and MoE keys as
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 publishes them (n_groups 8, conv_kernel, chunk_size, sigmoid router
    # with one group, routed_scaling_factor, one shared expert; num_hidden_layers beside the pattern), one MLP block
    # ('-', which the release has none of) so that every block kind is built, and Nemotron-3-Ultra's MTP head (one
    # MTP layer of an attention and a MoE block: its draft, NemotronHForCausalLMMTP, built and checked too).
    "NemotronHForCausalLM": ("nemotron_h", dict(_NEMOTRON_H, hybrid_override_pattern="ME*EM-E", num_hidden_layers=7,
                                                num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E")),
    # Intern-S1: Qwen3-MoE's text model (its architecture named in text_config, as internlm/Intern-S1 publishes it,
    # interns1.py picks its language model by it) and a one-layer InternViT tower with the vision keys SGLang reads;
    # its config class is the release's own code (here the stand-in, tests/family_specs/published.py STAND_INS).
    "InternS1ForConditionalGeneration": ("interns1", dict(
        text_config=dict(_T, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], intermediate_size=128,
                         moe_intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=[28, 28], patch_size=[14, 14], dropout=0.0, drop_path_rate=0.0,
                           initializer_factor=0.1),
        tie_word_embeddings=False)),
    # Ling / Ring 2.0: the keys inclusionAI/Ling-mini-2.0 publishes (model_type bailing_moe, sigmoid router over an
    # expert bias in float32, grouped top-k, one shared expert, half RoPE, QK norm, one NextN layer); its config class
    # is the release's own code (here the stand-in, tests/family_specs/published.py STAND_INS).
    "BailingMoeV2ForCausalLM": ("bailing_moe", dict(
        _T, intermediate_size=128, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
        num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=2,
        num_shared_experts=1, norm_topk_prob=True, score_function="sigmoid", moe_router_enable_expert_bias=True,
        router_dtype="fp32", routed_scaling_factor=2.5, partial_rotary_factor=0.5, use_qk_norm=True,
        use_qkv_bias=False, use_bias=False, num_nextn_predict_layers=1)),
    "MiMoForCausalLM": ("qwen2", dict(_T, intermediate_size=64, num_hidden_layers=2, num_nextn_predict_layers=1)),
}
# Where SGLang builds its own config class and transformers' differently-spelled one is not read as the same model
# by the config view (which follows SGLang's): the row says so instead of comparing fingerprints.
TRANSFORMERS_CONFIG_NOT_UNIFIED: Dict[str, str] = {
    "Step3p5ForCausalLM": "transformers' Step3p7TextConfig (model_type step3p5) spells per-layer RoPE and attention "
                          "groups otherwise than SGLang's configs/step3p5.py, which sglang-r3 reads",
}

MOE_MARKERS = ("TopK(", "FusedMoE", "get_moe_impl_class")


def sglang_models_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang.srt.models")
    return Path(list(spec.submodule_search_locations)[0])


def _entry_classes(tree: ast.Module) -> List[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
            v = node.value
            elts = v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]
            return [e.id for e in elts if isinstance(e, ast.Name)]
    return []


def registry_entries() -> Dict[str, Dict[str, Any]]:
    """Every EntryClass of every module SGLang's registry imports (models/registry.py ``import_model_classes``
    walks ``sglang.srt.models``), with whether its module builds MoE routers."""
    root = sglang_models_dir()
    sources = {p.stem: p.read_text() for p in sorted(root.rglob("*.py"))}
    out: Dict[str, Dict[str, Any]] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        entries = _entry_classes(tree)
        if not entries:
            continue
        mod = ".".join(path.relative_to(root).with_suffix("").parts)
        via = [m for m in MOE_MARKERS if m in text]
        if not via:  # MoE blocks imported from another model module
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang.srt.models."):
                    other = node.module.rsplit(".", 1)[1]
                    if any(m in sources.get(other, "") for m in MOE_MARKERS):
                        via = [f"imports {node.module}"]
                        break
        for name in entries:
            out.setdefault(name, {"module": mod, "moe_source": via})
    return out


# ---------------------------------------------------------------------------------------------------------
# Building


def init_runtime() -> None:
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():
        activate_cpu_runtime()
        # What a server's processes install before SGLang's registry imports its models (the *_cpu ops Qwen3.5's
        # module reads at import, the device-module answer Qwen3-Next's layers are built with): the same module tree.
        from sglang_r3.cpu_runtime import install_cpu_patches

        install_cpu_patches()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.test.test_utils import publish_build_topology

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    publish_build_topology(tp_size=1, ep_size=1, pp_size=1, device="cpu")
    initialize_model_parallel(backend="gloo")


def config_object(arch: str, model_type: str, values: Dict[str, Any]):
    """The config object SGLang's loader would build from a config.json of these values (its own class for
    the model types it registers, else transformers')."""
    import transformers
    from sglang.srt.utils.hf_transformers import common

    cls = (common._CONFIG_REGISTRY.get(model_type) or _stand_in_config(model_type)
           or transformers.CONFIG_MAPPING[model_type])
    cfg = cls(**copy.deepcopy(values))
    cfg.architectures = [arch]
    # ModelConfig (configs/model_config.py) sets these on every config it loads (defaults: both off); Kimi-K2.5's
    # model reads them.
    cfg.encoder_only = cfg.language_only = False
    # get_config (hf_transformers/config.py) copies a wrapper's text-config values its top level lacks onto it:
    # GLM-4.5V's model reads config.vocab_size and the like from the top level.
    text = common.get_hf_text_config(cfg)
    if text is not None and text is not cfg:
        for key, value in vars(text).items():
            if not hasattr(cfg, key) and value is not None:
                setattr(cfg, key, value)
    # and flattens Gemma-4's per-layer attention shapes (full-attention head_dim / kv heads, swa_* beside them)
    from sglang.srt.utils.hf_transformers import config as loader

    if model_type in loader._GEMMA4_MODEL_TYPES:
        loader._apply_gemma4_attention_overrides(cfg)
    return cfg


def _stand_in_config(model_type: str):
    """The stand-in for a release's own config class (tests/family_specs/published.py STAND_INS), else None."""
    from tests.family_specs.published import STAND_INS

    return STAND_INS[model_type].load() if model_type in STAND_INS else None


# Architectures whose build reads a tensor's value (which the meta device has none of): built on the CPU, tiny.
BUILT_ON_CPU = {"InternS1ForConditionalGeneration": "internvl.py's InternVisionEncoder reads its drop-path rates "
                                                    "with .item()"}


def build_sglang(arch: str, cfg, draft: bool = False):
    """SGLang's model class for ``arch`` built on the meta device (on the CPU where ``BUILT_ON_CPU`` says why), as its
    model runner builds it at tp=1 on this host (the CPU runner's head adjustment first; a draft inside SGLang's
    draft build scope)."""
    import contextlib

    import torch
    from sglang.srt.configs.update_config import adjust_tp_num_heads_if_necessary
    from sglang.srt.layers.moe.utils import draft_model_build_scope
    from sglang.srt.models.registry import ModelRegistry

    from sglang_r3.dev.cpu import has_gpu

    if not has_gpu():  # configs/update_config.py: the config, and its text_config where it has one
        adjust_tp_num_heads_if_necessary(cfg, 1, is_post_update=True)
        if hasattr(cfg, "text_config"):
            adjust_tp_num_heads_if_necessary(cfg.text_config, 1, is_post_update=True)
    cls = ModelRegistry.models[arch]
    device = "cpu" if arch in BUILT_ON_CPU else "meta"
    with torch.device(device), (draft_model_build_scope() if draft else contextlib.nullcontext()):
        return cls(config=cfg, quant_config=None)


def draft_architecture(cfg) -> Optional[str]:
    """The draft architecture SGLang's own ModelConfig picks for this target (None: it picks none)."""
    from sglang.srt.configs.model_config import ModelConfig

    c = copy.deepcopy(cfg)
    stub = SimpleNamespace(is_draft_model=True, hf_config=c, hf_text_config=getattr(c, "text_config", c),
                           speculative_algorithm="EAGLE", is_draft_quantization_explicit=False, quantization=None)
    arch = cfg.architectures[0]
    ModelConfig._config_draft_model(stub)
    new = stub.hf_config.architectures[0]
    return (new, stub.hf_config) if new != arch else None


def transformers_config(arch: str, model_type: str, values: Dict[str, Any]):
    """transformers' own config class for this model type built from the values (None: it has none)."""
    import transformers

    from tests.family_specs.published import STAND_INS

    if model_type in STAND_INS and STAND_INS[model_type].renames is None:
        return None  # a release's own class that renames none of transformers' (Ling 2.0)
    try:
        cls = transformers.CONFIG_MAPPING[STAND_INS[model_type].renames if model_type in STAND_INS else model_type]
    except KeyError:
        return None
    cfg = cls(**copy.deepcopy(values))
    cfg.architectures = [arch]
    return cfg


def transformers_moe_layers(arch: str, cfg) -> Optional[List[int]]:
    """Decoder layer ids whose block holds experts in transformers' own module tree (None: no such class)."""
    import torch
    import transformers

    from tests.family_specs.published import TRANSFORMERS_CLASS

    cls = getattr(transformers, TRANSFORMERS_CLASS.get(arch, arch), None)
    if cls is None or cfg is None:
        return None
    with torch.device("meta"):
        model = cls(copy.deepcopy(cfg))
    layers = None
    lists = [(n, m) for n, m in model.named_modules() if n.endswith("layers") and isinstance(m, torch.nn.ModuleList)]
    # a multimodal wrapper: the language model's decoder layers, not the vision tower's
    # (Qwen3-Omni-MoE: the thinker's, thinker.model; its talker's MoE layers SGLang does not build)
    text = [(n, m) for n, m in lists if "language_model" in n or "text" in n or n == "thinker.model.layers"]
    layers = (text or lists)[0][1]
    out = []
    for i, layer in enumerate(layers):
        if any(type(s).__name__.endswith(("Experts", "SparseMoeBlock", "MoE", "Moe")) or hasattr(s, "experts")
               for s in layer.modules()):
            out.append(i)
    return out


# ---------------------------------------------------------------------------------------------------------
# One architecture


def prove(arch: str) -> Dict[str, Any]:
    from sglang_r3.core.families import family_of
    from sglang_r3.core.layout import layout_from_hf_config
    from sglang_r3.serving.adapter import served_layout

    model_type, values = SPECS[arch]
    cfg = config_object(arch, model_type, values)
    layout = layout_from_hf_config(cfg)
    trainer = layout_from_hf_config(json.loads(cfg.to_json_string()))  # the config.json it saves, no SGLang
    assert trainer == layout and trainer.fingerprint == layout.fingerprint, (trainer, layout)

    model = build_sglang(arch, cfg)
    routers = served_layout.check_main(model, layout)
    main = sorted(routers)
    how = [f"SGLang module tree: routers at {_ranges(main)} of {layout.num_hidden_layers} layers, "
           f"top-{layout.topk} of {layout.num_experts}", _head_check(arch, model_type, values)]
    if any(r.num_experts is None for r in routers.values()):
        raise AssertionError(f"{arch}: a router without FusedMoE experts: {routers}")
    draft = draft_architecture(cfg)  # (a target without MTP layers may still name one: a separate EAGLE draft's)
    drafts = {"draft": draft[0]} if draft else {}
    if layout.mtp_layers:
        fam = family_of(arch)
        if draft is None:
            raise AssertionError(f"{arch}: the layout has MTP layers but SGLang picks no draft architecture")
        draft_arch, draft_cfg = draft
        dmodel = build_sglang(draft_arch, draft_cfg, draft=True)
        drouters = served_layout.routers_of(dmodel)
        served_layout.check_draft(drouters, layout)
        if any(r.capture for r in drouters.values()):
            raise AssertionError(f"{draft_arch}: draft routers allowed to write main rows")
        want = sum(1 for l in layout.mtp_layers if l.has_router)
        if fam.mtp == "nextn" and len(drouters) != min(want, 1) and len(drouters) != want:
            raise AssertionError(f"{draft_arch}: {len(drouters)} routers, layout MTP routed layers: {want}")
        how.append(f"draft {draft_arch}: {len(drouters)} MTP router(s)"
                   + (f" top-{layout.mtp_layers[0].topk}" if drouters else " (dense MTP)"))
        drafts["draft_built"] = how[-1]
    # transformers' own config class for the model type (SGLang may build another: DeepSeek-V3.2's is a V3
    # alias), and what its save_pretrained writes: the same layout and fingerprint.
    hf_cfg = transformers_config(arch, model_type, values)
    if hf_cfg is not None and arch in TRANSFORMERS_CONFIG_NOT_UNIFIED:
        how.append(f"transformers' config class not compared: {TRANSFORMERS_CONFIG_NOT_UNIFIED[arch]}")
    elif hf_cfg is not None:
        for spelled in (hf_cfg, json.loads(hf_cfg.to_json_string())):
            other = layout_from_hf_config(spelled)
            assert other == layout and other.fingerprint == layout.fingerprint, (arch, other, layout)
    hf = transformers_moe_layers(arch, hf_cfg)
    if hf is not None:
        if hf != list(layout.moe_layer_ids):
            raise AssertionError(f"{arch}: transformers' module tree has experts in layers {hf}, "
                                 f"the layout in {list(layout.moe_layer_ids)}")
        how.append("transformers module tree: same MoE layers")
    return {"layout": layout.summary(), "proven": "; ".join(how), "fingerprint": layout.fingerprint, **drafts}


# Heads SGLang ties at load rather than in the module tree (invisible on the meta device): arch -> where.
TIES_AT_LOAD = {"Lfm2MoeForCausalLM": "lfm2_moe.py load_weights copies embed_tokens.weight into lm_head when the "
                                      "checkpoint holds no lm_head.weight"}


def _head_check(arch: str, model_type: str, values: Dict[str, Any]) -> str:
    """SGLang's model built with tie_word_embeddings true (the wrapper's text config too): its lm_head is the
    embedding (one parameter) unless the architecture is in UNTIED_HEAD_ARCHITECTURES, refused tied at start-up."""
    from sglang_r3.core.families import UNTIED_HEAD_ARCHITECTURES

    tied = copy.deepcopy(values)
    tied["tie_word_embeddings"] = True
    if isinstance(tied.get("text_config"), dict):
        tied["text_config"]["tie_word_embeddings"] = True
    model = build_sglang(arch, config_object(arch, model_type, tied))
    own = {n for n, _ in model.named_parameters()}  # a tied head is the embedding's parameter, listed once
    heads = [n for n, _ in model.named_parameters(remove_duplicate=False) if n.endswith("lm_head.weight")]
    untied = any(h in own for h in heads)
    if arch in TIES_AT_LOAD:
        return f"lm_head tied at load ({TIES_AT_LOAD[arch]})"
    if untied != (arch in UNTIED_HEAD_ARCHITECTURES):
        raise AssertionError(f"{arch}: SGLang built its lm_head {'untied' if untied else 'tied'} with "
                             f"tie_word_embeddings true; UNTIED_HEAD_ARCHITECTURES says otherwise")
    return "lm_head never tied: tie_word_embeddings true refused" if untied else "lm_head tied as the config says"


def _ranges(ids: List[int]) -> str:
    if not ids:
        return "none"
    out, start, prev = [], ids[0], ids[0]
    for i in ids[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def refusal(arch: str) -> str:
    from sglang_r3.core.layout import LayoutError, layout_from_hf_config

    try:
        layout_from_hf_config({"architectures": [arch], "num_hidden_layers": 2})
    except LayoutError as e:
        msg = str(e)
        if arch not in msg:
            raise AssertionError(f"{arch}: the refusal does not name the architecture: {msg}")
        return msg.split("; supported:")[0]
    raise AssertionError(f"{arch}: has no rule but is not refused")


def loader_substitutions(archs: List[str]) -> Dict[str, List[tuple]]:
    """substitute -> [(the checkpoint's architecture, quantization)]: where SGLang's loader
    (``model_loader/utils.py`` ``get_model_architecture``) builds another registered class than the one the config
    names (``QuantMixtralForCausalLM`` for a Mixtral quantized by a method its MoE layers do not take), found by
    asking the loader itself for every architecture with every quantization method SGLang registers, and none."""
    from sglang.srt.configs.model_config import ModelImpl
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.model_loader.utils import get_model_architecture

    out: Dict[str, List[tuple]] = {}
    for arch in archs:
        for quant in [None, *QUANTIZATION_METHODS]:
            stub = SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch]), quantization=quant,
                                   model_impl=ModelImpl.AUTO, is_embedding_gemma=False)
            _, resolved = get_model_architecture(stub)
            if resolved != arch:
                out.setdefault(resolved, []).append((arch, quant))
    return out


def prove_substitute(arch: str, originals: List[tuple]) -> Dict[str, Any]:
    """A class SGLang's loader builds in place of the checkpoint's architecture: start-up computes the layout from
    the checkpoint's config (the original's rule, or its refusal), then checks the routers of the model SGLang built
    (``served_layout.check_main``), here the substitute built on the meta device from the original's tiny config."""
    from sglang_r3.core.families import family_of
    from sglang_r3.core.layout import layout_from_hf_config
    from sglang_r3.serving.adapter import served_layout

    by_original: Dict[str, List[str]] = {}
    for original, quant in originals:
        by_original.setdefault(original, []).append(str(quant))
    reasons, proofs, families = [], [], []
    for original, quants in sorted(by_original.items()):
        when = f"SGLang's loader builds {arch} for {original} checkpoints quantized with {', '.join(quants)}"
        fam = family_of(original)
        if fam is None or fam.rule is None:
            reasons.append(f"{when}; {refusal(original)}")
            continue
        if original not in SPECS:
            raise AssertionError(f"{arch}: substitutes {original}, which has a rule but no tiny config here")
        model_type, values = SPECS[original]
        cfg = config_object(original, model_type, values)
        layout = layout_from_hf_config(cfg)
        model = build_sglang(arch, cfg)
        try:
            routers = served_layout.check_main(model, layout)
        except served_layout.LayoutMismatch as e:
            reasons.append(f"{when}; start-up refuses that model: {e}")
            continue
        proofs.append(f"{when}: SGLang module tree: routers at {_ranges(sorted(routers))}, as {original}'s layout")
        families.append(fam.name)
    if reasons:
        return {"status": "refused", "reason": "; ".join(reasons)}
    return {"status": "rule", "family": ", ".join(families), "layout": "the layout of the checkpoint's architecture",
            "proven": "; ".join(proofs), "fingerprint": ""}


def sweep(only: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    from sglang_r3.core.families import family_of

    init_runtime()
    from sglang.srt.models.registry import ModelRegistry

    entries = registry_entries()
    rows = []
    for arch, info in sorted(entries.items()):
        fam = family_of(arch)
        has_rule = fam is not None and fam.rule is not None
        if not info["moe_source"] and not has_rule:
            continue
        if only and arch not in only:
            continue
        row = {"architecture": arch, "module": info["module"], "moe_source": info["moe_source"],
               "family": fam.name if fam else "", "importable": arch in ModelRegistry.models}
        try:
            if has_rule:
                if arch not in SPECS:
                    raise AssertionError(
                        f"{arch} has a layout rule but no tiny config in tests/scripts/sweep.py: unproven")
                row.update(prove(arch), status="rule")
            else:
                row.update(status="refused", reason=refusal(arch))
        except Exception as e:  # noqa: BLE001 -- a row that failed says why; the test fails on it
            row.update(status="error", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
        rows.append(row)
    # Draft classes (SGLang's own pick for a target under EAGLE / MTP, ModelConfig._config_draft_model): refused as a
    # model's own architecture like any class without a rule, and named as the draft of their targets.
    for r in rows:
        r["draft_of"] = sorted(t["architecture"] for t in rows if t.get("draft") == r["architecture"])
    # Classes the loader builds in place of a listed architecture (their modules need not look MoE).
    listed = {r["architecture"] for r in rows}
    for arch, originals in sorted(loader_substitutions(sorted(ModelRegistry.models)).items()):
        if arch in listed or (only and arch not in only):
            continue
        row = {"architecture": arch, "module": entries.get(arch, {}).get("module", ""),
               "moe_source": [f"built by SGLang's loader for {o} (quantization {q})" for o, q in originals],
               "family": "", "importable": arch in ModelRegistry.models}
        try:
            row.update(prove_substitute(arch, originals))
        except Exception as e:  # noqa: BLE001
            row.update(status="error", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
        rows.append(row)
    return sorted(rows, key=lambda r: r["architecture"])


def served_forwards() -> Dict[str, str]:
    """architecture -> its served-forward oracle in tests/test_families.py (a tiny checkpoint saved by transformers'
    class, served on the CPU runtime, rows = transformers' router top-k)."""
    from tests.family_specs.published import architecture_of
    from tests.family_specs.specs import SPECS

    out: Dict[str, str] = {}
    for f in SPECS.values():
        if not f.not_served:
            arch = architecture_of(f)
            out[arch] = f"{out[arch]}, {f.name}" if arch in out else f.name
    return out


def _as_draft(target: Dict[str, Any]) -> str:
    """How a draft class is proven as its target's: built from the target's tiny config as SGLang's draft and checked
    against the target's MTP layers, or not checked where the target's layout has none."""
    if target.get("draft_built"):
        return (f"`{target['architecture']}` (its MTP layers): built so from that tiny config, "
                f"{target['draft_built'].split(': ', 1)[1]}, checked against its layout's MTP layers (its row)")
    return (f"`{target['architecture']}` under EAGLE, from a separate draft checkpoint: that target's tiny config "
            "has no MTP layers, so start-up checks none of such a draft's routers and the record holds no MTP section "
            "for it (draft routing is never replayed; a checkpoint with MTP layers of its own: its row); not served "
            "here")


def markdown(rows: List[Dict[str, Any]]) -> str:
    lines = ["| architecture (SGLang module) | sglang-r3 | layout, and how it is proven / why refused |",
             "|---|---|---|"]
    served = served_forwards()
    by_arch = {r["architecture"]: r for r in rows}
    for r in rows:
        name = f"`{r['architecture']}` (`{r['module']}`)"
        if r["status"] == "rule":
            forward = (f"; served forward: `tests/test_families.py` ({served[r['architecture']]})"
                       if r["architecture"] in served else "")
            lines.append(f"| {name} | captured ({r['family']}) | {r['layout']}. {r['proven']}{forward} |")
        elif r["status"] == "refused" and r.get("draft_of"):
            lines.append(f"| {name} | draft of {', '.join(f'`{t}`' for t in r['draft_of'])} (refused as a model) | "
                         f"{r['reason']}. SGLang builds it as the draft of "
                         + "; ".join(_as_draft(by_arch[t]) for t in r["draft_of"]) + " |")
        elif r["status"] == "refused":
            lines.append(f"| {name} | refused at start-up | {r['reason']} |")
        else:
            lines.append(f"| {name} | ERROR | {r['error']} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    out = None
    only = None
    if "--json" in argv:
        out = argv[argv.index("--json") + 1]
    if "--only" in argv:
        only = argv[argv.index("--only") + 1].split(",")
    rows = sweep(only)
    text = json.dumps(rows, indent=1, sort_keys=True)
    if out:
        Path(out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
