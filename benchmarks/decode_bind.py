"""HTTP body -> per-layer replay tensors (torch int64 [T, topk] per main MoE layer): ours vs slime.

slime's path, re-implemented faithfully (THUDM/slime):
  * rollout (``slime/rollout/sglang_rollout.py``): ``np.frombuffer(pybase64.b64decode(meta_info["routed_experts"]
    .encode("ascii")), dtype=np.int32).reshape(len(tokens) - 1, num_layers, topk)``;
  * actor (``_get_rollout_data``): ``torch.from_numpy``;
  * ``fill_routing_replay`` (``backends/megatron_utils/actor.py``): ``pad_func(r, 1)`` (one arange % num_experts row
    for the last token), ``slice_with_cp`` (identity at cp=1), ``torch.cat`` of the microbatch, pad to a multiple of
    tp_size * data_pad_size_multiplier (1 here), then for every layer id skipping dense ones by position,
    ``RoutingReplay.record(rollout_routed_experts[:, layer_id])``.
The replay tensors are then made int64 (``.long()``), the dtype Megatron's RouterReplay indexes with, so both
paths end at the same contiguous int64 tensors (checked equal).

Ours: the response body -> ``RoutingRecord.from_wire`` (main MoE layers only, uint8) -> ``bind_layer_major``:
``check_records`` against the layout and the sample's token ids (what ``ReplayFiller.fill`` refuses on:
fingerprint, layers, rows, tokens digest, id range, repeated ids), then ``pack_rows`` + ``layer_tensors`` (one
transpose + one widening pass) -> one contiguous [T, topk] tensor per main MoE layer. slime's path checks
nothing, so ours is timed doing strictly more work.

Both parse the JSON body with the stdlib ``json`` (what ``httpx.Response.json()`` uses in both clients).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import json
import statistics
import time
from typing import Any, Callable, Dict, List

import msgpack
import numpy as np
import orjson
import pybase64
import torch

from benchmarks.shapes import GLM45, Shape, synthetic_record, upstream_routed_experts
from sglang_r3.layout import ModelLayout
from sglang_r3.record import RoutingRecord, bits_for, token_digest


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


# -- slime ------------------------------------------------------------------------------------------------

def slime_decode_bind(body: bytes, shape: Shape, num_tokens: int) -> List[torch.Tensor]:
    meta = json.loads(body)["meta_info"]
    arr = np.frombuffer(pybase64.b64decode(meta["routed_experts"].encode("ascii")), dtype=np.int32).reshape(
        num_tokens - 1, shape.num_hidden_layers, shape.topk
    )
    experts = torch.from_numpy(arr)  # read-only buffer: torch warns, slime does the same

    def pad_func(x: torch.Tensor, pad: int) -> torch.Tensor:
        _, num_layers, topk = x.shape
        fill = torch.arange(pad * num_layers * topk, dtype=x.dtype).reshape((pad, num_layers, topk)) % shape.num_experts
        return torch.cat([x, fill], dim=0)

    batch = [pad_func(r, 1) for r in [experts]]
    batch = [r for r in batch]  # slice_with_cp: identity at cp_size=1
    x = torch.cat(batch, dim=0)
    pad = (1 - x.size(0) % 1) % 1  # tp_size * data_pad_size_multiplier = 1
    if pad:
        x = pad_func(x, pad)
    moe_layer_freq = [0 if i < shape.first_dense else 1 for i in range(shape.num_hidden_layers)]
    replays = []
    for layer_id in range(shape.num_hidden_layers):
        if moe_layer_freq[layer_id] == 0:
            continue
        replays.append(x[:, layer_id])  # RoutingReplay.record(...)
    return [r.long() for r in replays]


# -- ours -------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _layout(shape: Shape) -> ModelLayout:
    return shape.layout()


def bind_layer_major(record: RoutingRecord, shape: Shape, tokens: torch.Tensor) -> List[torch.Tensor]:
    """The shipped trainer path (what ``ReplayFiller.fill`` does before handing rows to the routers): check the
    record against the layout and the sample's token ids, lay it out as slime does in the records' compact dtype
    (``pack_rows``), then one layer-major int64 [T, topk] tensor per main MoE layer."""
    from sglang_r3.trainer.packing import TokenLayout, pack_rows
    from sglang_r3.trainer.validate import check_records

    check_records([record], [tokens], _layout(shape))
    return pack_rows([record.experts], shape.num_experts, TokenLayout()).layer_tensors()


def ours_json_decode_bind(body: bytes, shape: Shape, tokens: torch.Tensor, bind=bind_layer_major) -> List[torch.Tensor]:
    return bind(RoutingRecord.from_wire(json.loads(body)["meta_info"]["routing"]), shape, tokens)


def ours_msgpack_decode_bind(body: bytes, shape: Shape, tokens: torch.Tensor, bind=bind_layer_major) -> List[torch.Tensor]:
    return bind(RoutingRecord.from_wire(msgpack.unpackb(body)["meta_info"]["routing"]), shape, tokens)


# -- harness ----------------------------------------------------------------------------------------------

def sample_tokens(num_tokens: int, seed: int = 1, vocab: int = 151_552) -> torch.Tensor:
    """The sample's token ids (prompt + completion) as the trainer holds them; GLM-4.5's vocabulary size."""
    return torch.randint(0, vocab, (num_tokens,), generator=torch.Generator().manual_seed(seed))


def bodies(shape: Shape, num_tokens: int, tokens: torch.Tensor) -> Dict[str, bytes]:
    """The three HTTP bodies a client receives for one sample of num_tokens tokens (T-1 routing rows).

    Our record carries the digest of ``tokens``, as the server's records carry the digest of their sample.
    """
    rec = dataclasses.replace(synthetic_record(shape, num_tokens - 1, seed=1), tokens_digest=token_digest(tokens))
    up = pybase64.b64encode(upstream_routed_experts(rec, shape).tobytes()).decode("ascii")
    common = {"text": "", "output_ids": [], "meta_info": {"prompt_tokens": num_tokens // 2, "completion_tokens": num_tokens // 2}}
    meta = lambda extra: {**common, "meta_info": {**common["meta_info"], **extra}}  # noqa: E731
    return {
        "slime": orjson.dumps(meta({"routed_experts": up})),
        "ours_json": orjson.dumps(meta({"routing": rec.to_wire()})),
        "ours_msgpack": msgpack.packb(meta({"routing": rec.to_wire(binary=True, pack_bits=bits_for(shape.num_experts))}), use_bin_type=True),
    }


def run(num_tokens: int = 32768, repeats: int = 5, shape: Shape = GLM45) -> Dict[str, Any]:
    keep_freed_memory()
    torch.set_num_threads(1)
    tokens = sample_tokens(num_tokens)
    b = bodies(shape, num_tokens, tokens)
    paths: Dict[str, Callable[[], List[torch.Tensor]]] = {
        "slime": lambda: slime_decode_bind(b["slime"], shape, num_tokens),
        "ours_json": lambda: ours_json_decode_bind(b["ours_json"], shape, tokens),
        "ours_msgpack": lambda: ours_msgpack_decode_bind(b["ours_msgpack"], shape, tokens),
    }
    # Correctness first: the same int64 tensors from every path (the last row is padding: any valid distinct ids).
    ref = paths["slime"]()
    for name, fn in paths.items():
        got = fn()
        assert len(got) == len(ref) == shape.num_moe, name
        for g, r in zip(got, ref):
            assert g.dtype == torch.int64 and g.shape == (num_tokens, shape.topk) and g.is_contiguous(), name
            assert torch.equal(g[:-1], r[:-1]), name
            assert len(set(g[-1].tolist())) == shape.topk and int(g[-1].max()) < shape.num_experts, name
    del ref, got
    times: Dict[str, List[float]] = {k: [] for k in paths}
    for i in range(repeats + 1):  # +1: warm-up, dropped
        order = list(paths) if i % 2 == 0 else list(reversed(paths))  # interleaved, alternating order
        for name in order:
            gc.collect()
            t = time.perf_counter()
            out = paths[name]()
            dt = time.perf_counter() - t
            del out
            if i:
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = lambda k: statistics.median(s / o for s, o in zip(times["slime"], times[k]))  # noqa: E731
    return {
        "shape": shape.name,
        "num_tokens": num_tokens,
        "repeats": repeats,
        "body_bytes": {k: len(v) for k, v in b.items()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "decode_bind_speedup_vs_slime": round(ratio("ours_json"), 3),
        "decode_bind_speedup_vs_slime_msgpack": round(ratio("ours_msgpack"), 3),
    }
