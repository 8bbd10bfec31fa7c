"""Routing records: main MoE routing ``experts[tokens, layers, topk]`` tagged with the layout fingerprint, the
weight version and the digest of the sample's tokens (a row count cannot tell two samples apart; the digest
can), MTP-draft routing in its own section. Two wire forms of one dict: JSON (base64, never packed) and
msgpack (raw bytes, or ids bit-packed at ``bits_for(num_experts)`` bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from sglang_r3.core.record.bitpack import pack_ids, unpack_ids
from sglang_r3.core.record.digest import DIGEST_LEN
from sglang_r3.core.record.errors import RecordError

try:  # SIMD base64 (a dependency of sglang), for large records
    from pybase64 import b64decode as _b64decode, b64encode as _b64encode
except ImportError:  # pragma: no cover
    from base64 import b64decode as _b64decode, b64encode as _b64encode

_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "int32": np.int32}


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
        len(value) != DIGEST_LEN or any(c not in "0123456789abcdef" for c in value)
    ):
        # A malformed digest would later read as "a different token sequence"; say what it is instead.
        raise RecordError(f"routing field 'tokens_digest' must be {DIGEST_LEN} lowercase hex characters, got {value!r}")
    return value



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
