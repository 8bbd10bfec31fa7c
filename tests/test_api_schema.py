"""The rollout API documents what it sends: /generate's answer, every routing error code, the handle.

The oracle is each producer's own behaviour: the record store's refusals and the capture's
missing-row answer must be codes the published schema lists.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi import FastAPI

from sglang_r3_server.routes import router
from sglang_r3.serving.fleet.handle import RecordUnavailableError
from sglang_r3.serving.fleet.store import RecordStore, StoreBounds, encode_record
from sglang_r3.core.record import RoutingRecord, token_digest

pytestmark = pytest.mark.sglang


def _openapi() -> dict:
    app = FastAPI()
    app.include_router(router)
    return app.openapi()


def _record(rows: int) -> RoutingRecord:
    experts = (np.arange(rows * 3 * 4, dtype=np.uint8).reshape(rows, 3, 4) % 16)
    return RoutingRecord("fp", 0, (1, 2, 3), experts, tokens_digest=token_digest(range(rows + 1)))


def test_generate_documents_the_record_the_error_and_the_handle_it_can_return():
    doc = _openapi()
    ok = doc["paths"]["/generate"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/RoutedOutput"} in ok["anyOf"]
    meta = doc["components"]["schemas"]["RoutedMetaInfo"]["properties"]
    assert {"routing", "routing_error", "routing_ref", "routed_experts"} <= set(meta)


def test_every_refusal_the_record_store_sends_is_a_documented_routing_error_code():
    documented = set(_openapi()["components"]["schemas"]["RoutingErrorSchema"]["properties"]["code"]["enum"])
    store = RecordStore("s", "e", StoreBounds(max_records=1, max_bytes=1 << 20, ttl_s=600))
    seen = set()
    inc = store.stats.incarnation
    assert store.put(inc, "a", encode_record(_record(4)))["ok"]
    for answer in (
        store.put(inc, "b", encode_record(_record(4))),  # full
        store.put(inc + 7, "c", encode_record(_record(4))),  # not the live incarnation
    ):
        assert not answer["ok"]
        seen.add(answer["code"])
    assert seen == {"store_full", "engine_restarted"}
    assert seen <= documented
    assert {"missing_rows", "capture_off"} <= documented  # the capture's own answers (capture/payload)


def test_a_handle_error_with_an_undocumented_code_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="store_refused"):
        RecordUnavailableError("store_refused", "x")


def test_the_mtp_section_schema_lists_every_field_the_record_sends():
    # The oracle is the record's own wire form (JSON), with the optional token and round columns present.
    from sglang_r3.core.record.records import MtpRouting

    n = 3
    mtp = MtpRouting(positions=np.arange(n, dtype=np.int32), depth=np.ones(n, np.uint8), step=np.zeros(n, np.uint8),
                     accepted=np.ones(n, bool), experts=np.zeros((n, 4), np.uint8),
                     tokens=np.arange(n, dtype=np.int32), rounds=np.zeros(n, np.int32))
    documented = set(_openapi()["components"]["schemas"]["MtpSection"]["properties"])
    assert set(mtp.to_wire()) == documented


# -- the request guard: return_routing.mtp where nothing is drafted -------------------------------------------


def _guard_on(monkeypatch, default_routing=None, **server_args):
    """parse_routing_options as a server with these ServerArgs values (and default routing) runs it."""
    from types import SimpleNamespace

    import sglang_r3_server.request as request
    from sglang_r3.core import settings

    args = SimpleNamespace(**{"speculative_algorithm": None, "speculative_eagle_topk": None, **server_args})
    monkeypatch.setattr(request, "tokenizer_manager", lambda: SimpleNamespace(server_args=args))
    monkeypatch.setattr(settings, "current", lambda: settings.Settings(default_routing=default_routing))
    return request


@pytest.mark.parametrize("option", [{"mtp": True}, {"main": False, "mtp": True}, {"main": True, "mtp": True}])
def test_the_mtp_section_on_a_server_without_speculation_is_refused_by_name(monkeypatch, option):
    # Fail closed, as tree drafting is: asked for a section it would not get, the request gets a 400 saying why.
    request = _guard_on(monkeypatch)
    with pytest.raises(request.RequestError, match=r"^return_routing\.mtp needs a server with MTP speculation .*"
                                                   r"drafts nothing.*; main rows are$") as e:
        request.parse_routing_options({"input_ids": [1, 2], "return_routing": option})
    assert e.value.field == "return_routing" and e.value.status == 400
    body = e.value.response().body
    assert b'"type":"invalid_request_error"' in body and b'"field":"return_routing"' in body


def test_a_default_of_main_mtp_on_a_server_without_speculation_names_the_default(monkeypatch):
    request = _guard_on(monkeypatch, default_routing="main+mtp")
    with pytest.raises(request.RequestError, match=r"default routing: --r3-default-routing / "
                                                   r"SGLANG_R3_DEFAULT_ROUTING main\+mtp"):
        request.parse_routing_options({"input_ids": [1, 2]})
    # Main rows alone, asked explicitly, are served there
    assert request.parse_routing_options({"input_ids": [1, 2], "return_routing": True}).want_routing


def test_the_mtp_section_is_taken_where_mtp_speculation_drafts_a_chain_and_refused_for_a_tree(monkeypatch):
    request = _guard_on(monkeypatch, speculative_algorithm="EAGLE", speculative_eagle_topk=1)
    assert request.parse_routing_options({"input_ids": [1], "return_routing": {"mtp": True}}).want_mtp
    request = _guard_on(monkeypatch, speculative_algorithm="EAGLE", speculative_eagle_topk=2)
    with pytest.raises(request.RequestError, match="not supported with tree drafting"):
        request.parse_routing_options({"input_ids": [1], "return_routing": {"mtp": True}})
    request = _guard_on(monkeypatch)  # no speculation: main rows and upstream's field are unaffected
    assert not request.parse_routing_options({"input_ids": [1], "return_routing": {"mtp": False}}).want_mtp
    assert request.parse_routing_options({"input_ids": [1], "return_routed_experts": True}).any


def test_the_docs_name_the_refusal_of_the_mtp_section_without_speculation(monkeypatch):
    from pathlib import Path

    request = _guard_on(monkeypatch)
    with pytest.raises(request.RequestError) as e:
        request.parse_routing_options({"input_ids": [1], "return_routing": {"mtp": True}})
    docs = Path(__file__).resolve().parents[1] / "docs"
    start = str(e.value).split(": this one")[0]
    assert f"400 `{start}: this one drafts nothing" in (docs / "troubleshooting.md").read_text()
    row = next(line for line in (docs / "api.md").read_text().splitlines() if line.startswith("| `return_routing.mtp` |"))
    assert "without MTP speculation" in row and "tree" in row


# -- the live schema says what the code returns ------------------------------------------------------------------


def test_the_error_body_schema_has_every_key_our_refusals_send():
    import json

    from sglang_r3_server.request import RequestError

    schema = _openapi()["components"]["schemas"]["ErrorBody"]
    documented = set(schema["properties"])
    for err in (RequestError("routing_start needs return_routing", field="routing_start"), RequestError("not JSON")):
        body = json.loads(err.response().body)["error"]
        assert set(body) <= documented, f"ErrorBody lacks {set(body) - documented}"
        assert set(schema.get("required", [])) <= set(body)
        assert body["type"] == "invalid_request_error"
    assert {"message", "type", "field"} == documented
    kinds = schema["properties"]["type"]["anyOf"][0]
    assert kinds.get("enum", [kinds.get("const")]) == ["invalid_request_error"]


def test_routed_experts_has_the_shape_api_md_gives_it(monkeypatch):
    # The oracle: the body SGLang receives asks upstream's capturer for rows from the start the request named.
    import re
    from pathlib import Path

    request = _guard_on(monkeypatch)
    body = {"input_ids": [1, 2, 3, 4, 5], "return_routed_experts": True, "routing_start": 3, "return_routing": True}
    assert request.rewrite_body(body, request.parse_routing_options(body))["routed_experts_start_len"] == 3

    api = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    row = next(line for line in api.splitlines() if line.startswith("| `routed_experts` |"))
    shape = re.search(r"`(\[T-1[^`]*\])`", row).group(1)
    assert shape == "[T-1-start, num_hidden_layers, topk]"
    doc = _openapi()["components"]["schemas"]
    assert shape in doc["RoutedMetaInfo"]["properties"]["routed_experts"]["description"]
    from sglang_r3_server.schemas import RoutingOptions  # the request side, parsed by hand: not in /openapi.json

    assert shape in RoutingOptions.model_json_schema()["properties"]["return_routed_experts"]["description"]


def test_the_mtp_section_schema_places_its_tokens_as_api_md_does():
    props = _openapi()["components"]["schemas"]["MtpSection"]["properties"]
    assert "positions + depth (p + 1 at depth 1)" in props["tokens"]["anyOf"][0].get("description", "") + \
        props["tokens"].get("description", "")
    assert "the position p the draft forward ran at" in props["positions"]["description"]
