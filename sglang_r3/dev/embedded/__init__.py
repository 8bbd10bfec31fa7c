"""The embedded default model: a tiny GLM-4.5-style MoE with one MTP layer, built locally from a seed."""

from sglang_r3.dev.embedded.model import EMBEDDED_CONFIG, default_speculative_flags, ensure_embedded_model

__all__ = ["EMBEDDED_CONFIG", "default_speculative_flags", "ensure_embedded_model"]
