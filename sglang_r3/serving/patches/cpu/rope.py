"""DeepSeek-style attention without RoPE scaling on the CPU runtime.

SGLang's CPU path builds the rotary embedding of DeepSeek-V2/V3-style attention (MLA) through ``get_rope_cpu``
(layers/rotary_embedding/factory.py, both served releases), which asserts a ``deepseek_yarn`` ``rope_scaling``
("Only deepseek_yarn is supported for CPU for now"). Checkpoints published without one (Moonlight-16B-A3B:
``rope_scaling`` absent) stopped start-up. Without scaling the rotation is the plain one SGLang builds for that
attention on every other device (``get_rope``: a ``RotaryEmbedding``), which runs on CPU as the other families'
attention does; scaled configs keep SGLang's own CPU path.

Served and compared with transformers' router top-k in tests/test_families.py (``moonlight``).
"""

from __future__ import annotations

_FACTORY = "sglang.srt.layers.rotary_embedding.factory"


def _get_rope_cpu(original, head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None,
                  dtype=None, partial_rotary_factor=1.0, device=None):
    if rope_scaling is not None:
        return original(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                        partial_rotary_factor, device)
    from sglang.srt.layers.rotary_embedding import factory

    return factory.get_rope(head_size, rotary_dim, max_position, base, is_neox_style, None, dtype,
                            partial_rotary_factor)


HOOKS = [(f"{_FACTORY}.get_rope_cpu", _get_rope_cpu)]
