"""Bytes on the wire per token: ours (JSON and msgpack) vs upstream's base64-int32 field vs the information bound.

Synthetic records of real model shapes are serialized exactly as server/wire.py does
(JSON: orjson of the output dict; msgpack: ``msgpack.packb(..., use_bin_type=True)`` with the
bit-packed record). ``measure_live`` does the same against a running server, from the HTTP bodies.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Dict, List

import httpx
import msgpack
import orjson

from benchmarks.shapes import GLM45, SHAPES, WIDE_SHAPES, Shape, synthetic_record, upstream_routed_experts
from sglang_r3.core.record import RoutingRecord, bits_for

MSGPACK = "application/msgpack"


def _json(meta: Dict[str, Any]) -> int:
    return len(orjson.dumps({"meta_info": meta}))


def _msgpack(meta: Dict[str, Any]) -> int:
    return len(msgpack.packb({"meta_info": meta}, use_bin_type=True))


def shape_sizes(shape: Shape, rows: int) -> Dict[str, Any]:
    # Identity fields as the server's records carry them (a 32-hex digest, SGLang's default weight version).
    rec = dataclasses.replace(
        synthetic_record(shape, rows, seed=hash(shape.name) & 0xFFFF), tokens_digest="0" * 32, weight_version="default"
    )
    bits = bits_for(shape.num_experts)
    packed = rec.to_wire(binary=True, pack_bits=bits)
    # what the server's msgpack path sends must decode back to the same ids
    assert (RoutingRecord.from_wire(msgpack.unpackb(msgpack.packb(packed, use_bin_type=True))).experts == rec.experts).all()
    up = base64.b64encode(upstream_routed_experts(rec, shape).tobytes()).decode("ascii")
    per_tok = lambda n: n / rows  # noqa: E731
    ours_json = per_tok(_json({"routing": rec.to_wire()}))
    ours_bin_unpacked = per_tok(_msgpack({"routing": rec.to_wire(binary=True)}))
    ours_bin = per_tok(_msgpack({"routing": packed}))
    upstream_json = per_tok(_json({"routed_experts": up}))
    # Upstream's array in a binary transport (what SGLang would send if its /generate spoke msgpack): raw int32.
    upstream_bin = per_tok(_msgpack({"routed_experts": upstream_routed_experts(rec, shape).tobytes()}))
    bound = shape.num_moe * shape.bound_bits_per_layer_token() / 8
    fixed_width = shape.num_moe * shape.topk * bits / 8  # every id at ceil(log2 E) bits, nothing else
    return {
        "shape": f"{shape.num_hidden_layers}L/{shape.first_dense}dense/{shape.num_experts}E/top{shape.topk}",
        "rows": rows,
        "pack_bits": bits,
        "upstream_json_bytes_per_token": round(upstream_json, 2),
        "ours_json_bytes_per_token": round(ours_json, 2),
        "ours_msgpack_unpacked_bytes_per_token": round(ours_bin_unpacked, 2),
        "ours_msgpack_bytes_per_token": round(ours_bin, 2),
        "upstream_msgpack_bytes_per_token": round(upstream_bin, 2),
        "bound_bytes_per_token": round(bound, 2),
        "fixed_width_bytes_per_token": round(fixed_width, 2),
        "upstream_over_ours_binary": round(upstream_bin / ours_bin, 3),
        "ours_msgpack_over_fixed_width": round(ours_bin / fixed_width, 4),
        "ours_json_over_fixed_width": round(ours_json / fixed_width, 4),
        "record_overhead_bytes_msgpack": round((ours_bin - fixed_width) * rows, 1),
        "upstream_over_ours_json": round(upstream_json / ours_json, 3),
        "upstream_over_ours_msgpack": round(upstream_json / ours_bin, 3),
        "ours_json_over_bound": round(ours_json / bound, 4),
        "ours_msgpack_over_bound": round(ours_bin / bound, 4),
    }


def synthetic(rows: int = 4096, short_rows=(64, 512)) -> Dict[str, Any]:
    per_shape = {s.name: shape_sizes(s, rows) for s in SHAPES}
    short = {n: {s.name: shape_sizes(s, n)["ours_msgpack_over_fixed_width"] for s in SHAPES} for n in short_rows}
    glm = per_shape[GLM45.name]
    return {
        "per_shape": per_shape,
        "ours_msgpack_over_fixed_width_short_records": short,
        "record_size_ratio_same_transport": {
            "json_over_json": glm["upstream_over_ours_json"],
            "binary_over_binary": glm["upstream_over_ours_binary"],
        },
        "record_size_vs_fixed_width_bound": {k: v["ours_msgpack_over_fixed_width"] for k, v in per_shape.items()},
        "record_size_ratio_vs_upstream": glm["upstream_over_ours_msgpack"],
        "record_size_ratio_vs_upstream_json": glm["upstream_over_ours_json"],
        "record_size_vs_bound": max(v["ours_msgpack_over_bound"] for v in per_shape.values()),
        "record_size_vs_bound_json": max(v["ours_json_over_bound"] for v in per_shape.values()),
        # > 256 experts (uint16 ids), beside GLM-4.5's: reported, not part of the goal keys above.
        "wide_expert_shapes": {s.name: shape_sizes(s, rows) for s in WIDE_SHAPES},
    }


def measure_live(url: str, prompts: List[str], max_new_tokens: int) -> Dict[str, Any]:
    """Routing bytes per token in real /generate responses: (with routing - without) / rows."""
    sp = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    body = {"text": prompts, "sampling_params": sp}

    def post(extra: Dict[str, Any], binary: bool) -> httpx.Response:
        headers = {"Accept": MSGPACK} if binary else {}
        r = httpx.post(url + "/generate", json={**body, **extra}, headers=headers, timeout=600)
        r.raise_for_status()
        return r

    out: Dict[str, Any] = {}
    base = {b: len(post({}, b).content) for b in (False, True)}
    rj, rb = post({"return_routing": True}, False), post({"return_routing": True}, True)
    recs_j = [RoutingRecord.from_wire(o["meta_info"]["routing"]) for o in rj.json()]
    recs_b = [RoutingRecord.from_wire(o["meta_info"]["routing"]) for o in msgpack.unpackb(rb.content)]
    assert all((a.experts == b.experts).all() for a, b in zip(recs_j, recs_b)), "JSON and msgpack records differ"
    rows = sum(r.num_tokens for r in recs_j)
    up = post({"return_routed_experts": True}, False)
    raw_b = msgpack.unpackb(rb.content)[0]["meta_info"]["routing"]
    n_moe, topk = len(recs_j[0].layers), recs_j[0].topk
    out.update(
        rows=rows,
        moe_layers=n_moe,
        topk=topk,
        pack_bits=(raw_b.get("packing") or {}).get("bits"),
        ours_json_bytes_per_token=round((len(rj.content) - base[False]) / rows, 2),
        ours_msgpack_bytes_per_token=round((len(rb.content) - base[True]) / rows, 2),
        upstream_json_bytes_per_token=round((len(up.content) - base[False]) / rows, 2),
    )
    out["upstream_over_ours_msgpack"] = round(out["upstream_json_bytes_per_token"] / out["ours_msgpack_bytes_per_token"], 3)
    return out
