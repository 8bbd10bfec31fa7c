"""Small HTTP helpers for server tests (plain httpx, so tests see exactly what goes over the wire)."""

from __future__ import annotations

from typing import Any, Dict, List, Union

import httpx

from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RoutingRecord

TIMEOUT = httpx.Timeout(600.0)


def generate(url: str, **body) -> Union[Dict[str, Any], List[Dict[str, Any]]]:
    r = httpx.post(url + "/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(url: str, max_new_tokens: int = 16, **body):
    body.setdefault("sampling_params", {})
    body["sampling_params"] = {"temperature": 0, "max_new_tokens": max_new_tokens, **body["sampling_params"]}
    return generate(url, **body)


def record_of(out: Dict[str, Any]) -> RoutingRecord:
    return RoutingRecord.from_wire(out["meta_info"]["routing"])


def full_ids(out: Dict[str, Any], prompt_ids: List[int]) -> List[int]:
    return list(prompt_ids) + list(out["output_ids"])


def flush_cache(url: str) -> None:
    r = httpx.post(url + "/flush_cache", timeout=TIMEOUT)
    assert r.status_code == 200, r.text


def ids(text: str) -> List[int]:
    return list(text.encode())  # the embedded tokenizer is byte-level: id == byte


def fetch_layout(url: str) -> ModelLayout:
    return ModelLayout.from_dict(httpx.get(url + "/routing/layout", timeout=TIMEOUT).json())
