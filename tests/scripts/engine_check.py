"""Runs sglang_r3.serving.engine.Engine (SGLang's in-process engine with capture) and prints one output's meta_info.

A separate process: an Engine owns its process (scheduler children, signal handlers, the CPU runtime).
Prints a JSON line: {"output_ids": [...], "routed_experts": str|None, "routing": dict|None, "routing_error": ...}.
"""

import json
import sys


def print_greedy_output(engine, prompt, **extra) -> None:
    """One greedy output of ``engine`` (6 tokens, upstream's field asked for) as a JSON line; shuts it down."""
    try:
        out = engine.generate(
            input_ids=prompt,
            sampling_params={"max_new_tokens": 6, "temperature": 0},
            return_routed_experts=True,
        )
        meta = out["meta_info"]
        print(json.dumps({
            **extra,
            "output_ids": out["output_ids"],
            "routed_experts": meta.get("routed_experts"),
            "routing": meta.get("routing"),
            "routing_error": meta.get("routing_error"),
        }))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    from sglang_r3.serving.engine import Engine

    print_greedy_output(Engine(["--disable-speculation"]), json.loads(sys.argv[1]))
