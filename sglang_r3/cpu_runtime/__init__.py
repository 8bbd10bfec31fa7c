"""CPU-only patches that let SGLang 0.5.23 run MTP/EAGLE speculative decoding.

1. spec_ops: torch.library implementations of the ``torch.ops.sgl_kernel.*_cpu`` ops the
   CPU speculative/KV path calls (verify_tree_greedy, build_tree_kernel_efficient,
   assign_{req_to_token_pool,extend_cache_locs,draft_cache_locs_contiguous}, fill_{bonus_tokens,
   accept_out_cache_loc}, build_draft_decode_metadata, rotate_input_ids,
   reconstruct_indices_from_tree_mask, copy_all_layer_kv_cache); the CUDA wheel lacks them.
2. attention (HookRegistry AROUND): TorchNativeAttnBackend.forward_extend gains TARGET_VERIFY,
   .forward_decode multi-step draft decode, DraftBackendFactory._create_backend a torch_native
   draft backend (DRAFT_EXTEND_V2 already works through the stock extend path).
3. cuda_shims: torch.cuda.synchronize/empty_cache are no-ops without CUDA; host pools are not
   page-locked (upstream's routed-experts host buffer runs on CPU then).
4. llama4 (HookRegistry AROUND): Llama4Attention.forward uses RoPE's returned q/k and a float32 QK norm
   (its non-CUDA branch drops the rotation and casts q/k to bfloat16); moe_forward_native runs top-1
   experts that weigh their input (apply_router_weight_on_input), which it refused.
5. ranks: more than one rank (TP, DP attention) on CPU: process groups without pynccl, and the
   padded-row fill value the DP-attention MLP-sync padding asks torch_native for.
6. expert_parallel: ``--ep-size N`` (all-to-all backend none): another rank's experts (id -1) add zero in
   moe_forward_native, as the CUDA kernel, and the reduce-scatterv SGLang returns the MoE output with
   under DP attention runs on the gloo group (it is pynccl only).
7. eagle_0_5_15 (SGLang 0.5.15 only): its EAGLE v2 kernel entry points (Triton / CUDA-only, no CPU
   branch) to spec_ops' torch versions, greedy verify, QLEN_ONLY tree masks, CPU idle verify inputs.
8. gdn: torch versions of the gated delta-net ops (causal conv1d, gating, chunked and recurrent delta
   rule) and Qwen3.5's fused q/k norm, output gate and projection split, for Qwen3-Next and Qwen3.5.
9. minimax_m2: MiniMax-M2's whole-width q/k RMS norm in torch (its two Triton kernels assert CUDA tensors).
10. gpt_oss: gpt-oss's attention sinks in torch_native, and its start-up backend assertion told so.
11. dsa: GLM-5 / DeepSeek-V3.2 served with MLA over every key (exact while sequences fit in index_topk): the
   CUDA-only DSA start-up passes skipped, the indexer not run where the backend has no indexer metadata.
12. rope: DeepSeek-style attention without RoPE scaling (Moonlight) gets SGLang's plain rotary embedding, where
   its CPU path asserts a deepseek_yarn scaling; its YaRN rotation with half-split pairs (rope_interleave false)
   computed as SGLang's forward_native means it (which adds an axis there, and its AMX kernel call interleaves).
13. gemma4: Gemma-4's router normalises with its fused input scale (the CPU norm path skipped it), its start-up
   assertion counts torch_native as the CPU attention backend, and an image's tokens attend to each other both ways
   in torch_native's sliding-window layers, as transformers masks them (SGLang falls back to causal there).
14. mamba2: Mamba-2 mixers (Nemotron-H) with torch versions of their causal convolutions (unbound on a CPU import),
   SSD scan and state update (Triton), bound for the mixer's forward.
15. nemotron_h: Nemotron-H's MoE block: its router logits without torch.mm's CUDA-only out_dtype, its non-gated
   ReLU^2 experts (which moe_forward_native refuses) with the routed scaling factor, as the CUDA Triton runner.
16. lfm2_moe: LFM2-MoE's short convolutions with mamba2's torch convolutions (Triton on a CPU import), bound for the
   layer's forward.
17. afmoe: AFMoE's packed experts, which it runs through the Triton runner's fused_moe directly, in SGLang's torch
   implementation with the call's routed scaling factor.
18. bailing_moe: Ling / Ring 2.0's routed experts times their routed scaling factor, which its MoE block leaves to the
   CUDA Triton runner (moe_forward_native applies none).
19. step3p5: Step-3.5's routed SiLU experts with their swiglu clamp (gemm1_clamp_limit), which moe_forward_native
   drops without a gemm1_alpha, as the CUDA Triton runner applies it.
20. torch_ops: the ops of spec_ops and gdn registered in one call (here, and by the manifest's check).
21. disaggregation: PD disaggregation's Mooncake KV sender takes its host page-id path (no pinned copy, no CUDA event).
Everything is skipped when CUDA is available; installing twice is a no-op.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_installed = False


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def install_cpu_patches() -> None:
    global _installed
    if _installed or not _on_cpu():
        return
    _installed = True

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType, _current_plugin_source

    from sglang_r3.cpu_runtime.ops.attention import HOOKS
    from sglang_r3.seam.hooks import register
    from sglang_r3.cpu_runtime.platform.cuda_shims import install_cuda_shims, install_host_alloc_shim
    from sglang_r3.cpu_runtime.ops.torch_ops import register_torch_ops
    from sglang_r3.cpu_runtime.families import (afmoe, bailing_moe, gemma4, gpt_oss, lfm2_moe, llama4, minimax_m2, nemotron_h, step3p5)
    from sglang_r3.cpu_runtime.platform import cuda_shims, expert_parallel, ranks
    from sglang_r3.cpu_runtime.ops import dsa, gdn, mamba2, rope

    install_cuda_shims()
    install_host_alloc_shim()
    from sglang_r3.cpu_runtime.platform import disaggregation

    disaggregation.install()
    added = register_torch_ops()  # torch_ops.py
    from sglang_r3.seam.release import cpu_model_ports_apply, speculative_kernels_have_cpu_path

    eagle = None
    if not speculative_kernels_have_cpu_path():  # 0.5.15 sends no speculative kernel to the CPU (cpu_runtime/ops/eagle_0_5_15.py)
        from sglang_r3.cpu_runtime.ops import eagle_0_5_15 as eagle
    ports = cpu_model_ports_apply()  # SGLang 0.5.23's CPU path (release.cpu_model_ports_apply)
    around = (HOOKS + ranks.hooks() + llama4.HOOKS + expert_parallel.HOOKS + cuda_shims.hooks() + gdn.hooks(ports)
              + minimax_m2.HOOKS + gpt_oss.hooks() + dsa.hooks() + rope.HOOKS + gemma4.hooks(ports)
              + bailing_moe.HOOKS + step3p5.HOOKS
              + (mamba2.HOOKS + nemotron_h.HOOKS + lfm2_moe.HOOKS + afmoe.HOOKS
                 if ports else []))
    for target, hook in around + (eagle.hooks() if eagle else []):
        register(target, hook, HookType.AROUND)  # binds or names the target (seam/hooks.py)
    ranks.add_seq_len_fill_value()
    if eagle:
        eagle.install_stand_ins()
    # Inside load_plugins() SGLang applies registered hooks right after all
    # plugins ran; applying here would mark targets patched and silently drop
    # hooks other plugins register on them later. Called from anywhere else
    # (e.g. a launcher before load_plugins), apply now.
    if _current_plugin_source.get() is None:
        HookRegistry.apply_hooks()
    logger.info("sglang_r3 CPU patches installed (added sgl_kernel ops: %s)", ", ".join(added) or "none")
