"""The family table of docs/models.md, generated: one row per family of the registry (sglang_r3/core/families/)
with a layout rule, and one per architecture that slime's, Miles' or verl's example scripts train; per row the
scripts that train it and how it is proven, derived from the tests that prove it (tests/family_specs/'s served
forwards and their MTP-speculation servers, the two other served-forward tests named in OTHER_FORWARDS, the sweep
for every rule) or the reason it is refused.

``python -m tests.test_sweep`` rewrites the table; ``python -m tests.generators.family_table --check slime=DIR miles=DIR
verl=DIR`` reads every script below from checkouts of those repositories (at the commits in REPOS) and fails
unless each names the model it is listed with.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

# framework -> (GitHub repository, the commit the scripts were read at)
REPOS: Dict[str, Tuple[str, str]] = {
    "slime": ("THUDM/slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515"),
    "Miles": ("radixark/miles", "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"),
    "verl": ("volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7"),
}


@dataclass(frozen=True)
class Script:
    framework: str
    path: str
    model: str  # the published model the script trains
    architecture: str  # that model's config.json "architectures"[0]; "" where the script does not say which
    evidence: str  # text the script contains that ties it to the model (checked by --check)
    # config keys the script gives its model where they decide what start-up does with it (the family's tiny sweep
    # config with these keys is put to the layout rule: the table says what start-up does, not what we hope)
    published: Tuple[Tuple[str, Any], ...] = ()


S, M, V = "slime", "Miles", "verl"
TRAINED_BY: Tuple[Script, ...] = (
    # slime: its run scripts name the Hub checkpoint; scripts/models/*.sh hold the Megatron shapes.
    Script(S, "scripts/run-glm4.7-355B-A32B.sh", "GLM-4.7", "Glm4MoeForCausalLM", "GLM-4.7-355B-A32B"),
    Script(S, "scripts/models/glm4.5-355B-A32B.sh", "GLM-4.5", "Glm4MoeForCausalLM", "--num-experts 160"),
    Script(S, "scripts/models/glm4.5-106B-A12B.sh", "GLM-4.5-Air", "Glm4MoeForCausalLM", "--num-experts 128"),
    Script(S, "scripts/run-glm4.7-30B-A3B.sh", "GLM-4.7-Flash", "Glm4MoeLiteForCausalLM", "GLM-4.7-Flash"),
    Script(S, "scripts/run-glm5-744B-A40B.sh", "GLM-5", "GlmMoeDsaForCausalLM", "GLM-5"),
    Script(S, "scripts/run-glm5.2-744B-A40B.sh", "GLM-5.2", "GlmMoeDsaForCausalLM", "GLM-5.2"),
    Script(S, "scripts/run-deepseek-r1.sh", "DeepSeek-R1", "DeepseekV3ForCausalLM", "DeepSeek-R1"),
    Script(S, "scripts/run-kimi-k2-Instruct.sh", "Kimi-K2-Instruct", "DeepseekV3ForCausalLM", "Kimi-K2-Instruct"),
    Script(S, "scripts/run-kimi-k2-Thinking.sh", "Kimi-K2-Thinking", "DeepseekV3ForCausalLM", "Kimi-K2-Thinking"),
    Script(S, "scripts/run-moonlight-16B-A3B.sh", "Moonlight-16B-A3B", "DeepseekV3ForCausalLM", "Moonlight-16B-A3B"),
    Script(S, "scripts/run-minimax-m2.sh", "MiniMax-M2.5", "MiniMaxM2ForCausalLM", "MiniMax-M2.5"),
    Script(S, "scripts/run-qwen3-30B-A3B.sh", "Qwen3-30B-A3B", "Qwen3MoeForCausalLM", "Qwen3-30B-A3B"),
    Script(S, "scripts/run-qwen3-235B-A22B.sh", "Qwen3-235B-A22B", "Qwen3MoeForCausalLM", "Qwen3-235B-A22B"),
    Script(S, "scripts/run-qwen3-next-80B-A3B.sh", "Qwen3-Next-80B-A3B-Thinking", "Qwen3NextForCausalLM",
           "Qwen3-Next-80B-A3B-Thinking"),
    Script(S, "scripts/run-qwen3.5-35B-A3B-sft.sh", "Qwen3.5-35B-A3B", "Qwen3_5MoeForConditionalGeneration",
           "Qwen3.5-35B-A3B"),
    Script(S, "scripts/models/qwen3.5-35B-A3B-vl.sh", "Qwen3.5-35B-A3B (vision)",
           "Qwen3_5MoeForConditionalGeneration", "qwen3.5-35B-A3B"),
    Script(S, "examples/coding_agent_rl/run_qwen36_35b_a3b_swe_8nodes.sh", "Qwen3.6-35B-A3B",
           "Qwen3_5MoeForConditionalGeneration", "Qwen3.6-35B-A3B"),
    Script(S, "scripts/run-mimo-7B-rl-eagle.sh", "MiMo-7B-RL", "MiMoForCausalLM", "MiMo-7B-RL"),
    # Miles: scripts/models/*.py hold the Megatron shapes, one file per published model.
    Script(M, "scripts/models/glm4.5-355B-A32B.py", "GLM-4.5", "Glm4MoeForCausalLM", "--num-experts"),
    Script(M, "scripts/models/glm4.7-flash.py", "GLM-4.7-Flash", "Glm4MoeLiteForCausalLM", "--q-lora-rank"),
    Script(M, "scripts/models/glm5-744B-A40B.py", "GLM-5", "GlmMoeDsaForCausalLM", "--num-experts"),
    Script(M, "scripts/models/glm5.1-744B-A40B_lora.py", "GLM-5.1", "GlmMoeDsaForCausalLM", "--num-experts"),
    Script(M, "scripts/models/glm5.2-744B-A40B.py", "GLM-5.2", "GlmMoeDsaForCausalLM", "--num-experts"),
    Script(M, "scripts/models/deepseek-v3.py", "DeepSeek-V3", "DeepseekV3ForCausalLM", "--num-experts"),
    Script(M, "scripts/models/kimi-k2.py", "Kimi-K2", "DeepseekV3ForCausalLM", "--num-experts"),
    Script(M, "scripts/models/deepseek-v32.py", "DeepSeek-V3.2", "DeepseekV32ForCausalLM", "--num-experts"),
    Script(M, "scripts/models/deepseek-v4-flash.py", "DeepSeek-V4-Flash", "DeepseekV4ForCausalLM", "--num-experts"),
    Script(M, "scripts/models/kimi-k25.py", "Kimi-K2.5", "KimiK25ForConditionalGeneration", "kimi-k2-thinking"),
    Script(M, "scripts/models/gpt-oss-20b.py", "gpt-oss-20b", "GptOssForCausalLM", "--num-experts"),
    Script(M, "scripts/models/qwen3-30B-A3B.py", "Qwen3-30B-A3B", "Qwen3MoeForCausalLM", "--num-experts"),
    Script(M, "scripts/models/qwen3-next-80B-A3B.py", "Qwen3-Next-80B-A3B", "Qwen3NextForCausalLM", "--num-experts"),
    Script(M, "scripts/models/qwen3.5-35B-A3B.py", "Qwen3.5-35B-A3B", "Qwen3_5MoeForConditionalGeneration",
           "--num-experts"),
    Script(M, "scripts/models/qwen3.6-35B-A3B.py", "Qwen3.6-35B-A3B", "Qwen3_5MoeForConditionalGeneration",
           "same architecture as qwen3.5"),
    Script(M, "scripts/models/gemma-4-26b-a4b-it.py", "Gemma-4-26B-A4B", "Gemma4ForConditionalGeneration",
           "--num-experts"),
    Script(M, "scripts/models/nemotron-3-nano-30b-a3b.py", "Nemotron-3-Nano-30B-A3B", "NemotronHForCausalLM",
           "--num-experts"),
    # Nemotron-3-Super / Ultra: Nemotron-H with latent MoE projections (and Ultra's MTP head), as their scripts say
    Script(M, "scripts/models/nemotron-3-super-120b-a12b.py", "Nemotron-3-Super-120B-A12B", "NemotronHForCausalLM",
           "--moe-latent-size 1024", published=(("moe_latent_size", 1024),)),
    Script(M, "scripts/models/nemotron-3-ultra-550b-a55b.py", "Nemotron-3-Ultra-550B-A55B", "NemotronHForCausalLM",
           "num_nextn_predict_layers=1", published=(("moe_latent_size", 2048), ("num_nextn_predict_layers", 1))),
    Script(M, "scripts/models/deepseek-v4-pro.py", "DeepSeek-V4-Pro", "DeepseekV4ForCausalLM", "--num-experts"),
    Script(M, "scripts/models/inkling-small.py", "Inkling-Small", "InklingForConditionalGeneration", "Inkling-Small"),
    Script(M, "scripts/models/kimi-k2-thinking.py", "Kimi-K2-Thinking", "DeepseekV3ForCausalLM", "--num-experts"),
    Script(M, "scripts/models/glm4.5-106B-A12B.py", "GLM-4.5-Air", "Glm4MoeForCausalLM", "--num-experts"),
    Script(M, "scripts/models/qwen3-235B-A22B.py", "Qwen3-235B-A22B", "Qwen3MoeForCausalLM", "--num-experts"),
    # Inkling: the script's model provider is Miles' miles_plugins.models.inkling, the model SGLang serves as
    # InklingForConditionalGeneration (inkling.py; InklingModelConfig's vocab_size, 201024, is the script's).
    Script(M, "scripts/models/inkling.py", "Inkling", "InklingForConditionalGeneration",
           "miles_plugins.models.inkling"),
    # JoyAI-LLM-Flash: a DeepseekV3ForCausalLM (radixark/miles issue 606) under its own model type, joyai_llm_flash
    # (miles_plugins/mbridge/joyai_llm_flash.py, a DeepseekV3Bridge).
    Script(M, "scripts/models/joyai-llm-flash.py", "JoyAI-LLM-Flash", "DeepseekV3ForCausalLM", "--num-experts"),
    # verl: its example scripts name the Hub checkpoint.
    Script(V, "examples/grpo_trainer/run_deepseek671b_math_megatron_80gb.sh", "DeepSeek-V3-0324",
           "DeepseekV3ForCausalLM", "deepseek-ai/DeepSeek-V3-0324"),
    Script(V, "examples/grpo_trainer/run_moonlight16b_math_megatron.sh", "Moonlight-16B-A3B",
           "DeepseekV3ForCausalLM", "moonshotai/Moonlight-16B-A3B"),
    Script(V, "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh", "Qwen3-30B-A3B-Base", "Qwen3MoeForCausalLM",
           "Qwen/Qwen3-30B-A3B-Base"),
    Script(V, "examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh", "Qwen3-235B-A22B", "Qwen3MoeForCausalLM",
           "Qwen3-235B-A22B"),
    Script(V, "examples/grpo_trainer/run_gptoss_20b.sh", "gpt-oss-20b", "GptOssForCausalLM", "openai/gpt-oss-20b"),
    Script(V, "examples/grpo_trainer/run_qwen3_vl-30b-megatron.sh", "Qwen3-VL-30B-A3B-Instruct",
           "Qwen3VLMoeForConditionalGeneration", "Qwen3-VL-30B-A3B-Instruct"),
    Script(V, "examples/ppo_trainer/run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh", "Qwen1.5-MoE-A2.7B-Chat",
           "Qwen2MoeForCausalLM", "Qwen/Qwen1.5-MoE-A2.7B-Chat"),
)

# What else is known of a model no script names an architecture for.
UNMAPPED_WHY: Dict[str, str] = {}

# Served-forward proofs outside tests/family_specs/: architecture -> (test file, what it shows).
OTHER_FORWARDS: Dict[str, Tuple[str, str]] = {
    "Glm4MoeForCausalLM": ("tests/test_speculative.py",
                           "the embedded model (GLM-4.7 layout, NextN MTP) with MTP speculation on: main rows = "
                           "spec-off rows, MTP section tagged"),
    "Step3p5ForCausalLM": ("tests/test_multi_layer_mtp.py",
                           "SGLang's own MultiLayerEagleWorkerV2 with 3 MTP layers: main rows and upstream's "
                           "routed_experts = spec-off rows, MTP section tagged by depth (its MTP layers: transformers' "
                           "Step3p7 class builds none to compare with)"),
}

# tests/family_specs/specs.py checkpoints built but not served on the CPU runtime: test name -> the SGLang call that
# stops it
# (the test test_families_not_served_on_cpu_stop_where_the_docstring_says checks the error each one raises).
NOT_SERVED_WHY: Dict[str, str] = {
    "glm4_moe_lite_no_q_lora": "`q_lora_rank: null` refused at start-up: SGLang's glm4_moe_lite.py load_weights never "
                               "loads self_attn.q_proj",
    "minimax_m2_no_routing_bias": "`use_routing_bias` not true refused at start-up: SGLang's minimax_m2.py then "
                                  "drops the checkpoint's selection bias, transformers adds it",
    "minimax_m2_rope_factor_only": "partial RoPE given as `partial_rotary_factor` alone refused at start-up: "
                                   "SGLang's minimax_m2.py rotates `rotary_dim` dims (the whole head without it)",
    "llama4_text": "text-only `Llama4ForCausalLM` checkpoints refused at start-up (SGLang's llama4.py skips the "
                   "q/k RoPE permutation)",
    "gemma4_published_shapes": "on the CPU runtime, sliding and full-attention layers whose KV head shapes differ "
                               "(as published) refused at start-up: its one KV pool holds one shape (a GPU serves "
                               "them with SGLang's hybrid SWA pool)",
    "qwen3_vl_moe_transformers_save": "a transformers 5.19 `save_pretrained` (its own fused-expert layout, not the "
                                      "Hub's) stops SGLang's `qwen3_vl_moe.py` `load_fused_expert_weights` at load "
                                      "(a size mismatch); the Hub layout is served",
    # Config-space flips SGLang 0.5.23 builds otherwise (tests/family_specs/specs.py REFUSED_FLIPS)
    "qwen3_moe_mlp_only_layers": "`mlp_only_layers` / `decoder_sparse_step` that make layers dense refused at "
                                 "start-up: SGLang's qwen3_moe.py builds every layer MoE",
    "qwen3_moe_sliding_window": "`use_sliding_window: true` with a `sliding_window` shorter than the context "
                                "refused at start-up (Qwen2-MoE too): SGLang's qwen3_moe.py reads neither key and "
                                "attends to every key, transformers windows every layer",
    "step3p5_query_pre_attn_scalar": "`query_pre_attn_scalar` ≠ `head_dim` refused at start-up: SGLang's step3p5.py "
                                     "scales attention scores by `head_dim ** -0.5`, transformers' Step3p7 by "
                                     "`query_pre_attn_scalar ** -0.5`",
    "mixtral_head_dim": "`head_dim` ≠ `hidden_size // num_attention_heads` refused at start-up: SGLang's mixtral.py "
                        "sizes its heads from the latter (its forward stopped on a shape mismatch)",
    "ernie4_5_moe_use_bias": "`use_bias: true` refused at start-up: transformers' class then saves an "
                             "`lm_head.bias` SGLang's ernie4.py has no parameter for (its load stopped)",
    "mixtral_sliding_window": "a `sliding_window` shorter than the context refused at start-up: SGLang's "
                              "mixtral.py attends to every key",
    "qwen3_next_attention_bias": "`attention_bias: true` refused at start-up (Qwen3.5 too): SGLang's qwen3_next.py "
                                 "and qwen3_5.py build attention projections without biases",
    "olmoe_tie_word_embeddings": "`tie_word_embeddings: true` refused at start-up (as for every architecture whose "
                                 "SGLang model never ties its head): olmoe.py builds an untied lm_head and loads "
                                 "`lm_head.weight`, which a tied checkpoint does not hold",
    "hunyuan_v1_moe": "the family refused at start-up: SGLang 0.5.23's hunyuan.py hands RadixAttention its "
                      "QK-normed queries as [tokens * heads, head_dim], which its padded-extend check narrows to the "
                      "first `tokens` rows; without `use_qk_norm` it builds no QK norm, which transformers applies",
    "granitemoe_attention_bias": "`attention_bias: true` refused at start-up: SGLang's granitemoe.py builds no "
                                 "attention biases",
    "afmoe_attention_bias": "`attention_bias: true` refused at start-up: SGLang's afmoe.py builds no attention biases",
    "olmoe_attention_bias": "`attention_bias: true` refused at start-up: SGLang's olmoe.py builds no attention biases",
    "olmoe_clip_qkv": "`clip_qkv` refused at start-up: SGLang's olmoe.py does not clip q/k/v",
    "olmoe_norm_topk_prob": "`norm_topk_prob: true` refused at start-up: SGLang's olmoe.py never renormalises top-k "
                            "weights",
    "qwen3_5_moe_text_rope_factor_inside": "a `partial_rotary_factor` that disagrees with `rope_parameters`' refused "
                                           "at start-up (every family): SGLang's qwen3_5.py reads the attribute "
                                           "(transformers 5.19 saves it at its class default, 0.25, when the factor "
                                           "was given in `rope_parameters` only), transformers' rotary embedding "
                                           "`rope_parameters`",
}

# Layout, and the variants refused at start-up, per registry family (what the rule reads).
LAYOUT: Dict[str, str] = {
    "GLM-4.5 / 4.7": "first `first_k_dense_replace` dense, NextN MTP",
    "DeepSeek-V3": "first `first_k_dense_replace` dense, NextN MTP; `moe_layer_freq` ≠ 1 refused (SGLang honours "
                   "it, transformers does not), and a config.json without it (a transformers save) refused naming "
                   "the value to add",
    "DeepSeek-V2": "as DeepSeek-V3",
    "GLM-4.7-Flash": "first `first_k_dense_replace` dense (its `mlp_layer_types` must agree), MLA, NextN MTP (MoE); "
                     "`q_lora_rank: null` refused",
    "GLM-5 (DSA)": "as DeepSeek-V3 (MLA + DSA indexer), NextN MTP; `mlp_layer_types` that disagree and shared "
                   "indexers (`indexer_types`, `index_topk_pattern`, `index_topk_freq`) refused; on the CPU runtime "
                   "(attention over every key) a context longer than `index_topk` refused",
    "DeepSeek-V3.2 (DSA)": "as DeepSeek-V3 (MLA + DSA indexer), NextN MTP; on the CPU runtime a context longer than "
                           "`index_topk` refused",
    "Qwen3-MoE": "every layer MoE; `mlp_only_layers` / `decoder_sparse_step` ≠ 1 refused (SGLang builds those "
                 "layers MoE), and `use_sliding_window` with a window shorter than the context (SGLang reads neither)",
    "Qwen2-MoE": "every layer MoE; `use_sliding_window` with a window shorter than the context refused (SGLang reads "
                 "neither key)",
    "Qwen3-Next": "every layer MoE (linear and full attention alike), its MTP layers as the config says; "
                  "`attention_bias` refused",
    "Qwen3.5-MoE": "every layer MoE (linear and full attention alike), `mtp_num_hidden_layers` MTP layers; "
                   "`attention_bias` refused",
    "MiMo-7B": "dense, dense MTP",
    "Mixtral": "every layer MoE; `head_dim` ≠ `hidden_size // num_attention_heads`, a `sliding_window` shorter than "
               "the context and quantized checkpoints SGLang builds as `QuantMixtralForCausalLM` refused",
    "OLMoE": "every layer MoE; `attention_bias`, `clip_qkv` or `norm_topk_prob` set refused",
    "Step-3.5": "MoE iff in `moe_layers_enum`; `num_nextn_predict_layers` MTP layers drafted by SGLang's Step3p5MTP",
    "MiniMax-M2": "every layer MoE; a config without `use_qk_norm: true`, `use_routing_bias: true` or "
                  "`scoring_func: sigmoid`, or whose `rotary_dim` is not transformers' partial RoPE width, refused",
    "gpt-oss": "every layer MoE",
    "Llama 4": "MoE every `interleave_moe_layer_step`-th layer, top-1; `moe_layers` that disagree refused, and NoPE "
               "layers (`no_rope_layers`, `no_rope_layer_interval`) or `layer_types` other than every fourth (SGLang "
               "fixes them), `attention_bias` or a tied head",
    "Qwen3-VL-MoE (text)": "text model: every layer MoE",
    "Qwen3-Omni-MoE (thinker text)": "the thinker's text model: every layer MoE; the talker (an MoE SGLang does not "
                                     "build) has no rows",
    "GLM-4.5V / 4.6V (text)": "text model as GLM-4.5: first `first_k_dense_replace` dense; no MTP layers (its config "
                              "names none)",
    "Gemma-4 (text)": "text model: every layer MoE (beside its dense MLP) with `enable_moe_block`, none without; "
                      "on the CPU runtime sliding and full-attention KV shapes that differ refused; on a GPU a "
                      "prompt with an image gets `image_attention` instead of rows (SGLang's image mask there is "
                      "not the checkpoint's)",
    "Kimi-K2.5 (text)": "text model as DeepSeek-V3: first `first_k_dense_replace` dense; no MTP layers (as published)",
    "Intern-S1": "text model as Qwen3-MoE: every layer MoE; a dense text model (Intern-S1-mini's Qwen3) refused: "
                 "no routers",
    "Ling / Ring 2.0 (Bailing-MoE V2)": "first `first_k_dense_replace` dense, NextN MTP (one); keys on which SGLang's "
                                        "bailing_moe.py and the release's code compute otherwise refused "
                                        "(`norm_topk_prob` false, `router_dtype` not fp32, `use_bias`, `norm_head`, "
                                        "softmax or no expert bias, a shared-expert width of its own)",
    "ERNIE-4.5-MoE": "MoE from `moe_layer_start_index` to `moe_layer_end_index`, dense MTP; `moe_layer_interval` ≠ 1 "
                     "and `use_bias` refused",
    "LFM2-MoE": "first `num_dense_layers` dense",
    "AFMoE (Arcee Trinity)": "first `num_dense_layers` dense; without `layer_types`, or with `attention_bias`, a "
                             "`score_func` other than sigmoid, `route_norm` false or `n_group` > 1, refused",
    "Granite-MoE": "every layer MoE; `attention_bias` refused",
    "Nemotron-H (Nemotron-3)": "one layer per `hybrid_override_pattern` block (Mamba-2, attention, MLP, MoE), MoE at "
                                    "its `E` blocks; one MTP layer of attention and MoE blocks (Nemotron-3-Ultra's "
                                    "`*E`: its MoE block's router); more MTP layers or other MTP blocks, "
                                    "`n_shared_experts` ≠ 1, "
                                    "`mlp_hidden_act` ≠ relu2, `mamba_hidden_act` ≠ silu, `mlp_bias`, `sliding_window` "
                                    "`n_groups` ≠ `mamba_n_groups` and a tied head (transformers' NemotronH never "
                                    "ties it) refused",
}


def _link(s: Script) -> str:
    repo, commit = REPOS[s.framework]
    return f"{s.framework} [`{s.path.rsplit('/', 1)[-1]}`](https://github.com/{repo}/blob/{commit[:9]}/{s.path})"



# Where the oracle reads a key as SGLang does and the release's code otherwise (an upstream difference, pinned by a
# test that the release's reading gives other rows).
SGLANG_READING = {
    "step3p5_flipped": "; transformers at the window SGLang attends, `sliding_window` + 1 keys, where the release's "
                       "code attends `sliding_window` (`test_step3p5_is_served_with_the_window_sglang_attends_one_key_"
                       "longer_than_published`)",
}

def _proof(arch: str) -> str:
    """How ``arch`` is proven, from the tests that prove it; '' when it has no rule."""
    from sglang_r3.core.families import SUPPORTED_ARCHITECTURES
    from tests.family_specs.groups import MTP_FLAGS, RELEASE_FAMILIES, SERVERS
    from tests.family_specs.oracle import IMAGE_FAMILIES, SGLANG_NORM_EPS
    from tests.family_specs.published import PUBLISHED_KEYS, STAND_INS, architecture_of
    from tests.family_specs.specs import FLIPPED, SPECS

    if arch not in SUPPORTED_ARCHITECTURES:
        return ""
    parts = []
    for name, fam in SPECS.items():
        if architecture_of(fam) != arch:
            continue
        if fam.not_served:
            parts.append(f"not served (`{name}`): {NOT_SERVED_WHY[name]}")
            continue
        spec_on = any(f == name and MTP_FLAGS[0] in extra for f, extra in SERVERS.values())
        base = name[: -len("_flipped")] if name.endswith("_flipped") else name
        flipped = FLIPPED.get(base) if name.endswith("_flipped") else None
        spelled = PUBLISHED_KEYS.get(base, {})
        parts.append(f"served forward = transformers' router top-k (`tests/test_families.py` `{name}`"
                     + (f", read as transformers' `{fam.model_class}`, which computes what the release's code does"
                        if fam.published_as else "")
                     + (": " + ", ".join(f"`{spelled.get(k, k)}`" for k in flipped) + " the other way" if flipped
                        else "")
                     + (", MTP speculation on = off" if spec_on else "")
                     + (", text prompts and with an image" if name in IMAGE_FAMILIES else "")
                     + (", on SGLang 0.5.15.post1 too" if name in RELEASE_FAMILIES else "")
                     + (f", under model_type `{fam.stand_in}` (its config class a stand-in, "
                        f"`tests/checkpoints/{STAND_INS[fam.stand_in].module}.py`)" if fam.stand_in else "")
                     + ("; transformers at SGLang's eps for " + ", ".join(f"`{m}`" for m in SGLANG_NORM_EPS[name])
                        + ", which SGLang builds otherwise: `SGLANG_NORM_EPS`" if name in SGLANG_NORM_EPS else "")
                     + SGLANG_READING.get(name, "") + ")")
    if arch in OTHER_FORWARDS:
        path, what = OTHER_FORWARDS[arch]
        parts.append(f"served forward (`{path}`): {what}")
    if not any(p.startswith("served forward") for p in parts):
        parts.insert(0, "**sweep only** (module trees, no served forward)")
    else:
        parts.append("sweep")
    return "; ".join(parts)


def gpu_only_launches() -> dict:
    """The refused families whose refusal names where plain SGLang stops on the CPU runtime, checked there."""
    from tests.support.gpu_only_families import LAUNCHES

    return LAUNCHES


def rows() -> List[Tuple[str, str, str, str, str]]:
    """(family, architectures, trained by, proven, layout) per row."""
    from sglang_r3.core.families import FAMILIES, family_of

    by_arch: Dict[str, List[Script]] = {}
    for s in TRAINED_BY:
        by_arch.setdefault(s.architecture, []).append(s)
    out = []
    seen = set()
    for fam in FAMILIES:
        archs = list(fam.architectures)
        scripts = [s for a in archs for s in by_arch.get(a, [])]
        if fam.rule is None and not scripts:
            continue  # refused and trained by none of the scripts: in the registry-wide table below
        seen.update(archs)
        if fam.rule is None:
            proven = f"refused at start-up: {fam.refusal.split('. ')[0].rstrip('.')}"
            if any(launch.architecture in archs for launch in gpu_only_launches().values()):
                proven += " (where plain SGLang stops there: `tests/test_gpu_only_families.py`)"
        else:
            proven = "; ".join(f"`{a}`: {_proof(a)}" if len(archs) > 1 else _proof(a) for a in archs)
        names = ", ".join(f"`{a}`" for a in archs)
        out.append((fam.name, names, _trained(scripts), proven, LAYOUT.get(fam.name, "—")))
    for arch, scripts in by_arch.items():
        if arch in seen:
            continue
        if arch:
            assert family_of(arch) is None, arch
            why = "refused at start-up: no layout rule (not proven against the module tree SGLang builds)"
            out.append((scripts[0].model, f"`{arch}`", _trained(scripts), why, "—"))
        else:
            for s in scripts:
                out.append((s.model, "not named by the script", _trained([s]),
                            "not mapped: the script gives Megatron shapes only" + UNMAPPED_WHY.get(s.model, ""), "—"))
    return out


def _trained(scripts: Sequence[Script]) -> str:
    if not scripts:
        return "—"
    return "; ".join(f"{s.model}: {_link(s)}" + (f" ({_as_published(s)})" if s.published else "") for s in scripts)


def _as_published(s: Script) -> str:
    """What start-up does with the script's model: its family's tiny sweep config with the keys the script gives,
    put to the layout rule."""
    from sglang_r3.core.layout import LayoutError, layout_from_hf_config
    from tests.scripts.sweep import SPECS

    model_type, values = SPECS[s.architecture]
    keys = ", ".join(f"`{k}: {v}`" for k, v in s.published)
    try:
        layout_from_hf_config({**values, **dict(s.published), "model_type": model_type,
                               "architectures": [s.architecture]})
    except LayoutError as e:
        return f"with {keys}: refused at start-up: {str(e).split(': ', 1)[-1]}"
    return f"with {keys}: captured as its family's rule says"


def markdown() -> str:
    lines = ["| family | architectures | trained by (script) | how it is proven | layout |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows()]
    return "\n".join(lines) + "\n"


def check(checkouts: Dict[str, str]) -> List[str]:
    """Every script at its commit names its model: the problems found ([] when none)."""
    problems = []
    for s in TRAINED_BY:
        where = checkouts.get(s.framework.lower())
        if where is None:
            problems.append(f"{s.framework}: no checkout given")
            continue
        proc = subprocess.run(["git", "-C", where, "show", f"{REPOS[s.framework][1]}:{s.path}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            problems.append(f"{s.framework} {s.path}: {proc.stderr.strip()}")
        elif s.evidence.lower() not in proc.stdout.lower():
            problems.append(f"{s.framework} {s.path}: does not contain {s.evidence!r}")
    return sorted(set(problems))


if __name__ == "__main__":
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    if "--check" not in sys.argv:
        sys.exit("usage: python -m tests.generators.family_table --check slime=DIR miles=DIR verl=DIR")
    found = check({k.lower(): v for k, v in args.items()})
    print("\n".join(found) or f"{len(TRAINED_BY)} scripts checked: each names its model")
    sys.exit(1 if found else 0)
