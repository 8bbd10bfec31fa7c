"""SGLang's own in-process ``sglang.Engine(**kwargs)`` under ``SGLANG_R3_ENABLED=1`` (no sglang_r3 launcher).

``python tests/sglang_engine_check.py PROMPT_JSON`` first builds an Engine with DP attention (must raise,
naming the flag, before any SGLang process starts), then the embedded model on the CPU runtime, and
prints one JSON line: the refusal (type, message, child processes alive after it) and one greedy
output's ids, ``routed_experts`` and ``routing``. A separate process: an Engine owns its process.
"""

import json
import multiprocessing
import sys

if __name__ == "__main__":
    import sglang

    from sglang_r3.embedded import ensure_embedded_model

    prompt = json.loads(sys.argv[1])
    base = dict(
        model_path=str(ensure_embedded_model()),
        device="cpu", attention_backend="torch_native", disable_overlap_schedule=True, disable_cuda_graph=True,
        enable_return_routed_experts=True, dtype="float32", max_total_tokens=65536,
    )
    refusal = None
    try:
        sglang.Engine(**base, enable_dp_attention=True)
    except Exception as exc:  # noqa: BLE001 -- reported, the test asserts on it
        refusal = {
            "type": type(exc).__name__,
            "message": str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
            "children": len(multiprocessing.active_children()),
        }
    engine = sglang.Engine(**base)
    try:
        out = engine.generate(
            input_ids=prompt,
            sampling_params={"max_new_tokens": 6, "temperature": 0},
            return_routed_experts=True,
        )
        meta = out["meta_info"]
        print(json.dumps({
            "refusal": refusal,
            "output_ids": out["output_ids"],
            "routed_experts": meta.get("routed_experts"),
            "routing": meta.get("routing"),
            "routing_error": meta.get("routing_error"),
        }))
    finally:
        engine.shutdown()
