"""The torch versions of the sgl-kernel CPU ops the CUDA wheel lacks, registered in one call.

A server registers them when it installs the CPU patches, the manifest's check before it resolves SGLang's
CPU-path modules: gdn_backend and models/qwen3_5.py read some of these ops at import.
"""

from __future__ import annotations


def register_torch_ops() -> list:
    """Register every op of spec_ops (speculative decoding) and gdn (Qwen3-Next / Qwen3.5's linear attention)
    the loaded sgl-kernel lacks; returns the names added. Idempotent."""
    from sglang_r3.cpu_runtime.ops.gdn import register_gdn_ops
    from sglang_r3.cpu_runtime.ops.spec_ops import register_spec_ops

    return register_spec_ops() + register_gdn_ops()
