"""``python -m benchmarks.fidelity [--quick]``: R3 measured end to end on one set of weights.

The trainer holds the rollout engine's exact weights (the embedded checkpoint converted into a
megatron-core GPTModel by ``tests/trainer/convert.py``, fp32) and teacher-forces the engine's own
samples, so every difference comes from the engine's numerics (bf16), not from the weights:

1. fp32 server vs Megatron fp32, no replay: logprobs and routing must match (the converter is exact).
2. bf16 server (the rollout), sampled at temperature 1, vs Megatron fp32 with R3 off
   (routers choose) and on (``ReplayFiller.fill_microbatches``, one microbatch per sample through
   Megatron's ``forward_backward_func``): flip rate per MoE layer, and what the flips do to the
   policy-gradient ratio (k3 KL, share of tokens whose ratio is beyond 2x).
3. MTP: SGLang's MTP-draft routing (speculative server, ``return_routing: {"mtp": true}``) vs the
   trainer's live MTP router on the same samples (R3 on for the decoder, as in training).

Seeds: fixed prompts, servers started with ``--random-seed 0``, requests sent one at a time. Each
request also carries a ``sampling_seed``, which SGLang honours only under
``--enable-deterministic-inference``.

Servers start one at a time (``--bf16-url``/``--fp32-url``/``--spec-url`` reuse running ones). Writes
``benchmarks/results/fidelity.json`` and ``benchmarks/results/fidelity_layers.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "fidelity.json"
PLOT = HERE / "results" / "fidelity_layers.png"

# The Megatron CPU shims live with the tests (they patch megatron's CUDA-only corners, nothing under test).
sys.path.insert(0, str(ROOT / "tests" / "trainer"))

SIZES = {  # rollouts, new tokens per rollout
    "full": {"bf16": (24, 64), "fp32": (8, 32), "spec": (12, 48)},
    "quick": {"bf16": (8, 32), "fp32": (3, 16), "spec": (4, 32)},
}
SERVER_FLAGS = {
    "bf16": ["--dtype", "bfloat16", "--disable-speculation", "--random-seed", "0"],
    "fp32": ["--disable-speculation", "--random-seed", "0"],
    "spec": ["--random-seed", "0"],  # the default launch: MTP speculation on
}


@dataclass
class Rollout:
    tokens: List[int]
    prompt_len: int
    record: Any  # RoutingRecord
    logprobs: np.ndarray  # rollout logprob of token t given tokens < t, t = 1..T-1 (prompt part may be nan)
    weight_version: Optional[str]


def prompts(n: int, seed: int) -> List[List[int]]:
    """Byte-token prompts (ids 0..255) of 6..14 tokens, fixed by the seed."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(6, 15))).tolist() for _ in range(n)]


@contextmanager
def server(kind: str, url: Optional[str]) -> Iterator[str]:
    if url:
        yield url
        return
    from tests.support.servers import ServerProcess

    proc = ServerProcess(SERVER_FLAGS[kind]).start()
    try:
        t0 = time.monotonic()
        proc.wait_ready()
        print(f"[fidelity] {kind} server ready in {time.monotonic() - t0:.0f}s", flush=True)
        yield proc.url
    finally:
        proc.stop()


def generate(url: str, n: int, new_tokens: int, seed: int, mtp: bool = False) -> List[Any]:
    from sglang_r3.trainer.client import RoutingClient

    out = []
    with RoutingClient(url, timeout=600) as client:
        for i, ids in enumerate(prompts(n, seed)):
            params = {"max_new_tokens": new_tokens, "temperature": 1.0, "sampling_seed": seed * 1000 + i}
            extra = None if mtp else {"return_logprob": True, "logprob_start_len": 0}
            out += client.generate(input_ids=[ids], sampling_params=params, mtp=mtp, extra=extra)
    return out


def as_rollout(r: Any) -> Rollout:
    lps = np.full(r.num_tokens - 1, np.nan)
    meta = r.meta_info
    if "output_token_logprobs" in meta:
        prompt = [lp for lp, *_ in meta["input_token_logprobs"]][1:]
        out = [lp for lp, *_ in meta["output_token_logprobs"]]
        lps = np.array([np.nan if x is None else x for x in prompt + out], dtype=np.float64)
    return Rollout(list(r.tokens), r.prompt_len, r.record, lps, r.weight_version)


# -- trainer side ------------------------------------------------------------------------------------


@dataclass
class TrainerPass:
    logprobs: List[np.ndarray]  # per rollout, t = 1..T-1
    chosen: List[Dict[str, np.ndarray]]  # per rollout: router path -> [T, topk] sorted expert ids


def trainer_pass(model: Any, filler: Any, rollouts: Sequence[Rollout], replay: bool) -> TrainerPass:
    """One Megatron forward per rollout (each its own microbatch) through forward_backward_func."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron_cpu import RouterSpy, causal_mask

    if replay:
        filler.fill_microbatches([([r.record], [r.tokens]) for r in rollouts])
    else:
        filler.clear()
    data = iter(rollouts)

    def forward_step(data_iterator, model):
        ids = torch.tensor(next(data_iterator).tokens).reshape(1, -1)
        S = ids.shape[1]
        loss = model(ids, torch.arange(S)[None], causal_mask(S), labels=torch.roll(ids, -1, 1))
        return loss, lambda out: (out.sum() * 0, {"logprobs": -out[0, :-1].detach().double()})

    spy = RouterSpy(model)
    model.eval()
    try:
        with torch.no_grad():
            out = get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=data,
                model=[model],
                num_microbatches=len(rollouts),
                seq_length=max(len(r.tokens) for r in rollouts),
                micro_batch_size=1,
                forward_only=True,
            )
        if replay:
            filler.finish()  # every microbatch reached every decoder router exactly once
    finally:
        spy.close()
        filler.clear()
    chosen = [{name: spy.chosen(name, i).numpy() for name in spy.seen} for i in range(len(rollouts))]
    return TrainerPass([d["logprobs"].numpy() for d in out], chosen)


def routing_report(filler: Any, layout: Any, rollouts: Sequence[Rollout], tp: TrainerPass):
    from sglang_r3.trainer.diagnostics import fidelity_report, merge_reports

    reports = []
    for r, chosen in zip(rollouts, tp.chosen):
        mine = {s.layer_id: chosen[s.path] for s in filler.decoder_sites}
        reports.append(fidelity_report([r.record], [r.tokens], mine, layout, weight_version=r.weight_version))
    return merge_reports(reports)


def completion_drift(rollouts: Sequence[Rollout], tp: TrainerPass):
    """Δ over the sampled (completion) tokens only: those are the ones whose ratio enters the loss."""
    from sglang_r3.trainer.diagnostics import logprob_drift

    mine = np.concatenate([lp[r.prompt_len - 1 :] for r, lp in zip(rollouts, tp.logprobs)])
    theirs = np.concatenate([r.logprobs[r.prompt_len - 1 :] for r in rollouts])
    return logprob_drift(mine, theirs)


def mtp_agreement(filler: Any, rollouts: Sequence[Any], tp: TrainerPass) -> Dict[str, Any]:
    """Accepted depth-1 MTP-draft entries vs the trainer's MTP router at the same slot
    (``sglang_r3.trainer.diagnostics.mtp_draft_agreement`` says how entries and slots line up)."""
    from sglang_r3.trainer.diagnostics import merge_mtp_agreements, mtp_draft_agreement

    (site,) = [s for s in filler.mtp_sites if s.depth == 1]
    parts = []
    for r, chosen in zip(rollouts, tp.chosen):
        if r.record.mtp is None:
            raise RuntimeError("the speculative server returned no mtp section; was return_routing {'mtp': true} sent?")
        parts.append(mtp_draft_agreement(r.record.mtp, r.tokens, chosen[site.path]))
    agg = merge_mtp_agreements(parts)
    return {
        "mtp_draft_routing_agreement": agg.overall,
        "mtp_draft_entries_compared": agg.compared,
        "mtp_draft_routing_agreement_by_step": {str(s): round(v, 4) for s, v in agg.per_step.items()},
        "mtp_draft_entries_by_step": {str(s): n for s, _, n in agg.by_step},
        "mtp_draft_entries_skipped_last_slot": agg.skipped_last_slot,
    }


def plot(per_layer_off: Dict[int, float], per_layer_on: Dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted(per_layer_off)
    x = np.arange(len(layers))
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    for dx, rates, label in ((-0.2, per_layer_off, "R3 off (trainer routes)"), (0.2, per_layer_on, "R3 on (replayed)")):
        bars = ax.bar(x + dx, [100 * rates[l] for l in layers], 0.4, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)  # a zero bar is invisible without its label
    ax.set_xticks(x, [f"layer {l}" for l in layers])
    ax.set_ylabel("expert-set flips (% of tokens)")
    ax.set_title("bf16 rollout vs fp32 trainer, same weights")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer, shorter rollouts")
    ap.add_argument("--bf16-url", help="a running bf16 server (--dtype bfloat16 --disable-speculation)")
    ap.add_argument("--fp32-url", help="a running fp32 server without speculation")
    ap.add_argument("--spec-url", help="a running default (MTP speculation) server")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = SIZES["quick" if args.quick else "full"]
    t_start = time.monotonic()
    seconds: Dict[str, float] = {}

    from megatron_cpu import converted_embedded_model
    from replay_helpers import embedded_layout
    from sglang_r3.trainer import ReplayFiller
    from sglang_r3.trainer.diagnostics import logprob_drift

    layout = embedded_layout()
    model = converted_embedded_model()
    filler = ReplayFiller(model, layout)
    result: Dict[str, Any] = {"quick": args.quick}

    # 1. fp32 server vs fp32 Megatron: the converter is exact.
    t0 = time.monotonic()
    with server("fp32", args.fp32_url) as url:
        fp32 = [as_rollout(r) for r in generate(url, *sizes["fp32"], seed=1)]
    off = trainer_pass(model, filler, fp32, replay=False)
    full = logprob_drift(np.concatenate(off.logprobs), np.concatenate([r.logprobs for r in fp32]))
    rep = routing_report(filler, layout, fp32, off)
    result.update(
        fp32_logprob_max_abs_diff=full.max_abs_diff,
        fp32_routing_agreement=rep.overall,
        fp32_rollouts=len(fp32),
        fp32_token_layer_pairs=sum(l.tokens for l in rep.layers),
    )
    seconds["fp32"] = time.monotonic() - t0

    # 2. bf16 rollout vs fp32 trainer, R3 off and on.
    t0 = time.monotonic()
    with server("bf16", args.bf16_url) as url:
        bf16 = [as_rollout(r) for r in generate(url, *sizes["bf16"], seed=2)]
    passes = {"r3_off": trainer_pass(model, filler, bf16, replay=False),
              "r3_on": trainer_pass(model, filler, bf16, replay=True)}
    per_layer = {}
    for name, tp in passes.items():
        rep, drift = routing_report(filler, layout, bf16, tp), completion_drift(bf16, tp)
        per_layer[name] = rep.per_layer_flip_rate
        result.update({
            f"flip_rate_{name}": rep.flip_rate,
            f"tokens_with_flip_{name}": rep.token_flip_rate,
            f"per_layer_flip_rate_{name}": {str(k): v for k, v in rep.per_layer_flip_rate.items()},
            f"k3_kl_{name}": drift.k3_kl,
            f"extreme_token_frac_{name}": drift.extreme_token_frac,
            f"logprob_mean_abs_diff_{name}": drift.mean_abs_diff,
        })
    result.update(
        bf16_rollouts=len(bf16),
        bf16_token_layer_pairs=sum(l.tokens for l in rep.layers),
        bf16_tokens=rep.num_tokens,
        bf16_completion_tokens=sum(len(r.tokens) - r.prompt_len for r in bf16),
    )
    seconds["bf16"] = time.monotonic() - t0

    # 3. MTP-draft routing vs the trainer's live MTP router (decoder replayed, as in training).
    t0 = time.monotonic()
    with server("spec", args.spec_url) as url:
        spec = generate(url, *sizes["spec"], seed=3, mtp=True)
    spec_rollouts = [as_rollout(r) for r in spec]
    on = trainer_pass(model, filler, spec_rollouts, replay=True)
    result.update(mtp_agreement(filler, spec_rollouts, on))
    result["spec_rollouts"] = len(spec)
    seconds["spec"] = time.monotonic() - t0

    from benchmarks.run import machine

    result["machine"] = machine()
    result["seconds"] = {k: round(v, 1) for k, v in seconds.items()} | {"total": round(time.monotonic() - t_start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    plot(per_layer["r3_off"], per_layer["r3_on"], args.out.parent / PLOT.name)
    for k in ("fp32_logprob_max_abs_diff", "fp32_routing_agreement", "flip_rate_r3_off", "flip_rate_r3_on",
              "tokens_with_flip_r3_off", "k3_kl_r3_off", "k3_kl_r3_on", "extreme_token_frac_r3_off",
              "extreme_token_frac_r3_on", "mtp_draft_routing_agreement"):
        print(f"{k:32s} {result[k]}")
    return result


if __name__ == "__main__":
    main()
