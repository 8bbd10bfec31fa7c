"""DP attention served with exact rows on every DP rank, as slime's GLM-4.7 rollout runs it.

slime's GLM-4.7 guide (THUDM/slime 624b824, ``scripts/run-glm4.7-30B-A3B.sh``) serves with
``--enable-dp-attention --dp-size 8 --ep-size 8 --enable-dp-lm-head --moe-dense-tp-size 1`` and EAGLE MTP 3/1/4;
here the same flags at 2 ranks on the CPU runtime (expert parallelism included: each rank holds half the experts,
``sglang_r3/cpu_runtime/platform/expert_parallel.py``), with chunked prefill; 3 ranks without expert parallelism
(16 experts do not split 3 ways), where a window taken from the tail of the gathered batch is not the one taken
from its head; and (slime's launch path) forced retractions. Under DP attention every MoE layer routes the tokens
of all DP ranks gathered into one batch, so rank 1's rows are not at the front of what its router sees.

Every request is pinned to a DP rank (``routed_dp_rank``, SGLang's own /generate field on both served
releases), and the rank that served it is read back from SGLang's ``meta_info["dp_rank"]``.

Oracles: plain SGLang's own ``RoutedExpertsCapturer`` (``benchmarks/plain_server.py --upstream-capture``: no
sglang-r3 patch but the CPU runtime's) on one rank (the suite's ``plain_server``, spec off: a row is a function of
the tokens, so requests pinned to DP ranks have one rank's rows) for every class, and in the same DP configuration
under the same concurrent, pinned load for slime's launch path; and the suite's one-rank servers of ours on the same
prompts (``nospec_server`` for main rows and our field, ``routing_server`` for the MTP section, which plain SGLang
does not capture). Each class holds one DP server (five or six processes, 6-8 GB on the CPU runtime), started when
the class starts and stopped when it ends.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
from typing import List, Optional, Sequence

import numpy as np
import pytest

from benchmarks.run import PlainServer
from benchmarks.soak import SOAK_SERVER_ENV
from tests.support.launch_paths import OPT_IN, SLIME_OVERRIDES, SlimeLaunchServer
from tests.support.routing_http import flush_cache, greedy, ids, record_of
from tests.support.servers import ServerProcess, assert_main_rows_equal_plain_sglang

pytestmark = [pytest.mark.server, pytest.mark.release]

DP = ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]
# slime's flags (its guide: --ep-size 8 with --dp-size 8); the all-to-all backend stays none, as there.
SLIME_GLM47 = DP + ["--enable-dp-lm-head", "--moe-dense-tp-size", "1", "--ep-size", "2"]
DP3 = ["--tp-size", "3", "--dp-size", "3", "--enable-dp-attention", "--enable-dp-lm-head", "--moe-dense-tp-size", "1"]
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]
# Prefill chunks of 64 tokens: the long prompt is prefilled in several chunked forwards.
CHUNKED = ["--chunked-prefill-size", "64"]
NEW_TOKENS = 20
MAX_BATCHES = 12
PROMPTS = [
    "Hello there, how are you?",
    "x",
    "The quick brown fox jumps over the lazy dog, again and again and again.",
    "abc" * 70,  # 210 tokens: chunked prefill
    "Routing replay keeps the policy ratio honest.",
    "MTP layers draft tokens the verify pass checks.",
]


def _ask(url: str, prompt: str, mtp: bool = False, rank: Optional[int] = None, plain: bool = False, **extra) -> dict:
    body = dict(input_ids=ids(prompt), return_routed_experts=True, **extra)
    if not plain:  # plain SGLang's /generate has no routing options
        body["return_routing"] = {"mtp": True} if mtp else True
    if rank is not None:
        body["routed_dp_rank"] = rank  # SGLang's own field (0.5.23 also takes the older data_parallel_rank)
    out = greedy(url, NEW_TOKENS, **body)
    if rank is not None:
        assert out["meta_info"]["dp_rank"] == rank, (prompt, out["meta_info"].get("dp_rank"))
    return out


def _batch(url: str, prompts: Sequence[str], mtp: bool = False, ranks: Optional[Sequence[int]] = None,
           dp: int = 2, plain: bool = False) -> List[dict]:
    """Concurrent requests, each pinned to a rank (by default prompt i to rank i % dp)."""
    ranks = [i % dp for i in range(len(prompts))] if ranks is None else ranks
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(lambda pr: _ask(url, pr[0], mtp, pr[1], plain), zip(prompts, ranks)))


def _assert_same_rows(got: dict, want: dict, prompt: str) -> None:
    assert got["output_ids"] == want["output_ids"], prompt
    assert "routing_error" not in got["meta_info"], got["meta_info"]["routing_error"]
    np.testing.assert_array_equal(record_of(got).experts, record_of(want).experts, err_msg=prompt)
    assert got["meta_info"]["routed_experts"] == want["meta_info"]["routed_experts"], prompt


def _assert_same_mtp(got: dict, want: dict, prompt: str) -> None:
    a, b = record_of(got).mtp, record_of(want).mtp
    assert a is not None and a.num_entries > 0, prompt
    for field in ("positions", "depth", "step", "accepted", "experts", "tokens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=f"{prompt}: {field}")


class _OneRank:
    """The one-rank server's answers (spec off), asked once per prompt."""

    def __init__(self, url: str):
        self.url, self._answers = url, {}

    def __getitem__(self, prompt: str) -> dict:
        if prompt not in self._answers:
            self._answers[prompt] = _ask(self.url, prompt)
        return self._answers[prompt]


@pytest.fixture(scope="module")
def one_rank(nospec_server) -> _OneRank:
    return _OneRank(nospec_server)


class _PlainOneRank(_OneRank):
    """Plain SGLang's answers (its own capturer, one rank, spec off), asked once per prompt."""

    def __getitem__(self, prompt: str) -> dict:
        if prompt not in self._answers:
            self._answers[prompt] = _ask(self.url, prompt, plain=True)
        return self._answers[prompt]


@pytest.fixture(scope="module")
def plain_one_rank(plain_server) -> _PlainOneRank:
    return _PlainOneRank(plain_server)


def _assert_plain_rows(outs: Sequence[dict], prompts: Sequence[str], plain, what: str) -> None:
    for prompt, got in zip(prompts, outs):
        assert_main_rows_equal_plain_sglang(got, plain[prompt], len(ids(prompt)), f"{what}: {prompt!r}")


class _Served:
    def __init__(self, server):
        self.server = server

    def __enter__(self):
        return self.server.start().wait_ready().url

    def __exit__(self, *exc):
        self.server.stop()


class TestOurLauncherWithSlimesGlm47Flags:
    """2 DP ranks, expert parallelism over both (each holds 8 of the 16 experts: a token's output is its two
    ranks' partial sums), EAGLE MTP, chunked prefill."""

    @pytest.fixture(scope="class")
    def dp_url(self):
        with _Served(ServerProcess(SLIME_GLM47 + EAGLE + CHUNKED)) as url:
            yield url

    def test_batch_rows_on_both_dp_ranks_equal_a_one_rank_server(self, dp_url, one_rank):
        outs = _batch(dp_url, PROMPTS)  # prompt i on rank i % 2: the 210-token prompt's chunks on rank 1
        for prompt, got in zip(PROMPTS, outs):
            _assert_same_rows(got, one_rank[prompt], prompt)

    def test_batch_rows_on_both_dp_ranks_equal_plain_sglangs_own_capturer(self, dp_url, plain_one_rank):
        _assert_plain_rows(_batch(dp_url, PROMPTS), PROMPTS, plain_one_rank, "2 DP ranks, EP, MTP")

    def test_a_lone_request_with_the_other_rank_idle(self, dp_url, one_rank):
        # The idle rank still joins every MoE layer's gather (an IDLE forward); the busy one files its rows.
        for rank, prompt in enumerate(PROMPTS[:2]):
            _assert_same_rows(_ask(dp_url, prompt, rank=1 - rank), one_rank[prompt], prompt)

    def test_prefix_reuse_keeps_rows_exact(self, dp_url, one_rank):
        # A different prompt per rank, each sharing a prefix with its rank's earlier one only: rows filed from
        # the other rank's window, or a prefix matched against the other rank's cache, would differ.
        firsts = [PROMPTS[2], PROMPTS[4] + " " + PROMPTS[5]]
        _batch(dp_url, firsts)
        seconds = [firsts[0] + " And once more.", firsts[1] + " Twice."]
        outs = _batch(dp_url, seconds)
        for prompt, got in zip(seconds, outs):
            assert got["meta_info"]["cached_tokens"] > 0, prompt
            _assert_same_rows(got, one_rank[prompt], prompt)

    def test_mtp_section_equals_a_one_rank_speculative_server(self, dp_url, routing_server):
        # Draft routing lives in its own section; with empty prefix caches on both servers, every draft
        # forward of a request routes the same tokens with the same MTP layer on either.
        flush_cache(dp_url)
        flush_cache(routing_server)
        ours = _batch(dp_url, PROMPTS, mtp=True)
        ref = _batch(routing_server, PROMPTS, mtp=True, ranks=[None] * len(PROMPTS))
        for prompt, got, want in zip(PROMPTS, ours, ref):
            _assert_same_mtp(got, want, prompt)


# Three ranks' worth of work for one batch: very different loads (a 210-token prompt prefilled in 64-token chunks
# on rank 0 while rank 1 decodes a short one and rank 2 prefills a 120-token prompt in two chunks after a
# one-token one), then rank 0 idle while ranks 1 and 2 decode.
UNEVEN = [("abc" * 70, 0), ("Hello there, how are you?", 1), ("x", 2), ("The quick brown fox " * 6, 2)]
IDLE_RANK_0 = [("Routing replay keeps the policy ratio honest.", 1), ("MTP layers draft tokens.", 2)]
# A different stem per rank, asked twice with different endings: the second round reuses each rank's own prefix.
STEMS = ["Rank zero keeps its own prefix: " * 2, "A different stem for rank one, longer than the others. ",
         "two:" * 12]
PARTIAL = "partial rollout prompt, continued on every rank"


class TestThreeRanks:
    """3 DP ranks (slime's flags but expert parallelism), EAGLE MTP, chunked prefill: every request pinned."""

    @pytest.fixture(scope="class")
    def dp_url(self):
        with _Served(ServerProcess(DP3 + EAGLE + CHUNKED)) as url:
            yield url

    def test_uneven_loads_and_chunked_prefills_in_one_batch(self, dp_url, one_rank):
        prompts, ranks = zip(*UNEVEN)
        for prompt, got in zip(prompts, _batch(dp_url, prompts, ranks=ranks)):
            _assert_same_rows(got, one_rank[prompt], prompt)

    def test_uneven_loads_equal_plain_sglangs_own_capturer(self, dp_url, plain_one_rank):
        prompts, ranks = zip(*UNEVEN)
        _assert_plain_rows(_batch(dp_url, prompts, ranks=ranks), prompts, plain_one_rank, "3 DP ranks, MTP")

    def test_rank_0_idle_while_ranks_1_and_2_decode(self, dp_url, one_rank):
        # Rank 0's slot at the head of the gather is empty: ranks 1 and 2 start at 0 and at rank 1's count.
        prompts, ranks = zip(*IDLE_RANK_0)
        for prompt, got in zip(prompts, _batch(dp_url, prompts, ranks=ranks)):
            _assert_same_rows(got, one_rank[prompt], prompt)

    def test_prefix_reuse_with_a_different_prompt_per_rank(self, dp_url, one_rank):
        _batch(dp_url, [stem + "first" for stem in STEMS], dp=3)
        seconds = [stem + "second" for stem in STEMS]
        for prompt, got in zip(seconds, _batch(dp_url, seconds, dp=3)):
            assert got["meta_info"]["cached_tokens"] > 0, prompt
            _assert_same_rows(got, one_rank[prompt], prompt)

    def test_partial_rollouts_on_every_rank(self, dp_url, one_rank):
        # routing_start: rows (ours and upstream's) from that token on, each rank cutting its own request.
        starts = [5, 12, 19]
        full = one_rank[PARTIAL]
        with cf.ThreadPoolExecutor(3) as ex:
            outs = list(ex.map(lambda r: _ask(dp_url, PARTIAL, rank=r, routing_start=starts[r]), range(3)))
        rows = np.frombuffer(base64.b64decode(full["meta_info"]["routed_experts"]), dtype=np.int32)
        rows = rows.reshape(record_of(full).num_tokens, -1)
        for start, got in zip(starts, outs):
            assert got["output_ids"] == full["output_ids"]
            rec = record_of(got)
            assert rec.start == start
            np.testing.assert_array_equal(rec.experts, record_of(full).experts[start:])
            upstream = np.frombuffer(base64.b64decode(got["meta_info"]["routed_experts"]), dtype=np.int32)
            np.testing.assert_array_equal(upstream.reshape(-1, rows.shape[1]), rows[start:])

    def test_mtp_section_equals_a_one_rank_speculative_server(self, dp_url, routing_server):
        prompts = [p for p, _ in UNEVEN[:3]]
        flush_cache(dp_url)
        flush_cache(routing_server)
        ours = _batch(dp_url, prompts, mtp=True, ranks=[0, 1, 2])
        ref = _batch(routing_server, prompts, mtp=True, ranks=[None] * 3)
        for prompt, got, want in zip(prompts, ours, ref):
            _assert_same_mtp(got, want, prompt)


class TestSlimesLaunchPathAndPlainSGLang:
    """SGLang's own ``http_server.launch_server(ServerArgs)`` in a child process (slime's way) under
    ``SGLANG_R3_ENABLED=1``, then plain SGLang with its own capturer, both with DP attention, spec off."""

    @pytest.fixture(scope="class")
    def slime_answers(self):
        overrides = {**SLIME_OVERRIDES, "tp_size": 2, "dp_size": 2, "enable_dp_attention": True,
                     "enable_dp_lm_head": True, "moe_dense_tp_size": 1}
        import json

        # SGLang's own test switch retracts running requests every 10th forward (benchmarks/soak.py); retracted
        # requests are recomputed on whichever slots they get back. Which decode step lands on a retracting
        # forward depends on how the batch was scheduled, so batches are sent (each checked) until a request
        # was retracted, at most MAX_BATCHES. (Not on the speculative server above: a retracted request's
        # MTP section is drafted again, so it cannot equal a one-rank server's.)
        with _Served(SlimeLaunchServer([json.dumps(overrides)], env={**OPT_IN, **SOAK_SERVER_ENV})) as url:
            batches = []
            for _ in range(MAX_BATCHES):
                batches.append(_batch(url, PROMPTS))
                if sum(int(o["meta_info"].get("num_retractions") or 0) for o in batches[-1]):
                    break
            yield batches

    @pytest.fixture(scope="class")
    def plain_answers(self, slime_answers):  # after slime's server stopped: one DP server at a time
        with _Served(PlainServer(DP + ["--disable-speculation", "--upstream-capture"])) as url:
            # The same concurrent load as ours, pinned as ours was (prompt i on rank i % 2).
            yield _batch(url, PROMPTS, plain=True)

    def test_slime_launch_path_rows_equal_a_one_rank_server_through_retractions(self, slime_answers, one_rank):
        for batch in slime_answers:
            for prompt, got in zip(PROMPTS, batch):
                _assert_same_rows(got, one_rank[prompt], prompt)
        retracted = sum(int(o["meta_info"].get("num_retractions") or 0) for o in slime_answers[-1])
        assert retracted, f"no request was retracted in {len(slime_answers)} batches"

    def test_plain_sglangs_own_capturer_returns_what_we_return(self, slime_answers, plain_answers):
        # Plain SGLang with the same DP attention, against our record's main rows and our routed_experts field.
        _assert_plain_rows(slime_answers[0], PROMPTS, dict(zip(PROMPTS, plain_answers)), "slime's launch path, 2 DP")

