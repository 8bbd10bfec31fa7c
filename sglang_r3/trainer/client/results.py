"""What one /generate output is, once decoded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from sglang_r3.trainer.client.errors import RoutingClientError, RoutingUnavailableError
from sglang_r3.core.record import RecordError, RoutingRecord


@dataclass(frozen=True)
class GenerateResult:
    output_ids: List[int]
    prompt_len: int
    prompt_ids: Optional[List[int]]  # known when the request sent input_ids; None for text prompts
    record: Optional[RoutingRecord]
    text: Optional[str] = None
    meta_info: Dict[str, Any] = field(default_factory=dict, repr=False)
    # SGLang's weight version that generated this output: meta_info["weight_version"], else the record's.
    weight_version: Optional[str] = None

    @property
    def tokens_digest(self) -> Optional[str]:
        """The record's digest of prompt + completion (``sglang_r3.core.record.token_digest``), if any."""
        return self.record.tokens_digest if self.record is not None else None

    @property
    def num_tokens(self) -> int:
        """Tokens of the whole sequence (prompt + completion); the record has one row fewer."""
        return self.prompt_len + len(self.output_ids)

    @property
    def tokens(self) -> List[int]:
        if self.prompt_ids is None:
            raise RoutingClientError("prompt ids are unknown for a text prompt; send input_ids to get them")
        return list(self.prompt_ids) + list(self.output_ids)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _count(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def routing_unavailable(meta_info: Mapping[str, Any], sample: Optional[int] = None) -> Optional[RoutingUnavailableError]:
    """The error for an output whose meta_info carries ``routing_error``; None when it carries none.

    A malformed routing_error still counts: the server said the routing is not to be trusted.
    """
    err = meta_info.get("routing_error")
    if err is None:
        return None
    if not isinstance(err, Mapping):
        return RoutingUnavailableError("unknown", _text(err), sample=sample)
    return RoutingUnavailableError(
        code=_text(err.get("code") or "unknown"),
        message=_text(err.get("message") or "no message"),
        missing_rows=_count(err.get("missing_rows")),
        rows=_count(err.get("rows")),
        sample=sample,
    )


def decode_routing(meta_info: Mapping[str, Any], sample: Optional[int] = None) -> RoutingRecord:
    """meta_info["routing"] of one output (JSON/base64 or msgpack/bytes) as a RoutingRecord.

    Raises RoutingUnavailableError when the server marked the output's routing untrustworthy
    (``routing_error``), even if a ``routing`` field is present as well.
    """
    if not isinstance(meta_info, Mapping):
        raise RecordError(f"meta_info must be an object, got {type(meta_info).__name__}")
    unavailable = routing_unavailable(meta_info, sample)
    if unavailable is not None:
        raise unavailable
    routing = meta_info.get("routing")
    if routing is None:
        raise RecordError("meta_info has no 'routing'; was the request sent with return_routing?")
    return RoutingRecord.from_wire(routing)


def parse_outputs(
    body: Any, prompt_ids: Optional[Sequence[Sequence[int]]], num_prompts: int, with_routing: bool = True
) -> List[GenerateResult]:
    """One result per output; with n > 1 samples per prompt, output j belongs to prompt j // n.

    with_routing: decode every output's record; if any output has no trustworthy routing, raise
    RoutingUnavailableError for the first such output, listing all of them (``affected``).
    """
    outputs = body if isinstance(body, list) else [body]
    if not outputs or len(outputs) % num_prompts:
        raise RoutingClientError(f"server returned {len(outputs)} outputs for {num_prompts} prompts")
    per_prompt = len(outputs) // num_prompts
    for j, out in enumerate(outputs):
        if not isinstance(out, Mapping) or not isinstance(out.get("meta_info"), Mapping):
            raise RoutingClientError(f"output {j} has no meta_info: {str(out)[:200]}")
    if with_routing:
        _raise_unavailable([out["meta_info"] for out in outputs])
    results = []
    for j, out in enumerate(outputs):
        meta = out["meta_info"]
        ids = prompt_ids[j // per_prompt] if prompt_ids is not None else None
        prompt_len = int(meta.get("prompt_tokens", len(ids) if ids is not None else 0))
        record = decode_routing(meta, j) if with_routing else None
        version = meta.get("weight_version")
        if version is None and record is not None:
            version = record.weight_version
        results.append(
            GenerateResult(
                output_ids=[int(x) for x in out.get("output_ids") or []],
                prompt_len=prompt_len,
                prompt_ids=list(ids) if ids is not None else None,
                record=record,
                text=out.get("text"),
                meta_info=dict(meta),
                weight_version=None if version is None else _text(version),
            )
        )
    return results


def _raise_unavailable(metas: Sequence[Mapping[str, Any]]) -> None:
    # The whole batch first, so the error says how many samples a retry or a drop concerns.
    errors = [e for e in (routing_unavailable(m, j) for j, m in enumerate(metas)) if e is not None]
    if errors:
        first = errors[0]
        raise RoutingUnavailableError(
            first.code, first.message, first.missing_rows, first.rows, first.sample,
            affected=tuple(e.sample for e in errors),
        )
