"""Under DP attention the capture counters count real rows only: ``/routing/stats`` (per DP rank and summed) and
Prometheus' ``sglang_r3:rows_captured_total`` equal the rows of the requests served.

SGLang pads an idle or short rank's batch to the gather's length (``ForwardBatch.prepare_mlp_sync_batch``: an
idle rank runs an IDLE forward of the busy rank's length while the other decodes); every MoE layer routes those
padding tokens too, but no request owns them. Measured before the fix on this server: one 57-token prompt with
12 new tokens pinned to rank 0 counted 79 rows, its forwards computed 68; three uneven concurrent requests
counted 106 for 92; one request on rank 1 alone 44 for 37 (Prometheus likewise, and behind /routing/stats).

The oracle is the requests' own token counts, not the capturer: with speculation off and no prefix reuse (caches
flushed, each prompt starting with a byte no other prompt starts with), a request's forwards compute the KV of its
prompt and of every output token but the last, ``P + N - 1`` tokens, each one row holding every MoE layer's top-k
(the record's ``[T - 1, MoE layers, top-k]``: (token, layer) rows are rows x MoE layers). Every request is
pinned to a DP rank (``routed_dp_rank``, a ``GenerateReqInput`` field on both served releases), and each rank's
counters are checked by the rank its ``/routing/stats`` entry names (``dp_rank``: the list comes in no fixed
order). One 2-rank server for the module (five processes on the CPU runtime).
"""

from __future__ import annotations

import concurrent.futures as cf
import re
from typing import Dict, List, Tuple

import httpx
import pytest

from tests.support.routing_http import TIMEOUT, fetch_layout, flush_cache, greedy, ids, record_of
from tests.support.servers import ServerProcess

pytestmark = [pytest.mark.server, pytest.mark.release]

RANKS = 2
DP_FLAGS = ["--tp-size", str(RANKS), "--dp-size", str(RANKS), "--enable-dp-attention", "--disable-speculation",
            "--enable-metrics"]


@pytest.fixture(scope="module")
def dp_url():
    server = ServerProcess(DP_FLAGS).start()
    try:
        url = server.wait_ready().url
        # One routed request per rank: every rank hands its counters to Prometheus when a routed request
        # finishes there, so the rows of SGLang's own warm-up and health requests are exported before we start.
        for rank in range(RANKS):
            _ask(url, ("warm-up", 2, rank))
        yield url
    finally:
        server.stop()


Request = Tuple[str, int, int]  # prompt, max new tokens, DP rank


def _ask(url: str, req: Request) -> dict:
    prompt, new_tokens, rank = req
    return greedy(url, new_tokens, input_ids=ids(prompt), return_routing=True, routed_dp_rank=rank)


def _stats(url: str) -> Dict[int, dict]:
    stats = httpx.get(url + "/routing/stats", timeout=TIMEOUT).json()
    by_rank = {s["dp_rank"]: s for s in stats}
    assert sorted(by_rank) == list(range(RANKS)), stats
    return by_rank


def _prometheus_rows(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    m = re.search(r"^sglang_r3:rows_captured_total ([0-9.e+]+)$", text, re.M)
    assert m, "sglang_r3:rows_captured_total not on /metrics"
    return float(m.group(1))


def _serve(url: str, reqs: List[Request]) -> Tuple[Dict[int, int], Dict[int, dict], float]:
    """Serve ``reqs`` concurrently; (real rows per rank from the requests' own tokens, per-rank counter deltas,
    Prometheus delta)."""
    flush_cache(url)
    assert len({p[0] for p, _, _ in reqs}) == len(reqs), "each prompt must start with its own byte"
    before, prom_before = _stats(url), _prometheus_rows(url)
    with cf.ThreadPoolExecutor(len(reqs)) as ex:
        outs = list(ex.map(lambda r: _ask(url, r), reqs))
    after, prom_after = _stats(url), _prometheus_rows(url)
    num_moe = len(fetch_layout(url).moe_layer_ids)
    real = {rank: 0 for rank in range(RANKS)}
    for (prompt, _, rank), out in zip(reqs, outs):
        rows = len(ids(prompt)) + len(out["output_ids"]) - 1
        record = record_of(out)
        assert record.experts.shape[:2] == (rows, num_moe), (prompt, record.experts.shape)
        real[rank] += rows
    delta = {r: {k: after[r][k] - before[r][k] for k in ("main_rows_written", "main_forwards", "rows_invalidated")}
             for r in range(RANKS)}
    # Every rank's rows reached Prometheus by the time its last request finished.
    assert prom_after == sum(s["main_rows_written"] for s in after.values())
    return real, delta, prom_after - prom_before


def _assert_real_rows(real: Dict[int, int], delta: Dict[int, dict], prom: float) -> None:
    assert {r: d["main_rows_written"] for r, d in delta.items()} == real, (real, delta)
    assert all(d["rows_invalidated"] == 0 for d in delta.values()), delta
    assert prom == sum(real.values())


def test_a_lone_request_counts_its_rows_and_the_idle_rank_none(dp_url):
    # Rank 1 is idle: it runs an IDLE forward padded to rank 0's length for each of rank 0's decodes.
    prompt = "A" + "q" * 56
    real, delta, prom = _serve(dp_url, [(prompt, 12, 0)])
    _assert_real_rows(real, delta, prom)
    assert real == {0: 57 + 12 - 1, 1: 0}
    assert delta[0]["main_forwards"] == 1 + 11  # one prefill, then a decode per new token but the last
    assert delta[1]["main_forwards"] == 0  # its padded forwards captured no real token


def test_uneven_concurrent_ranks_count_their_own_rows(dp_url):
    # Two requests of different lengths on rank 0 against one on rank 1: the shorter rank is padded.
    reqs = [("B" + "r" * 39, 10, 0), ("C" + "s" * 8, 10, 0), ("D" + "t" * 19, 6, 1)]
    real, delta, prom = _serve(dp_url, reqs)
    _assert_real_rows(real, delta, prom)


def test_a_lone_request_on_the_last_rank(dp_url):
    real, delta, prom = _serve(dp_url, [("E" + "u" * 29, 8, RANKS - 1)])
    _assert_real_rows(real, delta, prom)
    assert delta[0]["main_forwards"] == 0
