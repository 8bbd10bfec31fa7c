"""PD disaggregation's KV sender on the CPU runtime (SGLang 0.5.23).

SGLang 0.5.23's prefill engine (``disaggregation/prefill.py`` ``_send_kv_chunk``) hands a sender that says
``supports_host_tensor_indices`` (Mooncake's) its page ids as a page-locked host copy made with
``non_blocking=True`` plus a ``torch.cuda.Event`` the transfer worker waits on: both need a CUDA driver. On the CPU
runtime the KV indices already are host memory, and the sender's other path (``kv_to_page_indices``: the same page
ids as a numpy array, computed on the scheduler thread) is the exact meaning, so the Mooncake sender takes it.
"""

from __future__ import annotations


def install() -> None:
    import torch

    from sglang_r3.serving.patches import release

    if torch.cuda.is_available() or release.is_0_5_15():  # PD is served on 0.5.23 (startup_checks.py)
        return
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    MooncakeKVSender.supports_host_tensor_indices = False
