"""PD disaggregation's KV sender on the CPU runtime (SGLang 0.5.23).

SGLang 0.5.23's prefill engine (``disaggregation/prefill.py`` ``_send_kv_chunk``) hands a sender that says
``supports_host_tensor_indices`` (Mooncake's) its page ids as a page-locked host copy made with
``non_blocking=True`` plus a ``torch.cuda.Event`` the transfer worker waits on: both need a CUDA driver. On the CPU
runtime the KV indices already are host memory, and the sender's other path (``kv_to_page_indices``: the same page
ids as a numpy array, computed on the scheduler thread) is the exact meaning, so the Mooncake sender takes it.

Set when the engine sets its KV transfer up (after ``setup_state_kv_args``, before any sender exists), not at
install: importing Mooncake's module imports prometheus_client, which must come after SGLang has set
``PROMETHEUS_MULTIPROC_DIR`` (sglang_r3/serving/metrics.py), or the capture counters leave ``/metrics``.
"""

from __future__ import annotations

_TARGET = "sglang.srt.disaggregation.prefill.setup_state_kv_args"
_SENDER = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender"


def _host_page_ids(result, *args, **kwargs):
    from sglang_r3.seam.hooks import HookTargetError
    from sglang_r3.seam.manifest import by_target, check
    from sglang_r3.seam.resolve import resolve

    bad = check((by_target()[_SENDER],))  # checked here, where it is used (manifest: at_start=False)
    if bad:
        raise HookTargetError(bad)
    resolve(_SENDER).supports_host_tensor_indices = False
    return result


def install() -> None:
    import torch

    from sglang_r3.seam import release
    from sglang_r3.seam.hooks import register

    if torch.cuda.is_available() or not release.prefill_pins_page_ids_for_sender():
        return
    register(_TARGET, _host_page_ids, "after")
