"""Routing capture: buffers keyed by KV slot, filled by target forwards only."""

from sglang_r3.serving.capture.capturer import CaptureViolation, RoutingCapturer
from sglang_r3.serving.capture.payload import CapturedRouting, decode_payload, encode_payload

__all__ = [
    "CaptureViolation",
    "CapturedRouting",
    "RoutingCapturer",
    "decode_payload",
    "encode_payload",
]
