"""DeepSeek-style attention's rotary embedding on the CPU runtime: without RoPE scaling, and half-split.

SGLang's CPU path builds the rotary embedding of DeepSeek-V2/V3-style attention (MLA) through ``get_rope_cpu``
(layers/rotary_embedding/factory.py, both served releases), which asserts a ``deepseek_yarn`` ``rope_scaling``
("Only deepseek_yarn is supported for CPU for now"). Checkpoints published without one (Moonlight-16B-A3B:
``rope_scaling`` absent) stopped start-up. Without scaling the rotation is the plain one SGLang builds for that
attention on every other device (``get_rope``: a ``RotaryEmbedding``), which runs on CPU as the other families'
attention does; scaled configs keep SGLang's own CPU path.

Half-split pairs (``rope_interleave: false``, which SGLang reads as ``is_neox_style``): the YaRN rotary embedding
SGLang builds on CPU for this attention (``DeepseekScalingRotaryEmbedding``, rope_variant.py, both releases) runs
neox style wrongly there. Its ``forward_native`` (what CPUs without AMX dispatch to) repeats a 2-D cos/sin as 3-D
(``repeat(1, 1, 2)``), so q and k gain a leading axis and the absorbed (decode) attention stops on a shape error;
its ``forward_cpu`` (AMX) hands the kernel ``is_neox=False`` whatever the model asked, rotating interleaved pairs:
silently another model. On GPU the rotation is RotaryEmbedding's, which honours the flag. So neox style runs here as
SGLang's ``forward_native`` means it (cos/sin repeated along the last axis, ``rotate_neox``); interleaved keeps
SGLang's path.

Served and compared with transformers' router top-k in tests/test_families.py (``moonlight``; half-split pairs:
``glm4_moe_lite_flipped`` unscaled and ``deepseek_v3_flipped`` with YaRN).
"""

from __future__ import annotations

_FACTORY = "sglang.srt.layers.rotary_embedding.factory"
_VARIANT = "sglang.srt.layers.rotary_embedding.rope_variant"


def _get_rope_cpu(original, head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None,
                  dtype=None, partial_rotary_factor=1.0, device=None):
    if rope_scaling is not None:
        return original(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                        partial_rotary_factor, device)
    from sglang.srt.layers.rotary_embedding import factory

    return factory.get_rope(head_size, rotary_dim, max_position, base, is_neox_style, None, dtype,
                            partial_rotary_factor)


def _half_split(original, self, positions, query, key, offsets=None):
    """Around DeepseekScalingRotaryEmbedding.forward_native and .forward_cpu (which runs on AMX CPUs)."""
    if not self.is_neox_style:
        return original(self, positions, query, key, offsets)
    import torch
    from sglang.srt.layers.rotary_embedding.utils import rotate_neox

    positions = positions + offsets if offsets is not None else positions
    cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [tokens, rotary_dim / 2]
    cos = cos.repeat(1, 2).unsqueeze(-2)  # [tokens, 1, rotary_dim]: one row per token, every head
    sin = sin.repeat(1, 2).unsqueeze(-2)

    def rotate(x):
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        return torch.cat((rot * cos + rotate_neox(rot) * sin, rest), dim=-1).to(x.dtype)

    return rotate(query), rotate(key)


HOOKS = [(f"{_FACTORY}.get_rope_cpu", _get_rope_cpu),
         *((f"{_VARIANT}.DeepseekScalingRotaryEmbedding.{m}", _half_split) for m in ("forward_native", "forward_cpu"))]
