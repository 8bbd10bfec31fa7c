"""CPU-only patches that let SGLang 0.5.23 run MTP/EAGLE speculative decoding.

Patch list (all inert unless the process runs on CPU; installing twice is a no-op):
1. spec_ops: registers torch implementations of the sgl-kernel ``*_cpu`` ops the
   CPU speculative/KV path calls (``torch.ops.sgl_kernel.verify_tree_greedy_cpu``,
   ``build_tree_kernel_efficient_cpu``, ``assign_*_cpu``, ``fill_*_cpu``,
   ``build_draft_decode_metadata_cpu``, ``rotate_input_ids_cpu``,
   ``reconstruct_indices_from_tree_mask_cpu``, ``copy_all_layer_kv_cache_cpu``);
   the CUDA wheel of sgl-kernel only ships them in its CPU build.
2. attention (HookRegistry AROUND hooks): ``TorchNativeAttnBackend.forward_extend``
   gains TARGET_VERIFY (chain-causal or tree-masked draft rows over the prefix),
   ``.forward_decode`` multi-step draft decode, and
   ``DraftBackendFactory._create_backend`` a ``torch_native`` draft backend.
3. cuda_shims: ``torch.cuda.synchronize``/``empty_cache`` become no-ops without CUDA.
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

    from sglang_r3.patches.cpu.attention import HOOKS
    from sglang_r3.patches.cpu.cuda_shims import install_cuda_shims
    from sglang_r3.patches.cpu.spec_ops import register_spec_ops

    install_cuda_shims()
    added = register_spec_ops()
    for target, hook in HOOKS:
        HookRegistry.register(target, hook, HookType.AROUND)
    # Inside load_plugins() SGLang applies registered hooks right after all
    # plugins ran; applying here would mark targets patched and silently drop
    # hooks other plugins register on them later. Called from anywhere else
    # (e.g. a launcher before load_plugins), apply now.
    if _current_plugin_source.get() is None:
        HookRegistry.apply_hooks()
    logger.info("sglang_r3 CPU patches installed (added sgl_kernel ops: %s)", ", ".join(added) or "none")
