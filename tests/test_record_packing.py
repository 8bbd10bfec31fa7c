"""Bit-packed binary form of routing records (no servers)."""

from __future__ import annotations

import msgpack
import numpy as np
import orjson
import pytest

from sglang_r3.record import MtpRouting, RecordError, RoutingRecord, bits_for, pack_ids, unpack_ids


def _topk_ids(rng, rows: int, experts: int, topk: int, dtype) -> np.ndarray:
    # distinct ids within a row, like a real router's top-k
    return np.argsort(rng.random((rows, experts)), axis=1)[:, :topk].astype(dtype)


def _record(rng, tokens=37, layers=(1, 2, 4), experts=128, topk=8, mtp=False) -> RoutingRecord:
    dtype = np.uint8 if experts <= 256 else np.uint16
    ids = _topk_ids(rng, tokens * len(layers), experts, topk, dtype).reshape(tokens, len(layers), topk)
    section = None
    if mtp:
        n = 11
        section = MtpRouting(
            positions=np.arange(n, dtype=np.int32),
            depth=np.ones(n, np.uint8),
            step=(np.arange(n) % 3).astype(np.uint8),
            accepted=np.arange(n) % 2 == 0,
            experts=_topk_ids(rng, n, experts, topk, dtype),
            tokens=np.arange(n, dtype=np.int32) + 5,
            rounds=np.arange(n, dtype=np.int32),
        )
    return RoutingRecord(layout="abc", start=3, layers=layers, experts=ids, mtp=section)


@pytest.mark.parametrize("experts,bits", [(2, 1), (8, 3), (128, 7), (129, 8), (160, 8), (256, 8), (257, 9), (1024, 10), (65536, 16)])
def test_bits_for(experts, bits):
    assert bits_for(experts) == bits


@pytest.mark.parametrize("experts", [3, 64, 128, 160, 256, 300, 1000, 40000])
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1001])
def test_pack_unpack_round_trip(experts, count):
    rng = np.random.default_rng(experts * 7 + count)
    dtype = np.uint8 if experts <= 256 else np.uint16
    ids = rng.integers(0, experts, count).astype(dtype)
    bits = bits_for(experts)
    raw = pack_ids(ids, bits)
    assert len(raw) == (count * bits + 7) // 8
    back = unpack_ids(raw, count, bits, dtype)
    assert back.dtype == dtype and np.array_equal(back, ids)


def test_pack_is_msb_first_bit_stream():
    # 3 ids at 3 bits: 101 011 111 -> 10101111 1(0000000)
    assert pack_ids(np.array([5, 3, 7], np.uint8), 3) == bytes([0b10101111, 0b10000000])


def test_pack_refuses_ids_that_do_not_fit():
    with pytest.raises(RecordError, match="does not fit"):
        pack_ids(np.array([0, 128], np.uint8), 7)


@pytest.mark.parametrize("experts", [128, 160, 256, 512])
@pytest.mark.parametrize("mtp", [False, True])
def test_record_round_trip_through_msgpack(experts, mtp):
    rec = _record(np.random.default_rng(experts), experts=experts, mtp=mtp)
    bits = bits_for(experts)
    wire = rec.to_wire(binary=True, pack_bits=bits)
    assert wire["packing"] == {"bits": bits}
    assert wire["dtype"] == str(rec.experts.dtype)
    assert len(wire["experts"]) == (rec.experts.size * bits + 7) // 8
    back = RoutingRecord.from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False))
    assert back.layers == rec.layers and back.start == rec.start
    assert back.experts.dtype == rec.experts.dtype and np.array_equal(back.experts, rec.experts)
    if mtp:
        assert wire["mtp"]["packing"] == {"bits": bits}
        assert np.array_equal(back.mtp.experts, rec.mtp.experts)
        assert np.array_equal(back.mtp.positions, rec.mtp.positions)
        assert np.array_equal(back.mtp.accepted, rec.mtp.accepted)


def test_packed_is_smaller_for_128_experts():
    rec = _record(np.random.default_rng(0), tokens=64, experts=128)
    plain = msgpack.packb(rec.to_wire(binary=True), use_bin_type=True)
    packed = msgpack.packb(rec.to_wire(binary=True, pack_bits=7), use_bin_type=True)
    assert len(plain) - len(packed) >= rec.experts.size // 8 - 16


def test_json_form_keeps_its_contract():
    rec = _record(np.random.default_rng(1))
    wire = rec.to_wire()
    assert "packing" not in wire and wire["dtype"] == "uint8" and isinstance(wire["experts"], str)
    assert np.array_equal(RoutingRecord.from_wire(orjson.loads(orjson.dumps(wire))).experts, rec.experts)
    with pytest.raises(RecordError, match="binary"):
        rec.to_wire(binary=False, pack_bits=7)


def test_unpacked_binary_still_reads():
    rec = _record(np.random.default_rng(2))
    assert np.array_equal(RoutingRecord.from_wire(rec.to_wire(binary=True)).experts, rec.experts)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda w: w.update(experts=w["experts"][:-1]), "expected"),
        (lambda w: w.update(packing={"bits": 99}), "does not fit"),
        (lambda w: w.update(packing={"wide": 7}), "packing must be"),
        (lambda w: w.update(experts=12), "must be bytes"),
    ],
)
def test_malformed_packed_record_is_refused(mutate, match):
    wire = _record(np.random.default_rng(3)).to_wire(binary=True, pack_bits=7)
    mutate(wire)
    with pytest.raises(RecordError, match=match):
        RoutingRecord.from_wire(wire)
