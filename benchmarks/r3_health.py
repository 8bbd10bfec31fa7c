"""``python -m benchmarks.r3_health [--quick]``: what live R3 health costs a training step.

Both sides run the same replayed training step on the same batch: ``ReplayFiller.fill`` ->
forward -> ``replay_backward`` -> backward -> ``clear``, on the embedded checkpoint converted into
a megatron-core GPTModel (fp32, CPU, one thread); the measuring side is ``ReplayFiller(...,
measure=True)`` and also reads ``health()`` once per step. The records are the model's own routing
(a RECORD pass), so both sides route exactly as the model would; measuring must change no loss
and no gradient (checked bit for bit before timing). Rounds alternate the order of the sides;
the key is the median of per-round ratios (process CPU time, measure on / off) with a bootstrap
95% interval (benchmarks/stats.py); wall-clock ratios are reported next to it, and so is the
measuring work alone (own top-k + count per router call, timed in isolation at the batch's shape)
as a share of the step. Freed heap stays in the process (``decode_bind.keep_freed_memory``).

The embedded model is tiny (hidden 64, 16 experts, top-4, 3 MoE layers), so the router's extra
top-k weighs far more against the step than on a real model: an upper bound, on CPU.
Writes ``benchmarks/results/r3_health.json``; ``--into-latest`` also adds the key to latest.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "r3_health.json"
LATEST = HERE / "results" / "latest.json"
GOAL = 1.03

sys.path.insert(0, str(ROOT / "tests" / "trainer"))  # the Megatron CPU shims (they patch nothing under test)


def _batch(samples: int, length: int, seed: int = 0) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (length,), generator=g) for _ in range(samples)]


def _forward(model, tokens: Sequence[torch.Tensor]):
    """Samples packed into one sequence, each attending to itself only (positions from 0 per sample)."""
    from megatron_cpu import causal_mask

    ids = torch.cat(list(tokens)).reshape(1, -1)
    S = ids.shape[1]
    sample = torch.repeat_interleave(torch.arange(len(tokens)), torch.tensor([len(t) for t in tokens]))
    mask = causal_mask(S) | (sample[:, None] != sample[None, :])[None, None]
    pos = torch.cat([torch.arange(len(t)) for t in tokens]).reshape(1, S)
    return model(ids, pos, mask, labels=torch.roll(ids, -1, dims=1))


def _own_records(model, filler, layout, tokens):
    from sglang_r3.core.record import RoutingRecord, token_digest

    filler.record()
    with torch.no_grad():
        model.eval()
        _forward(model, tokens)
    rec = filler.recorded()
    filler.clear()
    out, off = [], 0
    for t in tokens:
        n = len(t) - 1
        e = np.stack([rec[lid][off : off + n].numpy() for lid in layout.moe_layer_ids], axis=1)
        out.append(RoutingRecord(layout.fingerprint, 0, layout.moe_layer_ids, e.astype(layout.expert_dtype),
                                 tokens_digest=token_digest(t)))
        off += len(t)
    return out


def _step(model, filler, records, tokens, measure: bool):
    filler.fill(records, tokens)
    model.train()
    loss = _forward(model, tokens)
    filler.replay_backward()
    loss.mean().backward()
    filler.clear()
    health = filler.health() if measure else None
    return loss.detach(), health


def _grads(model) -> Dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def measure(rounds: int = 30, samples: int = 8, length: int = 128, warmup: int = 5) -> Dict[str, Any]:
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    from benchmarks.stats import ratio_ci
    from megatron_cpu import converted_embedded_model
    from replay_helpers import embedded_layout
    from sglang_r3.trainer import ReplayFiller

    torch.set_num_threads(1)
    # Fresh pages cost ~50x a normal host's on this VM; a trainer reuses its memory (as decode_bind times it).
    from benchmarks.decode_bind import keep_freed_memory

    keep_freed_memory()
    layout = embedded_layout()
    model = converted_embedded_model()
    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    tokens = _batch(samples, length)
    fillers = {False: ReplayFiller(model, layout), True: ReplayFiller(model, layout, measure=True)}
    records = _own_records(model, fillers[False], layout, tokens)

    # Same work, same output: measuring changes no loss and no gradient.
    outputs = {}
    for side in (False, True):
        model.zero_grad(set_to_none=True)
        loss, health = _step(model, fillers[side], records, tokens, side)
        outputs[side] = (loss, _grads(model), health)
    same = torch.equal(outputs[False][0], outputs[True][0]) and all(
        torch.equal(outputs[False][1][n], outputs[True][1][n]) for n in outputs[False][1])
    if not same:
        raise RuntimeError("measuring changed the loss or a gradient")
    health = outputs[True][2]
    if health["r3/pairs_flipped"] != 0:
        raise RuntimeError(f"records of the model's own routing counted {health['r3/pairs_flipped']} flips")

    cpu: Dict[bool, List[float]] = {False: [], True: []}
    wall: Dict[bool, List[float]] = {False: [], True: []}
    for r in range(warmup + rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for side in order:
            model.zero_grad(set_to_none=True)
            c0, w0 = time.process_time(), time.perf_counter()
            _step(model, fillers[side], records, tokens, side)
            c1, w1 = time.process_time(), time.perf_counter()
            if r >= warmup:
                cpu[side].append(c1 - c0)
                wall[side].append(w1 - w0)
    model.zero_grad(set_to_none=True)
    key = ratio_ci(cpu[True], cpu[False])
    extra_us = _extra_us_per_router_call(samples * length, layout.num_experts, layout.topk)
    return {
        "r3_health_overhead_ratio": key,
        "wall_ratio": ratio_ci(wall[True], wall[False]),
        "step_cpu_ms_measure_off": round(1000 * float(np.median(cpu[False])), 2),
        "step_cpu_ms_measure_on": round(1000 * float(np.median(cpu[True])), 2),
        # The measuring work alone (own top-k + count, at this batch's router shape), per router call,
        # and what it comes to per step (one call per decoder MoE router) over the step's CPU time.
        "extra_us_per_router_call": round(extra_us, 1),
        "component_estimate_ratio": round(
            1 + len(layout.moe_layer_ids) * extra_us / 1e6 / float(np.median(cpu[False])), 5),
        "rounds": rounds,
        "batch": {"samples": samples, "tokens_per_sample": length, "moe_layers": len(layout.moe_layer_ids),
                  "experts": layout.num_experts, "topk": layout.topk},
        "same_output": same,
        "health_of_own_routing": health,
    }


def _extra_us_per_router_call(rows: int, experts: int, topk: int, repeats: int = 2000) -> float:
    """CPU microseconds of what measuring adds inside one router call: Megatron's own top-k on the
    scores and RouterMeter.observe (sorted-set compare, pad mask, count, token flags)."""
    from sglang_r3.trainer.health import HealthBook, RouterMeter

    g = torch.Generator().manual_seed(1)
    scores = torch.randn(rows, experts, generator=g)
    replayed = torch.topk(torch.randn(rows, experts, generator=g), topk, dim=1).indices
    meter = RouterMeter(1, torch.device("cpu"))
    meter.armed = True
    book = HealthBook([meter])
    book.start_fill()
    meter.push(book.binding(np.r_[np.ones(rows - 1, bool), False], torch.device("cpu")))
    times = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(repeats // 5):
            _, own = torch.topk(scores, topk, dim=1)
            meter.observe(replayed, own)
        times.append((time.process_time() - t0) / (repeats // 5) * 1e6)
    return float(np.median(times))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--into-latest", action="store_true",
                    help="also write the key (with this run's machine and time) into results/latest.json")
    args = ap.parse_args(argv)
    from benchmarks.machine import machine

    t0 = time.monotonic()
    res = measure(rounds=40 if args.quick else 100)
    res["machine"] = machine()
    res["quick"] = args.quick
    res["seconds"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    k = res["r3_health_overhead_ratio"]
    print(f"r3_health_overhead_ratio {k['value']} [{k['lo']}, {k['hi']}] (goal <= {GOAL}); "
          f"wall {res['wall_ratio']['value']}; step {res['step_cpu_ms_measure_off']} -> {res['step_cpu_ms_measure_on']} ms CPU")
    if args.into_latest and LATEST.exists():
        latest = json.loads(LATEST.read_text())
        latest["r3_health"] = res
        latest["keys"]["r3_health_overhead_ratio"] = k["value"]
        latest["keys"]["r3_health_overhead_ci"] = [k["lo"], k["hi"]]
        latest["goals"]["r3_health_overhead_ratio"] = {"goal": f"<= {GOAL}", "value": k["value"], "met": k["value"] <= GOAL}
        LATEST.write_text(json.dumps(latest, indent=1) + "\n")
        print(f"added r3_health_overhead_ratio to {LATEST}")
    return res


if __name__ == "__main__":
    main()
