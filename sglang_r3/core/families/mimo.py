"""MiMo-7B (mimo.py, mimo_mtp.py): what their config classes say, the layout rule, the registry entries and their key
accounting."""

from __future__ import annotations

from typing import Tuple

from sglang_r3.core.families._base import MTP_NEXTN, Stack, Family, _int, _mtp_count, _stack


def _mimo(v, arch) -> Stack:
    """MiMo-7B: a dense Qwen2-style model; its MTP layers are dense Qwen2
    decoder layers too (mimo_mtp.py), so they carry no router."""
    L = _int(v, "num_hidden_layers", arch)
    return _stack(L, lambda i: False, 0, 0, _mtp_count(v, arch, default=0), mtp_moe=False)


FAMILIES: Tuple[Family, ...] = (
    # MiMo's config class is the checkpoint's own code: no facts.
    Family("MiMo-7B", {"MiMoForCausalLM": ""}, {}, _mimo, mtp=MTP_NEXTN),
)
