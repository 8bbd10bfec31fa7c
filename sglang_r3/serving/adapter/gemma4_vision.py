"""Gemma-4 with an image: its vision pooler fixed on every device, and image prompts whose attention is not the
checkpoint's refused their rows.

Pooler: zeroes its padding patches before pooling, as transformers' does.

A Gemma-4 image processor pads each image's patches to a fixed count (``max_soft_tokens`` x pooling kernel^2; the
padding's positions are -1). transformers 5.19's ``Gemma4VisionPooler.forward`` (modeling_gemma4.py) zeroes the
padding's hidden states, then averages patches by position, where the padding's clamped positions land in the first
soft token. SGLang's ``Gemma4VisionPooler`` zeroes them only when built ``mask_pad_before_pool=True``, which its
``gemma4_diffusion.py`` passes and ``gemma4_mm.py`` (Gemma4ForConditionalGeneration) does not (0.5.15's pooler has no
such flag). So an image with fewer patches than the budget -- most images -- reaches the language model with its
first soft token made of the padding's encoder states: measured on the test checkpoint, that token off by 236 where
transformers' is at most 26, and the image's rows not the checkpoint's (tests/test_families.py ``gemma4``, with an
image). Here the pooler masks the padding as transformers does; one ``masked_fill`` per image, no host sync.
"""

from __future__ import annotations

from typing import Optional

from sglang_r3.cpu_runtime.families.gemma4 import SPLIT  # the CPU port marks an image a chunk cut

POOLER_TARGET = "sglang.srt.models.gemma4_vision.Gemma4VisionPooler.forward"


def _pooler_around(original, self, hidden_states, patch_positions, padding_positions, output_length=None):
    hidden_states = hidden_states.masked_fill(padding_positions.unsqueeze(-1), 0.0)
    return original(self, hidden_states, patch_positions, padding_positions, output_length)


# Attention: transformers' create_masks_for_vision_model (modeling_gemma4.py) lets an image's tokens attend to each
# other both ways in the sliding-window layers only, full-attention layers causal. SGLang's prepare_attn_masks
# (gemma4_mm.py) hands Triton a mask opening each image in every layer, which its extend kernel bounds by the query
# block (keys past the block never visited under a causal launch), and falls back to causal on other backends.
# Measured on the test checkpoint (served on the CPU runtime with each mask): causal everywhere, 301 of 1196
# (token, layer) pairs differ from transformers; both ways in every layer, 67. The CPU runtime serves transformers'
# mask (cpu_runtime/families/gemma4.py) for an image wholly inside one prefill chunk; it marks an image a chunk split.
_ARCHITECTURE = "Gemma4ForConditionalGeneration"


def image_attention_refusal(architecture: str, on_cpu_runtime: bool, req) -> Optional[str]:
    """Why a finished Gemma-4 request with an image gets no rows (``image_attention``), or None."""
    if architecture != _ARCHITECTURE:
        return None
    mm = getattr(req, "multimodal_inputs", None)
    images = [item for item in (mm.mm_items if mm is not None else ()) if item.is_image()]
    if not images:
        return None
    if not on_cpu_runtime:
        return ("Gemma-4 with an image in the prompt: SGLang's GPU attention serves the image's tokens with another mask "
                "than the checkpoint's (transformers: both ways within an image in the sliding-window layers only; "
                "SGLang's Triton: in every layer, bounded by its query block; other backends: causal), so its rows are "
                "not the checkpoint's routing; text prompts are served exactly")
    split = [tuple(span) for item in images if getattr(item, SPLIT, False) for span in item.offsets]
    if split:
        return (f"Gemma-4 with an image in the prompt: a prefill chunk boundary cut the image at tokens {split[0]}, which "
                "SGLang then serves causally, not both ways as the checkpoint's sliding-window layers attend; raise "
                "--chunked-prefill-size above the prompt's length")
    return None


def install_gemma4_vision_patch() -> None:
    from sglang_r3.seam.hooks import register

    register(POOLER_TARGET, _pooler_around, "around")
