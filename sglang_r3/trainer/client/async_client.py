"""Asyncio client of the routing server, with bounded concurrency for many samples."""

from __future__ import annotations

import asyncio
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


class AsyncRoutingClient:
    def __init__(
        self,
        base_url: str,
        *,
        binary: bool = True,
        timeout: float = 600.0,
        client: Optional[httpx.AsyncClient] = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.binary = binary
        self._own = client is None
        self._http = client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout)

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncRoutingClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, **kw) -> Any:
        url = f"{self.base_url}{path}"
        try:
            resp = await self._http.request(method, url, headers=accept_headers(self.binary), **kw)
        except httpx.TransportError as e:
            raise unreachable(url, e) from e
        return read_response(resp)

    async def layout(self) -> ModelLayout:
        return ModelLayout.from_dict(await self._call("GET", "/routing/layout"))

    async def generate(
        self,
        prompts: Optional[Prompts] = None,
        sampling_params: Optional[Dict[str, Any]] = None,
        *,
        input_ids: Optional[InputIds] = None,
        routing_start: Optional[int] = None,
        mtp: bool = False,
        extra: Optional[Dict[str, Any]] = None,
    ) -> List[GenerateResult]:
        kind, items = normalize_inputs(prompts, input_ids)
        body = generate_body(kind, items, sampling_params, routing_start, mtp, extra)
        out = await self._call("POST", "/generate", json=body)
        return parse_outputs(out, items if kind == "input_ids" else None, len(items))

    async def generate_many(
        self,
        input_ids: Iterable[InputIds],
        sampling_params: Optional[Dict[str, Any]] = None,
        *,
        batch_size: int = 8,
        concurrency: int = 4,
        **kw,
    ) -> List[GenerateResult]:
        """Split into batches of batch_size, keep at most `concurrency` requests in flight; input order kept.

        The first failing batch's error is raised (the others are cancelled).
        """
        seqs = [list(s) for s in input_ids]
        if batch_size < 1 or concurrency < 1:
            raise RoutingArgumentError("batch_size and concurrency must be >= 1")
        gate = asyncio.Semaphore(concurrency)

        async def one(batch: List[List[int]]) -> List[GenerateResult]:
            async with gate:
                return await self.generate(input_ids=batch, sampling_params=sampling_params, **kw)

        batches = [seqs[i : i + batch_size] for i in range(0, len(seqs), batch_size)]
        tasks = [asyncio.ensure_future(one(b)) for b in batches]
        try:
            done = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        return [r for batch in done for r in batch]
