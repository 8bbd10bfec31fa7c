"""HTTP bodies of a batch -> the tensor each decoder MoE layer's replay object is given: ours vs slime HEAD.

Both sides validate what they receive and produce the same rows; each step below names the file it follows.
slime (THUDM/slime 624b824): ``json.loads`` (utils/http_utils.py) -> ``decode_int32_meta_array``
(utils/misc.py) -> element-count check and reshape (utils/types.py) -> ``validate_rollout_routed_experts_for_replay``
(ray/rollout.py, observability/rollout_data_utils.py) -> ``prepare_routed_experts_for_routing_replay``
(backends/megatron_utils/cp_utils.py) -> ``x[:, layer_id]`` per MoE layer (actor.py ``fill_routing_replay``)
-> ``RoutingReplay.record`` (utils/routing_replay.py: a compact copy).
Ours: ``json.loads`` / ``msgpack.unpackb`` -> ``RoutingRecord.from_wire`` -> ``sglang_r3.trainer.slime.layer_rows``
(check_record per sample, pack_rows, one compact tensor per layer), or ``ReplayFiller.pack`` + ``layer_tensors`` (int64).
Both parse JSON with the stdlib ``json`` (what slime's http_utils and ``httpx.Response.json()`` use).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import json
import time
from typing import Any, Callable, Dict, List

import msgpack
import numpy as np
import orjson
import pybase64
import torch

from benchmarks.shapes import GLM45, Shape, synthetic_record, upstream_routed_experts
from benchmarks.stats import worst_speedup
from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RoutingRecord, bits_for, token_digest


def keep_freed_memory() -> None:
    """Keep freed heap in the process (glibc: no mmap for big blocks, no trim).

    On this VM the first touch of fresh pages costs ~50x a normal host, which would swamp both paths with
    page faults; a trainer process reuses its memory, so both paths are timed warm.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD
    except OSError:
        pass


# -- slime HEAD (THUDM/slime 624b824, 2026-08-21), batch path ----------------------------------------------

@functools.lru_cache(maxsize=None)
def _layout(shape: Shape) -> ModelLayout:
    return shape.layout()


class SlimeArgs:
    """The slime/Megatron arguments its R3 path reads, for one shape at tp = cp = 1, no SP."""

    def __init__(self, shape: Shape):
        self.num_layers = shape.num_hidden_layers
        self.moe_router_topk = shape.topk
        self.num_experts = shape.num_experts
        self.moe_layer_freq = [0 if i < shape.first_dense else 1 for i in range(shape.num_hidden_layers)]
        self.data_pad_size_multiplier = 1
        self.sequence_parallel = False
        self.allgather_cp = False


def slime_decode_int32_meta_array(meta_info: Dict[str, Any], key: str) -> torch.Tensor:
    """slime/utils/misc.py decode_int32_meta_array (string branch)."""
    value = meta_info[key]
    value = pybase64.b64decode(value.encode("ascii"))
    return torch.frombuffer(bytearray(value), dtype=torch.int32)


def slime_sample_routed_experts(meta_info: Dict[str, Any], num_tokens: int, args: SlimeArgs) -> torch.Tensor:
    """slime/utils/types.py Sample._apply_meta_info: decode, element-count check, reshape (start_len 0)."""
    routed_experts = slime_decode_int32_meta_array(meta_info, "routed_experts")
    routed_experts_start_len = int(meta_info.get("routed_experts_start_len", 0) or 0)
    if routed_experts_start_len < 0:
        raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {routed_experts_start_len}.")
    expected_rows = max(0, num_tokens - 1 - routed_experts_start_len)
    expected_numel = expected_rows * args.num_layers * args.moe_router_topk
    if routed_experts.numel() != expected_numel:
        raise ValueError("SGLang routed_experts element count does not match sample tokens")
    return routed_experts.reshape(expected_rows, args.num_layers, args.moe_router_topk)


def slime_validate_for_replay(routed_experts: List[torch.Tensor], args: SlimeArgs) -> None:
    """slime/observability/rollout_data_utils.py validate_rollout_routed_experts_for_replay (called by
    slime/ray/rollout.py after ``torch.as_tensor`` of every sample)."""
    if not routed_experts:
        raise ValueError("R3 is enabled but no rollout routed-experts tensors were returned.")
    num_layers, topk = int(args.num_layers), int(args.moe_router_topk)
    moe_layers = [layer_id for layer_id, freq in enumerate(args.moe_layer_freq[:num_layers]) if int(freq) != 0]
    for sample_idx, experts in enumerate(routed_experts):
        experts = torch.as_tensor(experts)
        if experts.ndim != 3 or tuple(experts.shape[1:]) != (num_layers, topk):
            raise ValueError("Invalid rollout routed-experts shape for R3")
        if experts.shape[0] == 0:
            raise ValueError(f"R3 sample {sample_idx} has no routed-experts rows.")
        if topk > 1:
            missing_layers = [layer_id for layer_id in moe_layers if not torch.count_nonzero(experts[:, layer_id, :])]
            if missing_layers:
                raise ValueError(f"R3 routed-experts capture is all zero for MoE layers {missing_layers}")


def _slime_pad_routed_experts(experts: torch.Tensor, pad: int, num_experts: int) -> torch.Tensor:
    """slime/backends/megatron_utils/cp_utils.py _pad_routed_experts."""
    if pad == 0:
        return experts
    _, num_layers, topk = experts.shape
    pad_experts = (
        torch.arange(pad * num_layers * topk, device=experts.device, dtype=experts.dtype).reshape((pad, num_layers, topk))
        % num_experts
    )
    return torch.cat([experts, pad_experts], dim=0)


def slime_prepare_routed_experts(rollout_routed_experts, tokens, args: SlimeArgs) -> torch.Tensor:
    """cp_utils.py prepare_routed_experts_for_routing_replay at tp = cp = 1 (slice_with_cp is the identity)."""
    assert len(rollout_routed_experts) == len(tokens)
    for experts, token_ids in zip(rollout_routed_experts, tokens, strict=False):
        assert experts.shape[0] == token_ids.shape[0] - 1, f"{experts.shape}, {token_ids.shape}"
    padded = [_slime_pad_routed_experts(e, 1, args.num_experts) for e in rollout_routed_experts]
    pad_size = 1 * args.data_pad_size_multiplier
    routed_experts = torch.cat(padded, dim=0)
    pad = (pad_size - routed_experts.size(0) % pad_size) % pad_size
    return _slime_pad_routed_experts(routed_experts, pad, args.num_experts)


def slime_record(top_indices: torch.Tensor) -> torch.Tensor:
    """slime/utils/routing_replay.py RoutingReplay.record: a compact copy of the layer's non-contiguous view.
    slime pins the copy (``pin_memory=True``), which needs a GPU; here it is plain memory (cheaper for slime)."""
    buf = torch.empty_like(top_indices, device="cpu")
    buf.copy_(top_indices)
    return buf


def slime_batch(bodies: List[bytes], tokens: List[torch.Tensor], args: SlimeArgs) -> List[torch.Tensor]:
    """HTTP bodies of a batch -> the tensor slime records into each decoder MoE layer's RoutingReplay."""
    per_sample = [
        slime_sample_routed_experts(json.loads(b)["meta_info"], int(t.shape[0]), args) for b, t in zip(bodies, tokens)
    ]
    routed = [torch.as_tensor(x) for x in per_sample]  # slime/ray/rollout.py _convert_samples_to_train_data
    slime_validate_for_replay(routed, args)
    x = slime_prepare_routed_experts(routed, tokens, args)  # actor.py fill_routing_replay
    return [slime_record(x[:, layer_id]) for layer_id in range(args.num_layers) if args.moe_layer_freq[layer_id]]


# -- ours, batch path -------------------------------------------------------------------------------------

class _Replay:
    """Stands in for slime's RoutingReplay object: keeps what ``record`` is handed."""

    __slots__ = ("got",)

    def record(self, t: torch.Tensor) -> None:
        self.got = t


def ours_slime_rows(records: List[RoutingRecord], tokens: List[torch.Tensor], layout: ModelLayout) -> List[torch.Tensor]:
    """sglang_r3/trainer/slime/fill.py layer_rows (what fill_routing_replay records, without the model):
    check_record per sample, pack_rows, one compact block per layer."""
    from sglang_r3.trainer.slime import layer_rows
    from sglang_r3.trainer.packing import TokenLayout

    rows = layer_rows(records, tokens, layout, TokenLayout(), layout.moe_layer_ids).rows
    replays = [_Replay() for _ in layout.moe_layer_ids]
    for replay, block in zip(replays, rows):
        replay.record(block)
    return [r.got for r in replays]


def ours_filler_pack(records: List[RoutingRecord], tokens: List[torch.Tensor], layout: ModelLayout) -> List[torch.Tensor]:
    """sglang_r3/trainer/megatron.py ReplayFiller.pack (check_records + pack_rows), then PackedRows.layer_tensors():
    the int64 tensors ReplayFiller.fill hands to Megatron's RouterReplay. ``pack`` is called on a stand-in for
    the filler (it reads only layout, weight_version and token_layout()); binding to a model is not timed."""
    from types import SimpleNamespace

    from sglang_r3.trainer.megatron import ReplayFiller
    from sglang_r3.trainer.packing import TokenLayout

    me = SimpleNamespace(layout=layout, weight_version=None, allow_mixed_versions=False, token_layout=TokenLayout)
    return ReplayFiller.pack(me, records, tokens).layer_tensors()


def ours_batch(bodies: List[bytes], tokens, layout: ModelLayout, binary: bool, bind) -> List[torch.Tensor]:
    load = msgpack.unpackb if binary else json.loads
    return bind([RoutingRecord.from_wire(load(b)["meta_info"]["routing"]) for b in bodies], tokens, layout)


# -- harness ----------------------------------------------------------------------------------------------

def sample_tokens(num_tokens: int, seed: int = 1, vocab: int = 151_552) -> torch.Tensor:
    """The sample's token ids (prompt + completion) as the trainer holds them; GLM-4.5's vocabulary size."""
    return torch.randint(0, vocab, (num_tokens,), generator=torch.Generator().manual_seed(seed))


def bodies(shape: Shape, num_tokens: int, tokens: torch.Tensor, seed: int = 1) -> Dict[str, bytes]:
    """The three HTTP bodies a client receives for one sample of num_tokens tokens (T-1 routing rows).

    Our record carries the digest of ``tokens``, as the server's records carry the digest of their sample.
    """
    rec = dataclasses.replace(synthetic_record(shape, num_tokens - 1, seed=seed), tokens_digest=token_digest(tokens))
    up = pybase64.b64encode(upstream_routed_experts(rec, shape).tobytes()).decode("ascii")
    common = {"text": "", "output_ids": [], "meta_info": {"prompt_tokens": num_tokens // 2, "completion_tokens": num_tokens // 2}}
    meta = lambda extra: {**common, "meta_info": {**common["meta_info"], **extra}}  # noqa: E731
    return {
        "slime": orjson.dumps(meta({"routed_experts": up})),
        "ours_json": orjson.dumps(meta({"routing": rec.to_wire()})),
        "ours_msgpack": msgpack.packb(meta({"routing": rec.to_wire(binary=True, pack_bits=bits_for(shape.num_experts))}), use_bin_type=True),
    }


def batch_lengths(n_mixed: int = 64, long: int = 32768, lo: int = 64, hi: int = 2048, seed: int = 0) -> List[int]:
    """Token counts of the batch: n_mixed samples uniform in [lo, hi] plus one long sample."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(lo, hi + 1, n_mixed)] + [long]


def run_shape(shape: Shape, lengths: List[int], repeats: int) -> Dict[str, Any]:
    tokens = [sample_tokens(n, seed=i + 1) for i, n in enumerate(lengths)]
    per = [bodies(shape, n, t, seed=i + 1) for i, (n, t) in enumerate(zip(lengths, tokens))]
    b = {k: [p[k] for p in per] for k in ("slime", "ours_json", "ours_msgpack")}
    del per
    layout, args = _layout(shape), SlimeArgs(shape)
    paths: Dict[str, Callable[[], List[torch.Tensor]]] = {
        "slime": lambda: slime_batch(b["slime"], tokens, args),
        "ours_json": lambda: ours_batch(b["ours_json"], tokens, layout, False, ours_slime_rows),
        "ours_msgpack": lambda: ours_batch(b["ours_msgpack"], tokens, layout, True, ours_slime_rows),
        "ours_json_filler_int64": lambda: ours_batch(b["ours_json"], tokens, layout, False, ours_filler_pack),
    }
    # Same output: every path ends at one [rows, topk] tensor per decoder MoE layer with the same ids
    # (slime records int32, our slime adapter the records' uint8/uint16, the filler int64 for RouterReplay).
    # Pad rows (one per sample, the last token's) only need valid distinct ids: slime fills them with
    # arange over all layers, ours over the MoE layers.
    rows = sum(lengths)
    real = torch.ones(rows, dtype=torch.bool)
    real[torch.tensor(np.cumsum(lengths) - 1)] = False
    ref = paths["slime"]()
    for name, fn in paths.items():
        got = fn()
        assert len(got) == len(ref) == shape.num_moe, name
        for g, r in zip(got, ref):
            assert g.shape == (rows, shape.topk) and g.is_contiguous(), name
            g64 = g.to(torch.int64)
            assert torch.equal(g64[real], r.to(torch.int64)[real]), name
            pad = g64[~real]
            assert int(pad.max()) < shape.num_experts and bool((pad.sort(1).values.diff(1) > 0).all()), name
    del ref, got
    times: Dict[str, List[float]] = {k: [] for k in paths}
    names = list(paths)
    for i in range(repeats + 1):  # +1: warm-up, dropped
        for name in names[i % len(names):] + names[: i % len(names)]:  # rotated order
            gc.collect()
            t = time.perf_counter()
            out = paths[name]()
            dt = time.perf_counter() - t
            del out
            if i:
                times[name].append(dt)
    from benchmarks.stats import bootstrap_ci, ratio_ci

    return {
        "shape": shape.name,
        "samples": len(lengths),
        "tokens": rows,
        "repeats": repeats,
        "body_mbytes": {k: round(sum(map(len, v)) / 1e6, 1) for k, v in b.items()},
        "seconds": {k: {m: round(x, 4) for m, x in bootstrap_ci(v).items() if m != "n"} for k, v in times.items()},
        "speedup_vs_slime": {k: ratio_ci(times["slime"], times[k]) for k in paths if k != "slime"},
    }


def run(repeats: int = 5, n_mixed: int = 64, long: int = 32768, shapes=None) -> Dict[str, Any]:
    from benchmarks.shapes import SHAPES

    keep_freed_memory()
    torch.set_num_threads(1)
    shapes = shapes or [GLM45, next(s for s in SHAPES if s.name == "Qwen3-30B-A3B")]
    lengths = batch_lengths(n_mixed, long)
    per = {s.name: run_shape(s, lengths, repeats) for s in shapes}
    return {
        "lengths": {"mixed": n_mixed, "long": long, "total_tokens": sum(lengths)},
        "per_shape": per,
        "decode_bind_speedup_vs_slime": worst_speedup(per, "ours_json"),
        "decode_bind_speedup_vs_slime_msgpack": worst_speedup(per, "ours_msgpack"),
        "decode_bind_speedup_vs_slime_filler_int64": worst_speedup(per, "ours_json_filler_int64"),
    }
