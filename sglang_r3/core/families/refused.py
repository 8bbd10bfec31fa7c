"""Families SGLang 0.5.23 serves whose routing sglang-r3 cannot describe exactly: refused at start-up, by name, with
these reasons."""

from __future__ import annotations

from typing import Tuple

from sglang_r3.core.families._base import MTP_NEXTN, MTP_MULTI_LAYER, Family


_ZERO_EXPERTS = (
    "its routers pick among n_routed_experts + zero_expert_num ids, and ids >= n_routed_experts are "
    "zero-computation (identity) experts with no expert weights and no Megatron router column: a record "
    "could not be replayed as plain expert choices"
)

_DBRX_REFUSAL = (
    "dbrx.py keeps its experts as raw weight tensors allocated on CUDA and run through fused_experts (no FusedMoE "
    "module), so the start-up check cannot read the experts SGLang served; and its routing lives in a nested "
    "ffn_config (moe_num_experts, moe_top_k) that the config view does not resolve"
)

# DeepSeek-V4 (deepseek_v4.py) as Miles trains it (scripts/models/deepseek-v4-flash.py, deepseek-v4-pro.py). Where
# plain SGLang stops on the CPU runtime is checked by tests/test_gpu_only_families.py (SGLang itself the oracle).
_DEEPSEEK_V4_REFUSAL = (
    "SGLang 0.5.23 serves it on GPU kernels only, so no rule can be proven by a served forward on the CPU runtime: "
    "there its load stops compiling the mHC kernels for a CUDA device (deepseek_v4.py _prewarm_mhc_kernels, "
    "kernels/ops/layernorm/mhc.py prewarm_mhc_pre); past that, its KV cache defaults to FP8 (arg_groups/overrides.py "
    "_deepseek_v4_kv_cache_dtype), which SGLang's CPU path holds only on Intel AMX with its intel_amx backend "
    "(mem_cache/kv_cache_configurator.py), its KV pool asserts the published head widths in FP8 "
    "(mem_cache/deepseek_v4_memory_pool.py) and its attention is FlashMLA's (layers/attention/deepseek_v4_backend.py, "
    "--dsv4-attn-backend flashmla / flashmla_mega / trtllm). A checkpoint saved by transformers 5.19's "
    "DeepseekV4ForCausalLM is not read at all (SGLang reads compress_ratios, transformers writes compress_rates and "
    "layer_types). Its first num_hash_layers MoE layers route by a token-id table (HashTopK's tid2eid), not a "
    "learned router: Miles replays them into its own Megatron's hash router (mlp.router.tid2eid, "
    "dsv4_n_hash_layers), which megatron-core 0.16.1, where sglang-r3 replays, does not have"
)

_MIMO_V2_REFUSAL = (
    "SGLang builds its layers from per-layer lists (moe_layer_freq, hybrid_layer_pattern, swa_*) that "
    "transformers' MiMoV2FlashConfig ignores (it derives mlp_layer_types, layer_types and per-attention-type "
    "rope_parameters instead), and its 3 dense MTP layers are served either as one draft layer "
    "(_config_draft_model forces num_nextn_predict_layers=1) or by multi-layer EAGLE, which sglang-r3 has not "
    "proven for it: the checkpoint's MTP layout is not what SGLang builds"
)

# Inkling (inkling.py, inkling_common/) as Miles trains it (scripts/models/inkling.py). Where plain SGLang stops on
# the CPU runtime is checked by tests/test_gpu_only_families.py (SGLang itself the oracle).
_INKLING_REFUSAL = (
    "SGLang 0.5.23 serves it on GPU kernels only, so no rule can be proven by a served forward on the CPU runtime: "
    "inkling.py asserts the Mamba cache's extra buffer (its short convolutions' state snapshots), which SGLang's "
    "start-up refuses there (arg_groups/mamba_hook.py validate_mamba_extra_buffer: 'extra_buffer requires platform "
    "support for Mamba cache state snapshots'); past that, its attention asserts the fa4 or triton backend "
    "(inkling_common/attn.py InklingAttention) and its routers are InklingGate (inkling_common/moe.py), not SGLang's "
    "TopK: Triton gate kernels (gate_topk, sigmoid_gate_topk_renorm) whose weights renormalise over the routed and "
    "the shared experts' logits, handing top-k ids to the experts capturer directly. Its trainer is Miles' own plugin "
    "(miles_plugins/models/inkling InklingRouter), replayed by Miles' routing_replay_manager, not by Megatron's "
    "RouterReplay or slime's RoutingReplay, which sglang-r3 installs into"
)

# Found by serving a tiny checkpoint saved by transformers' HunYuanMoEV1ForCausalLM (tests/test_families.py).
_HUNYUAN_V1_MOE_REFUSAL = (
    "SGLang 0.5.23's hunyuan.py serves no config as transformers' HunYuanMoEV1 computes it. With use_qk_norm true "
    "(as tencent/Hunyuan-A13B publishes it) it hands RadixAttention its queries as [tokens * heads, head_dim] after "
    "the QK norm, which radix_attention.py's padded-extend check (graph_utils.padded_extend_real_tokens) reads as "
    "padding: a prefill attends with the first `tokens` rows only, on every device (on the CPU runtime the first "
    "prefill stops on a shape mismatch); without it SGLang builds no QK norm, which transformers' HunYuanMoEV1 "
    "always applies"
)

# Intern-S1-Pro: its config class is the checkpoint's own code (model_type interns1_pro: neither transformers 5.19
# nor SGLang 0.5.23 defines it).
_INTERNS1_PRO_REFUSAL = (
    "no rule proven yet: its config class is the checkpoint's own code, so neither the sweep nor a served forward has "
    "built it here. interns1pro.py is Qwen3-VL-MoE's wrapper with its own text attention (InternS1ProTextAttention, "
    "FoPE weights) over qwen3_moe.py's decoder layers"
)

FAMILIES: Tuple[Family, ...] = (
    Family("Hunyuan-MoE v1", {"HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe"}, refusal=_HUNYUAN_V1_MOE_REFUSAL),
    Family("DBRX", {"DbrxForCausalLM": "dbrx"}, refusal=_DBRX_REFUSAL),
    Family("DeepSeek-V4", {"DeepseekV4ForCausalLM": "deepseek_v4"}, refusal=_DEEPSEEK_V4_REFUSAL, mtp=MTP_NEXTN),
    Family("MiMo-V2-Flash", {"MiMoV2FlashForCausalLM": "mimo_v2_flash", "MiMoV2ForCausalLM": "mimo_v2_flash"},
           refusal=_MIMO_V2_REFUSAL, mtp=MTP_MULTI_LAYER),
    Family("LongCat-Flash", {"LongcatFlashForCausalLM": "longcat_flash"}, refusal=_ZERO_EXPERTS, mtp=MTP_NEXTN),
    Family("Intern-S1-Pro", {"InternS1ProForConditionalGeneration": ""}, refusal=_INTERNS1_PRO_REFUSAL),
    Family("Inkling", {"InklingForConditionalGeneration": "inkling_mm_model",
                       "InklingForConditionalGenerationMTP": "inkling_mm_model"},
           refusal=_INKLING_REFUSAL, mtp=MTP_MULTI_LAYER),
)
