"""Wire forms of routing records: bit-packed binary form and identity fields (no servers)."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import orjson
import pytest

from sglang_r3.core.record import MtpRouting, RecordError, RoutingRecord, bits_for, pack_ids, token_digest, unpack_ids

pytestmark = pytest.mark.fast


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


@pytest.mark.parametrize("bits", range(1, 8))
@pytest.mark.parametrize("count", [1, 8, 9, 57, 8 * (1 << 15) + 3])
def test_unpack_reads_the_msb_first_stream_as_numpy_unpackbits_does(bits, count):
    # Oracle: numpy's own bit unpacking of the byte stream, read `bits` at a time; sizes cross the
    # unpacker's block size and end mid-group.
    rng = np.random.default_rng(bits * 1000 + count)
    raw = rng.integers(0, 256, (count * bits + 7) // 8, dtype=np.uint8)
    raw[-1] &= np.uint8((0xFF << (8 * len(raw) - count * bits)) & 0xFF)  # unused tail bits are zero
    stream = np.unpackbits(raw)[: count * bits].reshape(count, bits)
    want = (stream.astype(np.int64) << np.arange(bits - 1, -1, -1)).sum(1)
    got = unpack_ids(raw.tobytes(), count, bits, np.uint8)
    assert np.array_equal(got, want)
    assert pack_ids(got, bits) == raw.tobytes()


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


# Identity fields ------------------------------------------------------------------------------


def _digest_oracle(ids) -> str:
    """The documented definition, written without numpy: blake2b-128 of little-endian int64 ids."""
    import hashlib
    import struct

    return hashlib.blake2b(struct.pack(f"<{len(ids)}q", *ids), digest_size=16).hexdigest()


def test_token_digest_is_blake2b_of_little_endian_int64_ids_in_any_container():
    import torch

    ids = [0, 1, 151329, 7, 2**31 - 1]
    want = _digest_oracle(ids)
    assert token_digest(ids) == want
    for form in (np.array(ids, np.int64), np.array(ids, np.int32), np.array(ids, ">i8"), torch.tensor(ids),
                 torch.tensor(ids, dtype=torch.int32)):
        assert token_digest(form) == want, form
    assert token_digest(ids[:-1]) != want and token_digest(ids[::-1]) != want


@pytest.mark.parametrize("bad, match", [(np.zeros((2, 3), np.int64), "1-D"), ([1.5, 2.0], "integers"), (7, "1-D"),
                                        # an int first: the C packing is tried first; a bool first: token_array at once; refused all the same
                                        ([1, 2.5], "integers"), ([1, 2**70], "integers"), ([True, False], "integers")])
def test_token_digest_refuses_what_is_not_a_sequence_of_ids(bad, match):
    with pytest.raises(RecordError, match=match):
        token_digest(bad)


@pytest.mark.parametrize("binary", [False, True])
def test_identity_fields_travel_in_both_wire_forms(binary):
    rec = dataclasses.replace(_record(np.random.default_rng(4)), weight_version="42", tokens_digest=token_digest([1, 2, 3]))
    wire = rec.to_wire(binary=binary, pack_bits=7 if binary else None)
    assert wire["weight_version"] == "42" and wire["tokens_digest"] == _digest_oracle([1, 2, 3])
    raw = msgpack.packb(wire, use_bin_type=True) if binary else orjson.dumps(wire)
    back = RoutingRecord.from_wire(msgpack.unpackb(raw, raw=False) if binary else orjson.loads(raw))
    assert (back.weight_version, back.tokens_digest) == ("42", rec.tokens_digest)


def test_identity_fields_are_omitted_when_unset_and_read_as_none():
    wire = _record(np.random.default_rng(5)).to_wire()
    assert "weight_version" not in wire and "tokens_digest" not in wire
    back = RoutingRecord.from_wire(wire)
    assert back.weight_version is None and back.tokens_digest is None
    assert RoutingRecord.from_wire({**wire, "weight_version": None}).weight_version is None


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("weight_version", 3, r"'weight_version' must be a string, got int"),
        ("tokens_digest", b"\x00" * 16, r"'tokens_digest' must be a string, got bytes"),
        ("tokens_digest", "abc", r"'tokens_digest' must be 32 lowercase hex characters"),
        ("tokens_digest", "G" * 32, r"'tokens_digest' must be 32 lowercase hex characters"),
    ],
)
def test_identity_fields_of_the_wrong_type_are_refused_by_name(field, value, match):
    wire = _record(np.random.default_rng(6)).to_wire()
    with pytest.raises(RecordError, match=match):
        RoutingRecord.from_wire({**wire, field: value})


def test_positional_construction_still_works():
    rec = RoutingRecord("abc", 0, (1,), np.zeros((2, 1, 2), np.uint8), None, "v1", token_digest([4, 5, 6]))
    assert rec.weight_version == "v1" and rec.tokens_digest == _digest_oracle([4, 5, 6])
    with pytest.raises(RecordError, match="weight_version must be a string"):
        RoutingRecord("abc", 0, (1,), np.zeros((2, 1, 2), np.uint8), weight_version=7)
