"""SGLang's own in-process ``sglang.Engine(**kwargs)`` under ``SGLANG_R3_ENABLED=1`` (no sglang_r3 launcher).

``python tests/scripts/sglang_engine_check.py PROMPT_JSON`` first builds an Engine with two-batch overlap (must raise,
naming the flag, before any SGLang process starts), then the embedded model on the CPU runtime, and
prints one JSON line: the refusal (type, message, child processes alive after it) and one greedy
output's ids, ``routed_experts`` and ``routing``. A separate process: an Engine owns its process.
"""

import json
import multiprocessing
import sys

if __name__ == "__main__":
    import sglang

    from engine_check import print_greedy_output  # this script's folder is on sys.path

    from sglang_r3.dev.embedded import ensure_embedded_model

    prompt = json.loads(sys.argv[1])
    base = dict(
        model_path=str(ensure_embedded_model()),
        device="cpu", attention_backend="torch_native", disable_overlap_schedule=True, disable_cuda_graph=True,
        enable_return_routed_experts=True, dtype="float32", max_total_tokens=65536, sleep_on_idle=True,
    )
    refusal = None
    try:
        sglang.Engine(**base, enable_two_batch_overlap=True)
    except Exception as exc:  # noqa: BLE001 -- reported, the test asserts on it
        refusal = {
            "type": type(exc).__name__,
            "message": str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
            "children": len(multiprocessing.active_children()),
        }
    print_greedy_output(sglang.Engine(**base), prompt, refusal=refusal)
