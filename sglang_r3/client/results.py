"""What one /generate output is, once decoded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from sglang_r3.client.errors import RoutingClientError
from sglang_r3.record import RecordError, RoutingRecord


@dataclass(frozen=True)
class GenerateResult:
    output_ids: List[int]
    prompt_len: int
    prompt_ids: Optional[List[int]]  # known when the request sent input_ids; None for text prompts
    record: Optional[RoutingRecord]
    text: Optional[str] = None
    meta_info: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        """Tokens of the whole sequence (prompt + completion); the record has one row fewer."""
        return self.prompt_len + len(self.output_ids)

    @property
    def tokens(self) -> List[int]:
        if self.prompt_ids is None:
            raise RoutingClientError("prompt ids are unknown for a text prompt; send input_ids to get them")
        return list(self.prompt_ids) + list(self.output_ids)


def decode_routing(meta_info: Mapping[str, Any]) -> RoutingRecord:
    """meta_info["routing"] of one output (JSON/base64 or msgpack/bytes) as a RoutingRecord."""
    if not isinstance(meta_info, Mapping):
        raise RecordError(f"meta_info must be an object, got {type(meta_info).__name__}")
    routing = meta_info.get("routing")
    if routing is None:
        raise RecordError("meta_info has no 'routing'; was the request sent with return_routing?")
    return RoutingRecord.from_wire(routing)


def parse_outputs(
    body: Any, prompt_ids: Optional[Sequence[Sequence[int]]], num_prompts: int, with_routing: bool = True
) -> List[GenerateResult]:
    """One result per output; with n > 1 samples per prompt, output j belongs to prompt j // n."""
    outputs = body if isinstance(body, list) else [body]
    if not outputs or len(outputs) % num_prompts:
        raise RoutingClientError(f"server returned {len(outputs)} outputs for {num_prompts} prompts")
    per_prompt = len(outputs) // num_prompts
    results = []
    for j, out in enumerate(outputs):
        if not isinstance(out, Mapping) or not isinstance(out.get("meta_info"), Mapping):
            raise RoutingClientError(f"output {j} has no meta_info: {str(out)[:200]}")
        meta = out["meta_info"]
        ids = prompt_ids[j // per_prompt] if prompt_ids is not None else None
        prompt_len = int(meta.get("prompt_tokens", len(ids) if ids is not None else 0))
        results.append(
            GenerateResult(
                output_ids=[int(x) for x in out.get("output_ids") or []],
                prompt_len=prompt_len,
                prompt_ids=list(ids) if ids is not None else None,
                record=decode_routing(meta) if with_routing else None,
                text=out.get("text"),
                meta_info=dict(meta),
            )
        )
    return results
