"""The payload that carries a finished request's routing from the scheduler to the HTTP process.

It rides in ``req.routed_experts`` through SGLang's own IPC and detokenizer unchanged (``PayloadBytes``:
bytes that answer ``.numpy()``), so main rows, their start, the MTP section and the token digest need
no channel of their own; ``sglang_r3.serving.response`` turns it into the public record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import msgpack
import numpy as np
import pybase64  # SIMD base64 (a dependency of sglang), for long payloads

from sglang_r3.core.record import MtpRouting

_VERSION = 2

_DTYPE_NAMES = {"uint8": np.uint8, "int16": np.uint16, "uint16": np.uint16}


@dataclass(frozen=True)
class RoutingUnavailable:
    """Why a finished request gets no rows (``meta_info.routing_error`` on the wire)."""

    code: str  # one of codes.ROUTING_ERROR_CODES
    message: str
    missing_rows: int
    rows: int

    def to_meta(self) -> dict:
        return {"code": self.code, "message": self.message, "missing_rows": self.missing_rows, "rows": self.rows}


@dataclass
class CapturedRouting:
    start: int
    experts: np.ndarray  # [rows, n_moe, topk], uint8 or uint16; empty when ``error`` is set
    mtp: Optional[MtpRouting] = None
    tokens_digest: Optional[str] = None  # of the request's prompt + completion token ids
    error: Optional[RoutingUnavailable] = None
    # PD on 0.5.15.post1: the weight version the prefill engine computed the prompt under, where it is not the decode
    # engine's (adapter/pd_rows.py); ``response.build`` adds it to the output's weight_versions spans.
    prefill_weight_version: Optional[str] = None


class PayloadBytes(bytes):
    """The payload in ``req.routed_experts``. A torch tensor there (as upstream puts) goes through
    torch's pickling (storage sharing, type reconstruction) to the detokenizer and back; bytes pickle
    as bytes. The detokenizer only calls ``.numpy().tobytes()`` on it."""

    def numpy(self) -> np.ndarray:
        return np.frombuffer(self, dtype=np.uint8)


@dataclass(frozen=True)
class EncodedRouting:
    """A finished request's payload as the detokenizer sent it (base64 text, or the tensor itself),
    not yet decoded: a long one is decoded off the event loop, with the record built from it."""

    raw: object

    @property
    def nbytes(self) -> int:
        """Encoded size (what decoding and building it cost grows with)."""
        raw = self.raw
        if isinstance(raw, (str, bytes, bytearray)):
            return len(raw)
        return int(getattr(raw, "numel", lambda: 0)())

    def decode(self) -> CapturedRouting:
        raw = self.raw
        if isinstance(raw, str):
            raw = pybase64.b64decode(raw)
        elif hasattr(raw, "numpy"):  # BatchTokenIDOutput (skip_tokenizer_init) carries the payload itself
            raw = raw.numpy().tobytes()
        return decode_payload(bytes(raw))


def encode_payload(
    start: int,
    experts: np.ndarray,
    mtp: Optional[MtpRouting] = None,
    tokens_digest: Optional[str] = None,
    error: Optional[RoutingUnavailable] = None,
    prefill_weight_version: Optional[str] = None,
) -> bytes:
    dtype = "uint8" if experts.dtype == np.uint8 else "uint16"
    return msgpack.packb(
        {
            "v": _VERSION,
            "start": int(start),
            "shape": list(experts.shape),
            "dtype": dtype,
            "experts": np.ascontiguousarray(experts).view(_DTYPE_NAMES[dtype]).tobytes(),
            "mtp": None if mtp is None else mtp.to_wire(binary=True),
            "digest": tokens_digest,
            "error": None if error is None else error.to_meta(),
            "prefill_version": prefill_weight_version,
        },
        use_bin_type=True,
    )


def decode_payload(raw: bytes) -> CapturedRouting:
    d = msgpack.unpackb(raw, raw=False)
    if d.get("v") != _VERSION:
        raise ValueError(f"routing payload version {d.get('v')} is not {_VERSION}")
    experts = np.frombuffer(d["experts"], dtype=_DTYPE_NAMES[d["dtype"]]).reshape(d["shape"])
    mtp = MtpRouting.from_wire(d["mtp"]) if d.get("mtp") is not None else None
    err = d.get("error")
    return CapturedRouting(
        start=int(d["start"]),
        experts=experts,
        mtp=mtp,
        tokens_digest=d.get("digest"),
        error=None if err is None else RoutingUnavailable(**err),
        prefill_weight_version=d.get("prefill_version"),
    )
