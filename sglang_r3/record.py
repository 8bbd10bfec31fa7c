"""Routing records: what the server returns per request and the trainer replays.

A record holds the main model's MoE routing as an array
``experts[num_tokens, len(layers), topk]`` (row ``i`` is the routing of token
``start + i`` as input), tagged with the layout fingerprint it belongs to. The
optional ``mtp`` section holds MTP-draft routing, kept apart so it can never be
mistaken for main rows.

Two identity fields tie a record to what produced it: ``weight_version``
(SGLang's weight version string at generation time) and ``tokens_digest``
(``token_digest`` of the sample's full token sequence, prompt + completion). A
row count alone cannot tell two samples of equal length apart; the digest can.

Two wire forms of the same dict: JSON (arrays as base64) and msgpack (arrays
as raw bytes). The binary form may also bit-pack expert ids at
``bits_for(num_experts)`` bits each (7 bits for 128 experts instead of 8),
signalled by ``"packing": {"bits": b}`` next to ``experts``; ``from_wire``
reads both. The JSON form never packs: its contract is plain uint8/uint16.
"""

from __future__ import annotations

import array
import hashlib
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

try:  # SIMD base64 (a dependency of sglang), for large records
    from pybase64 import b64decode as _b64decode, b64encode as _b64encode
except ImportError:  # pragma: no cover
    from base64 import b64decode as _b64decode, b64encode as _b64encode

_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "int32": np.int32}


class RecordError(ValueError):
    """A routing record that is malformed or does not belong where it is used."""


def token_digest(token_ids: Any) -> str:
    """Hex blake2b-128 of a sample's full token id sequence (prompt + completion, all T tokens).

    The ids are hashed as little-endian int64 so the server (Python lists) and the trainer (torch
    tensors of any integer dtype) agree byte for byte. A record's ``start`` does not change it: the
    digest names the sample, not the rows.
    """
    return hashlib.blake2b(_token_bytes(token_ids), digest_size=16).hexdigest()


def _token_bytes(token_ids: Any) -> bytes:
    # The scheduler digests a Python list per finished request: array.array packs it in C at about a
    # quarter of np.asarray's cost, byte for byte the same int64 (a float or an out-of-range id raises
    # and takes token_array's path, which names it; a list of bools there too, which token_array refuses).
    if type(token_ids) is list and token_ids and type(token_ids[0]) is int:
        try:
            arr = array.array("q", token_ids)
        except (TypeError, OverflowError):
            pass
        else:
            if sys.byteorder != "little":
                arr.byteswap()
            return arr.tobytes()
    return token_array(token_ids).tobytes()


def token_array(token_ids: Any) -> np.ndarray:
    """Token ids (list, numpy array or torch tensor) as 1-D little-endian int64; refuses anything else."""
    if hasattr(token_ids, "detach"):  # torch, possibly on an accelerator
        token_ids = token_ids.detach().cpu().numpy()
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise RecordError(f"token ids must be 1-D, got shape {tuple(arr.shape)}")
    # An empty list comes out float64; anything else non-integer would be silently truncated.
    if arr.size and arr.dtype.kind not in "iu":
        raise RecordError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.astype("<i8", copy=False)


_DIGEST_LEN = 32  # hex chars of a 16-byte blake2b


_DTYPE_NAMES: Dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    # str(np.dtype) walks numpy's Python-level naming code; records name one of a few dtypes.
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _identity_field(d: Mapping[str, Any], key: str) -> Optional[str]:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordError(f"routing field {key!r} must be a string, got {type(value).__name__}")
    if key == "tokens_digest" and (
        len(value) != _DIGEST_LEN or any(c not in "0123456789abcdef" for c in value)
    ):
        # A malformed digest would later read as "a different token sequence"; say what it is instead.
        raise RecordError(f"routing field 'tokens_digest' must be {_DIGEST_LEN} lowercase hex characters, got {value!r}")
    return value


def dtype_for(num_experts: int) -> str:
    return "uint8" if num_experts <= 256 else "uint16"


def bits_for(num_experts: int) -> int:
    """Bits that hold every id of ``num_experts`` experts: ceil(log2(num_experts)), at least 1."""
    return max(1, (int(num_experts) - 1).bit_length())


def pack_ids(ids: np.ndarray, bits: int) -> bytes:
    """Row-major ids (uint8/uint16) as a big-endian bit stream, ``bits`` per id, zero-padded to a byte."""
    flat = np.ascontiguousarray(ids).reshape(-1)
    width = 8 * flat.dtype.itemsize
    if flat.dtype.kind != "u" or not 1 <= bits <= width:
        raise RecordError(f"cannot pack {flat.dtype} ids at {bits} bits")
    if flat.size and int(flat.max()) >> bits:
        raise RecordError(f"expert id {int(flat.max())} does not fit in {bits} bits")
    if bits == width:
        return flat.astype(flat.dtype.newbyteorder(">"), copy=False).tobytes()
    if bits < 8:
        return _pack_groups(flat, bits)
    # Flat unpack/pack (no per-row axis loops): [n, width] bit matrix, keep the low `bits` columns.
    big = flat.astype(flat.dtype.newbyteorder(">"), copy=False).view(np.uint8)
    bitmat = np.unpackbits(big).reshape(flat.size, width)[:, width - bits :]
    return np.packbits(bitmat.reshape(-1)).tobytes()


# Ids per block of the grouped packer (8 ids of b < 8 bits are exactly b bytes): blocks of 1M ids
# keep each column's temporaries cache-sized.
_GROUP_BLOCK = 1 << 20
# Groups (64-bit words) per block of the unpacker: 32K words (256 KiB per temporary) stay in cache.
_SPREAD_BLOCK = 1 << 15


def _pack_groups(flat: np.ndarray, bits: int) -> bytes:
    """pack_ids for bits < 8: every 8 ids fill exactly ``bits`` bytes; id j lands in bytes (k, k+1) at
    k = j*bits // 8, placed there with one 16-bit shift (the same stream as the bit matrix, no bit matrix)."""
    n = flat.size
    groups = -(-n // 8)
    ids = flat
    if n < groups * 8:  # the last group's missing ids are zero bits
        ids = np.zeros(groups * 8, dtype=flat.dtype)
        ids[:n] = flat
    ids = ids.reshape(groups, 8)
    out = np.zeros((groups, bits + 1), dtype=np.uint8)  # +1: spill column of the last id, always 0
    step = _GROUP_BLOCK // 8
    v = np.empty(min(groups, step), dtype=np.uint16)
    for g0 in range(0, groups, step):
        g1 = min(groups, g0 + step)
        vv = v[: g1 - g0]
        for j in range(8):
            k, off = divmod(j * bits, 8)
            np.left_shift(ids[g0:g1, j], 16 - off - bits, out=vv, dtype=np.uint16)
            out[g0:g1, k] |= (vv >> 8).astype(np.uint8)
            out[g0:g1, k + 1] |= (vv & 0xFF).astype(np.uint8)
    return out[:, :bits].reshape(-1)[: (n * bits + 7) // 8].tobytes()


def unpack_ids(raw: bytes, count: int, bits: int, dtype, field: str = "experts") -> np.ndarray:
    """Inverse of ``pack_ids``: ``count`` ids of ``bits`` bits -> flat array of ``dtype``."""
    dt = np.dtype(dtype)
    width = 8 * dt.itemsize
    if not 1 <= bits <= width:
        raise RecordError(f"routing field {field!r}: packing.bits={bits} does not fit {dt}")
    need = (count * bits + 7) // 8
    if len(raw) != need:
        raise RecordError(f"routing field {field!r}: {len(raw)} bytes, expected {need} for {count} ids at {bits} bits")
    src = np.frombuffer(raw, dtype=np.uint8)
    if bits == width:
        return src.view(dt.newbyteorder(">")).astype(dt)
    if bits < 8:
        return _unpack_groups(src, count, bits).astype(dt, copy=False)
    bitmat = np.zeros((count, width), dtype=np.uint8)
    bitmat[:, width - bits :] = np.unpackbits(src, count=count * bits).reshape(count, bits)
    return np.packbits(bitmat.reshape(-1)).view(dt.newbyteorder(">")).astype(dt)


def _unpack_groups(src: np.ndarray, count: int, bits: int) -> np.ndarray:
    """unpack_ids for bits < 8: every ``bits`` bytes hold 8 ids. Each group is read as one big-endian
    64-bit word (the window runs into the next group; those bytes are shifted out) and its 8 fields are
    spread to the 8 bytes of the word in three mask-and-shift steps (halves, quarters, ids), so every pass
    is a whole-word operation on a cache-sized block; stored big-endian, id 0 lands in the first byte."""
    groups = -(-count // 8)
    inside = min(groups, (src.size - 8) // bits + 1) if src.size >= 8 else 0  # windows within src
    out = np.empty(groups, dtype=">u8")
    step = min(max(groups, 1), _SPREAD_BLOCK)
    x, t = np.empty(step, dtype=np.uint64), np.empty(step, dtype=np.uint64)
    u = np.uint64
    half, quarter = 4 * bits, 2 * bits
    m1 = u((1 << half) - 1)
    m2 = u(((1 << quarter) - 1) * (1 | 1 << 32))
    m3 = u(((1 << bits) - 1) * (1 | 1 << 16 | 1 << 32 | 1 << 48))

    def spread(words: np.ndarray, dst: np.ndarray) -> None:
        xx, tt = x[: words.shape[0]], t[: words.shape[0]]
        np.copyto(xx, words)
        xx >>= u(64 - 8 * bits)  # the group's 8*bits data bits at the bottom, id 7 lowest
        for mask, width, lane in ((m1, half, 32), (m2, quarter, 16), (m3, bits, 8)):
            np.bitwise_and(xx, mask << u(width), out=tt)
            xx &= mask
            tt <<= u(lane - width)
            xx |= tt
        np.copyto(dst, xx)

    def windows(buf: np.ndarray, n: int) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=">u8", count=1), shape=(n,), strides=(bits,))

    if inside:
        words, head = windows(src, inside), out[:inside]
        for g0 in range(0, inside, step):
            spread(words[g0 : g0 + step], head[g0 : g0 + step])
    if inside < groups:  # the last groups' windows would read past src: read them from a padded copy
        rest = src[inside * bits :]
        tail = np.zeros((groups - inside) * bits + 8, dtype=np.uint8)
        tail[: rest.size] = rest
        spread(windows(tail, groups - inside), out[inside:])
    return out.view(np.uint8)[:count]


def _packing_bits(d: Mapping[str, Any], field: str) -> Optional[int]:
    p = d.get("packing")
    if p is None:
        return None
    try:
        return int(p["bits"])
    except (KeyError, TypeError, ValueError):
        raise RecordError(f"routing field {field!r}: packing must be {{'bits': int}}, got {p!r}") from None


def _encode_ids(arr: np.ndarray, binary: bool, bits: Optional[int]) -> Dict[str, Any]:
    """``experts`` (plus ``packing`` when bit-packed) of a wire dict."""
    if bits is None:
        return {"experts": _encode(arr, binary)}
    if not binary:
        raise RecordError("bit packing is for the binary (msgpack) form only; JSON keeps plain uint8/uint16")
    return {"experts": pack_ids(arr, bits), "packing": {"bits": int(bits)}}


def _decode_ids(d: Mapping[str, Any], dtype, count: int, field: str) -> np.ndarray:
    bits = _packing_bits(d, field)
    if bits is None:
        return _decode(d["experts"], dtype, field)
    value = d["experts"]
    if isinstance(value, str):  # tolerated: packed bytes carried as base64
        value = _decode(value, np.uint8, field).tobytes()
    elif not isinstance(value, (bytes, bytearray, memoryview)):
        raise RecordError(f"routing field {field!r} must be bytes when packed, got {type(value).__name__}")
    return unpack_ids(bytes(value), count, bits, dtype, field)


def _encode(arr: np.ndarray, binary: bool):
    raw = np.ascontiguousarray(arr).tobytes()
    return raw if binary else _b64encode(raw).decode("ascii")


def _decode(value: Any, dtype, field: str) -> np.ndarray:
    if isinstance(value, str):
        try:
            raw = _b64decode(value.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError) as e:
            raise RecordError(f"routing field {field!r} is not valid base64: {e}") from e
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    else:
        raise RecordError(f"routing field {field!r} must be base64 text or bytes, got {type(value).__name__}")
    itemsize = np.dtype(dtype).itemsize
    if len(raw) % itemsize:
        raise RecordError(f"routing field {field!r}: {len(raw)} bytes is not a whole number of {np.dtype(dtype)}")
    return np.frombuffer(raw, dtype=dtype)


@dataclass(frozen=True)
class MtpRouting:
    """Routing of MTP-draft forwards, one entry per (drafted position, depth, step)."""

    positions: np.ndarray  # int32 [n]: token position the draft forward routed
    depth: np.ndarray  # uint8 [n]: MTP depth (1-based)
    step: np.ndarray  # uint8 [n]: draft step within its speculation round (0-based)
    accepted: np.ndarray  # bool [n]: whether the token drafted from this forward was accepted
    experts: np.ndarray  # [n, topk]
    tokens: Optional[np.ndarray] = None  # int32 [n]: token id the draft forward routed
    rounds: Optional[np.ndarray] = None  # int32 [n]: speculation round (server-wide counter)

    @property
    def num_entries(self) -> int:
        return int(self.positions.shape[0])

    def to_wire(self, binary: bool = False, pack_bits: Optional[int] = None) -> Dict[str, Any]:
        """pack_bits: bit-pack the expert ids at this width (binary form only; see ``bits_for``)."""
        return {
            "num_entries": self.num_entries,
            "topk": int(self.experts.shape[1]) if self.experts.ndim == 2 else 0,
            "dtype": _dtype_name(self.experts.dtype),
            "positions": _encode(self.positions.astype(np.int32), binary),
            "depth": _encode(self.depth.astype(np.uint8), binary),
            "step": _encode(self.step.astype(np.uint8), binary),
            "accepted": _encode(self.accepted.astype(np.uint8), binary),
            **_encode_ids(self.experts, binary, pack_bits),
            **({"tokens": _encode(self.tokens.astype(np.int32), binary)} if self.tokens is not None else {}),
            **({"rounds": _encode(self.rounds.astype(np.int32), binary)} if self.rounds is not None else {}),
        }

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "MtpRouting":
        try:
            n, topk, dtype = int(d["num_entries"]), int(d["topk"]), str(d["dtype"])
            if dtype not in _DTYPES:
                raise RecordError(f"mtp.dtype {dtype!r} is not one of {sorted(_DTYPES)}")
            cols = {
                "positions": _decode(d["positions"], np.int32, "mtp.positions"),
                "depth": _decode(d["depth"], np.uint8, "mtp.depth"),
                "step": _decode(d["step"], np.uint8, "mtp.step"),
                "accepted": _decode(d["accepted"], np.uint8, "mtp.accepted").astype(bool),
            }
            for opt, key in (("tokens", "tokens"), ("rounds", "rounds")):
                if d.get(key) is not None:
                    cols[opt] = _decode(d[key], np.int32, f"mtp.{key}")
            experts = _decode_ids(d, _DTYPES[dtype], n * topk, "mtp.experts")
        except KeyError as e:
            raise RecordError(f"routing.mtp is missing field {e}") from e
        for name, col in cols.items():
            if col.shape[0] != n:
                raise RecordError(f"mtp.{name} has {col.shape[0]} entries, num_entries says {n}")
        if experts.size != n * topk:
            raise RecordError(f"mtp.experts has {experts.size} ids, expected num_entries*topk = {n * topk}")
        return cls(experts=experts.reshape(n, topk), **cols)


@dataclass(frozen=True)
class RoutingRecord:
    layout: str  # fingerprint of the ModelLayout the rows belong to
    start: int  # position of the first row's token
    layers: Tuple[int, ...]  # main MoE layer ids, in row order
    experts: np.ndarray  # [num_tokens, len(layers), topk]
    mtp: Optional[MtpRouting] = None
    weight_version: Optional[str] = None  # SGLang's weight version the rows were routed with
    tokens_digest: Optional[str] = None  # token_digest(prompt + completion) of the sample

    def __post_init__(self):
        for key in ("weight_version", "tokens_digest"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise RecordError(f"RoutingRecord.{key} must be a string or None, got {type(value).__name__}")

    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def topk(self) -> int:
        return int(self.experts.shape[2])

    def to_wire(self, binary: bool = False, pack_bits: Optional[int] = None) -> Dict[str, Any]:
        """binary: arrays as raw bytes (msgpack) instead of base64 (JSON).

        pack_bits: binary form only -- bit-pack expert ids at this width (``bits_for(num_experts)``);
        the dict then carries ``"packing": {"bits": pack_bits}``. ``dtype`` stays the unpacked dtype.
        """
        d = {
            "layout": self.layout,
            "start": int(self.start),
            "num_tokens": self.num_tokens,
            "layers": [int(x) for x in self.layers],
            "topk": self.topk,
            "dtype": _dtype_name(self.experts.dtype),
            **_encode_ids(self.experts, binary, pack_bits),
        }
        if self.mtp is not None:
            d["mtp"] = self.mtp.to_wire(binary, pack_bits)
        if self.weight_version is not None:
            d["weight_version"] = self.weight_version
        if self.tokens_digest is not None:
            d["tokens_digest"] = self.tokens_digest
        return d

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "RoutingRecord":
        if not isinstance(d, Mapping):
            raise RecordError(f"a routing record must be an object, got {type(d).__name__}")
        try:
            layout = str(d["layout"])
            start, n, topk = int(d["start"]), int(d["num_tokens"]), int(d["topk"])
            layers = tuple(int(x) for x in d["layers"])
            dtype = str(d["dtype"])
            if "experts" not in d:
                raise KeyError("experts")
        except KeyError as e:
            raise RecordError(f"routing record is missing field {e}") from e
        except (TypeError, ValueError) as e:
            raise RecordError(f"routing record has a field of the wrong type: {e}") from e
        if dtype not in _DTYPES:
            raise RecordError(f"routing.dtype {dtype!r} is not one of {sorted(_DTYPES)}")
        if start < 0 or n < 0 or topk <= 0:
            raise RecordError(f"routing record has start={start}, num_tokens={n}, topk={topk}")
        expected = n * len(layers) * topk
        flat = _decode_ids(d, _DTYPES[dtype], expected, "experts")
        if flat.size != expected:
            raise RecordError(
                f"routing.experts holds {flat.size} ids, but num_tokens={n} x layers={len(layers)} x topk={topk} = {expected}"
            )
        weight_version = _identity_field(d, "weight_version")
        tokens_digest = _identity_field(d, "tokens_digest")
        mtp = MtpRouting.from_wire(d["mtp"]) if d.get("mtp") is not None else None
        return cls(
            layout=layout,
            start=start,
            layers=layers,
            experts=flat.reshape(n, len(layers), topk),
            mtp=mtp,
            weight_version=weight_version,
            tokens_digest=tokens_digest,
        )
