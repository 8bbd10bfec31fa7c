"""``python -m benchmarks.slime_fill [--quick]``: HTTP bodies of a batch -> every decoder MoE router's slime replay.

Both sides fill the same real megatron-core model (the shape's layers, experts and top-k; tiny hidden size),
built as slime builds it (tests/trainer/slime_reference.py applies slime's megatron.patch R3 hunks, so each
router carries its ``routing_replay``), both validate what they receive, and both leave the same tensors in
every router's replay (checked, pad rows included).

slime HEAD (THUDM/slime 624b824), re-implemented with the file of each step:
``json.loads`` (slime/utils/http_utils.py) -> ``decode_int32_meta_array`` (slime/utils/misc.py), element-count
check and reshape (slime/utils/types.py ``_apply_meta_info``) -> ``torch.as_tensor`` and
``validate_rollout_routed_experts_for_replay`` (slime/ray/rollout.py, slime/observability/rollout_data_utils.py)
-> per microbatch ``prepare_routed_experts_for_routing_replay`` (slime/backends/megatron_utils/cp_utils.py) and
the positional loop of ``fill_routing_replay`` (slime/backends/megatron_utils/actor.py): ``x[:, layer_id]``
recorded into ``RoutingReplay.all_routing_replays[i]`` (slime/utils/routing_replay.py ``record``: a compact copy).
The decode, validation and preparation pieces are benchmarks/decode_bind.py's; the loop and the replay are
tests/trainer/slime_reference.py's.

Ours: ``json.loads`` (or ``msgpack.unpackb``) -> ``RoutingRecord.from_wire`` (sglang_r3/core/record/records.py) ->
``fill_routing_replay`` (sglang_r3/trainer/slime/fill.py: every record checked — fingerprint, layers, rows,
token digest, id range, distinct ids — then packed as slime packs, one compact block per layer, recorded into
each router's own replay). ``ours_upstream_arrays``: slime's own decode, then ``fill_routing_replay`` on its
int32 arrays (a slime user who keeps upstream's ``return_routed_experts``).

slime's fill runs only on a model without MTP layers (with them its loop raises, seed 001), so both sides fill
the shape's decoder without its MTP block; MTP routers add nothing to the fill on our side (they get no rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import msgpack
import torch

from benchmarks import decode_bind
from benchmarks.shapes import GLM45, SHAPES, Shape
from benchmarks.stats import worst_speedup
from sglang_r3.core.record import RoutingRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))

MAX_TOKENS_PER_MICROBATCH = 32768  # as slime's --max-tokens-per-gpu packs them: consecutive samples


def microbatch_slices(lengths: Sequence[int], budget: int = MAX_TOKENS_PER_MICROBATCH) -> List[slice]:
    """Consecutive samples per microbatch, at most `budget` tokens each (a longer sample goes alone)."""
    out, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and used + n > budget:
            out.append(slice(start, i))
            start, used = i, 0
        used += n
    out.append(slice(start, len(lengths)))
    return out


def build_model(shape: Shape):
    """The shape's decoder as a real megatron-core GPTModel (hidden 16), each router with slime's replay."""
    from megatron_cpu import TinyMoeSpec, build_gpt
    import slime_reference

    slime_reference.RoutingReplay.all_routing_replays = []
    spec = TinyMoeSpec(
        num_layers=shape.num_hidden_layers, dense_first=shape.first_dense, num_experts=shape.num_experts,
        topk=shape.topk, hidden=16, heads=1, ffn=16, moe_ffn=4, vocab=64, mtp_layers=shape.num_mtp,
        routing_replay=False,
    )
    model = build_gpt(spec, perform_initialization=False)
    return model, list(slime_reference.RoutingReplay.all_routing_replays)


def _replayed(replays) -> List[List[torch.Tensor]]:
    return [list(r.top_indices_list) for r in replays]


def _same(got: List[List[torch.Tensor]], ref: List[List[torch.Tensor]]) -> bool:
    """Same ids in every router's every entry (slime records int32, ours the records' uint8)."""
    return len(got) == len(ref) and all(
        len(g) == len(r) and all(x.shape == y.shape and torch.equal(x.to(torch.int32), y.to(torch.int32))
                                 for x, y in zip(g, r))
        for g, r in zip(got, ref)
    )


def run_shape(shape: Shape, lengths: List[int], repeats: int) -> Dict[str, Any]:
    import slime_reference
    from sglang_r3.trainer.slime import fill_routing_replay

    shape = dataclasses.replace(shape, num_mtp=0)
    layout, args = shape.layout(), decode_bind.SlimeArgs(shape)
    model, replays = build_model(shape)
    slime_reference.RoutingReplay.all_routing_replays = replays
    tokens = [decode_bind.sample_tokens(n, seed=i + 1) for i, n in enumerate(lengths)]
    per = [decode_bind.bodies(shape, n, t, seed=i + 1) for i, (n, t) in enumerate(zip(lengths, tokens))]
    b = {k: [p[k] for p in per] for k in ("slime", "ours_json", "ours_msgpack")}
    del per
    mbs = microbatch_slices(lengths)

    def slime_path() -> None:
        per_sample = [
            decode_bind.slime_sample_routed_experts(json.loads(body)["meta_info"], int(t.shape[0]), args)
            for body, t in zip(b["slime"], tokens)
        ]
        routed = [torch.as_tensor(x) for x in per_sample]  # slime/ray/rollout.py
        decode_bind.slime_validate_for_replay(routed, args)
        slime_reference.slime_positional_fill([model], [(routed[s], tokens[s]) for s in mbs], shape.num_experts)

    def ours(load: Callable[[bytes], Any], bodies: List[bytes]) -> Callable[[], None]:
        def path() -> None:
            records = [RoutingRecord.from_wire(load(body)["meta_info"]["routing"]) for body in bodies]
            fill_routing_replay([model], [(records[s], tokens[s]) for s in mbs], layout)

        return path

    def ours_upstream_arrays() -> None:
        per_sample = [
            decode_bind.slime_sample_routed_experts(json.loads(body)["meta_info"], int(t.shape[0]), args)
            for body, t in zip(b["slime"], tokens)
        ]
        fill_routing_replay([model], [(per_sample[s], tokens[s]) for s in mbs], layout)

    paths: Dict[str, Callable[[], None]] = {
        "slime": slime_path,
        "ours_json": ours(json.loads, b["ours_json"]),
        "ours_msgpack": ours(msgpack.unpackb, b["ours_msgpack"]),
        "ours_upstream_arrays": ours_upstream_arrays,
    }
    # Same output: every router's replay holds the same rows, microbatch by microbatch, pad rows included.
    ref = None
    for name, fn in paths.items():
        fn()
        got = _replayed(replays)
        slime_reference.RoutingReplay.clear_all()
        if ref is None:
            ref = got
            assert len(ref) == shape.num_moe and all(len(r) == len(mbs) for r in ref)
        else:
            assert _same(got, ref), name
        del got
    del ref

    times: Dict[str, List[float]] = {k: [] for k in paths}
    names = list(paths)
    for i in range(repeats + 1):  # +1: warm-up, dropped
        for name in names[i % len(names):] + names[: i % len(names)]:  # rotated order
            gc.collect()
            t = time.perf_counter()
            paths[name]()
            dt = time.perf_counter() - t
            slime_reference.RoutingReplay.clear_all()
            if i:
                times[name].append(dt)
    from benchmarks.stats import bootstrap_ci, ratio_ci

    return {
        "shape": shape.name,
        "samples": len(lengths),
        "tokens": sum(lengths),
        "microbatches": len(mbs),
        "moe_layers": shape.num_moe,
        "repeats": repeats,
        "seconds": {k: {m: round(x, 4) for m, x in bootstrap_ci(v).items() if m != "n"} for k, v in times.items()},
        "speedup_vs_slime": {k: ratio_ci(times["slime"], times[k]) for k in paths if k != "slime"},
    }


def run(repeats: int = 5, n_mixed: int = 64, long: int = 32768, shapes=None) -> Dict[str, Any]:
    from megatron_cpu import init_megatron_cpu
    import slime_reference

    decode_bind.keep_freed_memory()
    torch.set_num_threads(1)
    init_megatron_cpu()
    undo = slime_reference.install()
    saved = os.environ.get("ENABLE_ROUTING_REPLAY")
    os.environ["ENABLE_ROUTING_REPLAY"] = "1"  # while the models are built, as in slime's actors
    try:
        shapes = shapes or [GLM45, next(s for s in SHAPES if s.name == "Qwen3-30B-A3B")]
        lengths = decode_bind.batch_lengths(n_mixed, long)
        per = {s.name: run_shape(s, lengths, repeats) for s in shapes}
    finally:
        undo()
        if saved is None:
            os.environ.pop("ENABLE_ROUTING_REPLAY", None)
        else:
            os.environ["ENABLE_ROUTING_REPLAY"] = saved
    return {
        "lengths": {"mixed": n_mixed, "long": long, "total_tokens": sum(lengths)},
        "per_shape": per,
        "slime_fill_speedup": worst_speedup(per, "ours_json"),
        "slime_fill_speedup_msgpack": worst_speedup(per, "ours_msgpack"),
        "slime_fill_speedup_upstream_arrays": worst_speedup(per, "ours_upstream_arrays"),
    }


def run_isolated(repeats: int = 5) -> Dict[str, Any]:
    """``run`` in a child process: it initialises megatron on the CPU (a gloo group, device shims) and applies
    slime's patch stand-in to megatron-core, none of which may leak into the caller (benchmarks/run.py)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "slime_fill.json"
        cmd = [sys.executable, "-m", "benchmarks.slime_fill", "--repeats", str(repeats), "--out", str(out)]
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 repeats instead of 9")
    ap.add_argument("--repeats", type=int, help="timed repeats per path (overrides --quick)")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    a = ap.parse_args(argv)
    res = run(repeats=a.repeats or (3 if a.quick else 9))
    text = json.dumps(res, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
