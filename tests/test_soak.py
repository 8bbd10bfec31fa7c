"""Reduced soak: mixed routed requests, client aborts and forced retractions against one server.

Every routed response must equal the same request sent alone (SGLang's own rows), nothing may be
held for finished requests, and the scheduler must not grow. ``python -m benchmarks.soak`` is the
full run (2,000 requests; figures in benchmarks/README.md).
"""

from __future__ import annotations

import asyncio

from benchmarks.soak import OPTIONS, soak


def test_mixed_requests_with_aborts_and_retractions_stay_exact(soak_server):
    res = asyncio.run(soak(soak_server, n_requests=84, concurrency=16, n_prompts=20, warmup=16))
    assert res.http_errors == []
    assert res.mismatches == []
    assert set(res.by_option) == set(OPTIONS)
    assert res.routed_checked >= 48
    assert res.aborted > 0
    assert res.retractions > 0, "the small KV pool never forced a retraction: the scenario did not happen"
    assert res.held_after == {"draft_requests_held": 0, "main_captures_from_draft": 0}
    if res.rss_growth_mb is not None:
        assert res.rss_growth_mb <= 5.0, res
