"""The client against the real embedded server (session fixture ``routing_server``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sglang_r3.trainer.client import AsyncRoutingClient, RoutingClient, RoutingServerError
from sglang_r3.dev.embedded import ensure_embedded_model
from sglang_r3.core.layout import layout_from_model_path
from sglang_r3.core.record import MtpRouting

pytestmark = pytest.mark.release  # also run on SGLang 0.5.15.post1 (.ci/release-env)

GREEDY = {"temperature": 0, "max_new_tokens": 6}
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


def test_layout_is_the_embedded_models(routing_server):
    with RoutingClient(routing_server) as c:
        assert c.layout() == layout_from_model_path(str(ensure_embedded_model()))


def test_msgpack_and_json_give_the_same_record(routing_server):
    with RoutingClient(routing_server) as mp, RoutingClient(routing_server, binary=False) as js:
        (a,) = mp.generate(input_ids=PROMPT, sampling_params=GREEDY)
        (b,) = js.generate(input_ids=PROMPT, sampling_params=GREEDY)
    assert a.output_ids == b.output_ids and a.prompt_len == len(PROMPT)
    assert a.record.num_tokens == a.num_tokens - 1 and a.record.start == 0
    assert np.array_equal(a.record.experts, b.record.experts)


def test_text_prompt_and_routing_start(routing_server):
    with RoutingClient(routing_server) as c:
        (t,) = c.generate("The quick brown fox", GREEDY)
        assert t.prompt_ids is None and t.record.num_tokens == t.num_tokens - 1
        (r,) = c.generate(input_ids=PROMPT, sampling_params=GREEDY, routing_start=3)
        assert r.record.start == 3 and r.record.num_tokens == r.num_tokens - 1 - 3


def test_mtp_section(routing_server):
    with RoutingClient(routing_server) as c:
        (r,) = c.generate(input_ids=PROMPT, sampling_params=GREEDY, mtp=True)
    assert isinstance(r.record.mtp, MtpRouting)


def test_bad_request_raises_with_the_servers_message(routing_server):
    with RoutingClient(routing_server) as c:
        with pytest.raises(RoutingServerError) as e:
            c.generate(input_ids=[1, 2, 3], sampling_params=GREEDY, routing_start=10)
    assert e.value.status == 400 and e.value.field == "routing_start"
    assert "routing_start=10" in e.value.message


def test_async_many_samples(routing_server):
    seqs = [[5 + i, 6, 7, 8 + i] for i in range(5)]

    async def main():
        async with AsyncRoutingClient(routing_server) as c:
            return await c.generate_many(seqs, GREEDY, batch_size=2, concurrency=2)

    results = asyncio.run(main())
    assert [r.prompt_ids for r in results] == seqs
    assert all(r.record.num_tokens == r.num_tokens - 1 for r in results)
