"""Blocking client of the routing server."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import httpx

from sglang_r3.trainer.client.errors import RoutingArgumentError
from sglang_r3.trainer.client.results import GenerateResult, parse_outputs
from sglang_r3.trainer.client.transport import (
    InputIds,
    Prompts,
    accept_headers,
    generate_body,
    normalize_inputs,
    read_response,
    unreachable,
)
from sglang_r3.core.layout import ModelLayout


class RoutingClient:
    """``binary=True`` (default) asks for msgpack: routing arrays come as bytes (ids bit-packed), not base64."""

    def __init__(self, base_url: str, *, binary: bool = True, timeout: float = 600.0, client: Optional[httpx.Client] = None):
        self.base_url = base_url.rstrip("/")
        self.binary = binary
        self._own = client is None
        self._http = client or httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> "RoutingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw) -> Any:
        url = f"{self.base_url}{path}"
        try:
            resp = self._http.request(method, url, headers=accept_headers(self.binary), **kw)
        except httpx.TransportError as e:
            raise unreachable(url, e) from e
        return read_response(resp)

    def layout(self) -> ModelLayout:
        return ModelLayout.from_dict(self._call("GET", "/routing/layout"))

    def generate(
        self,
        prompts: Optional[Prompts] = None,
        sampling_params: Optional[Dict[str, Any]] = None,
        *,
        input_ids: Optional[InputIds] = None,
        routing_start: Optional[int] = None,
        mtp: bool = False,
        extra: Optional[Dict[str, Any]] = None,
    ) -> List[GenerateResult]:
        """One result per output (prompt order; n > 1 samples of a prompt are adjacent)."""
        kind, items = normalize_inputs(prompts, input_ids)
        body = generate_body(kind, items, sampling_params, routing_start, mtp, extra)
        out = self._call("POST", "/generate", json=body)
        return parse_outputs(out, items if kind == "input_ids" else None, len(items))

    def generate_many(
        self,
        input_ids: Iterable[InputIds],
        sampling_params: Optional[Dict[str, Any]] = None,
        *,
        batch_size: int = 32,
        **kw,
    ) -> List[GenerateResult]:
        """Many samples in server batches of batch_size, results in input order."""
        seqs = [list(s) for s in input_ids]
        if batch_size < 1:
            raise RoutingArgumentError("batch_size must be >= 1")
        results: List[GenerateResult] = []
        for i in range(0, len(seqs), batch_size):
            results += self.generate(input_ids=seqs[i : i + batch_size], sampling_params=sampling_params, **kw)
        return results
