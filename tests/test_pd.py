"""PD disaggregation served exactly: a prefill engine started as slime starts one (``tests/scripts/slime_launch.py``:
SGLang's own ``launch_server`` with slime's PD keys, ``SGLANG_R3_ENABLED=1``, chunked prefill) and a decode engine (our
launcher), EAGLE MTP on both, KV over Mooncake's TCP transport, behind SGLang's gateway in PD mode started as slime
starts it (no workers; each engine registers itself through ``/workers``), against a unified server of plain SGLang.

The prompt's rows travel with its KV (sglang_r3/serving/adapter/pd_rows.py), so the decode engine's record holds
the rows the prefill engine's target forward wrote. The reference is plain SGLang's own capturer on a unified server
(``plain_server``: no sglang-r3, spec off) on the same greedy prompts: output tokens equal, our record's main rows
equal its rows at the MoE layers, and upstream's ``routed_experts`` on the decode engine equal its field byte for
byte. Requests go through ``sglang-router`` 0.3.2 ``--pd-disaggregation`` (concurrently, as slime's rollout sends
them: the gateway forwards no routing field in PD mode, and a decode engine with no default routing answers
upstream's field unasked), and by hand as the gateway sends them (the same body with the bootstrap fields to both
engines at once) where a field the gateway drops is needed: ``return_routed_experts`` asked explicitly,
``routing_start`` (a second turn that reuses the first turn's KV on the prefill engine), and the MTP section: the
prompt's draft entries travel with its KV too, so the decode engine's section equals our unified server's (EAGLE MTP,
``routing_server``), and where the prefill engine's body did not ask for it the decode engine refuses it by name
(``mtp_drafted_on_prefill``) while main rows stay exact. The decode engine retracts running requests (SGLang's
``SGLANG_TEST_RETRACT``) and restores their KV from its backup: their rows and MTP entries follow it.

Needs ``mooncake-transfer-engine-non-cuda`` (the ``test`` extra) and the system library ``libibverbs.so.1``
(Debian: ``apt-get install -y libibverbs1``; ``.ci/run`` installs it); without either this module fails naming it.
"""

from __future__ import annotations

import ctypes
import json
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from sglang_r3.core.record import RoutingRecord
from sglang_r3.serving.fleet.gateway import free_port
from tests.support.launch_paths import OPT_IN, SLIME_OVERRIDES, SPEC_OVERRIDES, SlimeLaunchServer
from tests.support.routing_http import TIMEOUT
from tests.support.servers import ChildProcess, ServerProcess, assert_main_rows_equal_plain_sglang, plain_rows

pytestmark = [pytest.mark.server, pytest.mark.release]


def _release() -> str:
    import importlib.metadata

    return importlib.metadata.version("sglang")

MOONCAKE_ENV = {"MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
PROMPTS = [list(b"The capital of France is"), list(b"1 2 3 4 5 6 7 8"),
           list(b"Once upon a time, in a small village by the sea, there")]
NEW = 10
CHUNK = 16  # the prefill engine's --chunked-prefill-size: every prompt here but "1 2 3 4 5 6 7 8" spans chunks
SMALL_POOL = 200  # KV slots of the decode engine that a peer without rows serves
LONG = 48  # a retraction test's completions: long enough that the decode engine's batch holds several requests
RETRACT_EVERY = 3
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": str(RETRACT_EVERY)}
INSTALL = ("PD tests need Mooncake's transfer engine: `pip install -e \".[test]\"` installs "
           "mooncake-transfer-engine-non-cuda, and it loads the system library libibverbs.so.1 "
           "(Debian/Ubuntu: `apt-get install -y libibverbs1`; .ci/run installs both)")


def _require_mooncake() -> None:
    try:
        ctypes.CDLL("libibverbs.so.1")
    except OSError as e:
        pytest.fail(f"libibverbs.so.1 is missing ({e}). {INSTALL}", pytrace=False)
    r = subprocess.run([sys.executable, "-c", "from mooncake.engine import TransferEngine"], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        pytest.fail(f"mooncake's TransferEngine does not import ({r.stderr.strip().splitlines()[-1:]}). {INSTALL}",
                    pytrace=False)


def _wait(proc: ChildProcess, url: str, ok, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.proc.returncode}:\n{proc.log_tail()}")
        try:
            r = httpx.get(url, timeout=10)
            if r.status_code == 200 and ok(r):
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} not ready:\n{proc.log_tail()}")


class Pair:
    def __init__(self, pre: ServerProcess, dec: ServerProcess, bootstrap: int, gateway: str):
        self.pre, self.dec, self.bootstrap, self.gateway = pre, dec, bootstrap, gateway

    def by_gateway(self, ids, new: int = NEW) -> dict:
        """slime's rollout request (``sglang_rollout.py``: return_routed_experts under --use-rollout-routing-replay)
        through the gateway, which forwards neither routing field in PD mode (sglang-router 0.3.2: seen); the decode
        engine answers upstream's field unasked (server/request.py)."""
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0},
                "return_logprob": True, "return_routed_experts": True}
        for _ in range(60):  # the gateway answers 503 until its health checks admit both workers
            r = httpx.post(self.gateway + "/generate", json=body, timeout=TIMEOUT)
            if r.status_code != 503:
                break
            time.sleep(1)
        assert r.status_code == 200, r.text
        return r.json()

    def by_hand(self, ids, prefill_body=None, **extra) -> tuple:
        """The gateway's PD request by hand: one body with the bootstrap fields to both engines at once (the prefill
        engine's fields replaced by ``prefill_body`` where given); the prefill engine's and the decode engine's own
        responses."""
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW, "temperature": 0},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": self.bootstrap,
                "bootstrap_room": random.randrange(1, 2 ** 62), **extra}
        bodies = ({**{k: v for k, v in body.items() if k not in extra}, **prefill_body} if prefill_body else body,
                  body)
        with ThreadPoolExecutor(2) as ex:
            outs = list(ex.map(lambda ub: httpx.post(ub[0] + "/generate", json=ub[1], timeout=TIMEOUT),
                               zip((self.pre.url, self.dec.url), bodies)))
        for r in outs:
            assert r.status_code == 200, r.text
        return outs[0].json(), outs[1].json()


@pytest.fixture(scope="module")
def pd():
    """Prefill + decode engines (the embedded model's default: EAGLE MTP on) and sglang-router in PD mode, started
    here and stopped after the module."""
    _require_mooncake()
    bootstrap = free_port()
    # No default routing: as slime runs its engines (SGLANG_R3_ENABLED=1, --enable-return-routed-experts).
    common = ["--host", "127.0.0.1", "--disaggregation-transfer-backend", "mooncake"]
    assert common[2:4] == ["--disaggregation-transfer-backend", "mooncake"]
    # The prefill engine as slime starts a prefill worker (tests/scripts/slime_launch.py, a stand-in for slime's engine
    # actor: SGLang's own launch_server in a child process, SGLANG_R3_ENABLED=1, its PD keys), chunked: a prompt longer
    # than CHUNK tokens is prefilled in chunks, and its rows travel with the last one.
    pre = SlimeLaunchServer([json.dumps({**SLIME_OVERRIDES, **SPEC_OVERRIDES, "disaggregation_transfer_backend": "mooncake",
                                         "chunked_prefill_size": CHUNK}), "prefill", str(bootstrap)],
                            env={**MOONCAKE_ENV, **OPT_IN})
    # The decode engine retracts running requests (SGLang's own switch, every RETRACT_EVERY-th forward) and backs
    # their KV up into CPU tensors: a resumed request's KV comes back into new slots with no forward, and its rows
    # must follow. cpu_tensor, not 0.5.23's default host_pool: SGLang sizes a host pool after a 10 GiB reserve of host
    # memory (mem_cache/pool_host/base.py), which a small CI machine does not have; our hooks are the same for both.
    # 0.5.15.post1 has CPU copies only (Req.offload_kv_cache), and no such flag.
    backup = [] if _release() == "0.5.15.post1" else ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    dec = ServerProcess([*common, "--disaggregation-mode", "decode", *backup], env={**MOONCAKE_ENV, **RETRACT_ENV})
    gw = ChildProcess()
    try:
        pre.start()
        dec.start()
        _wait(pre, pre.url + "/health", lambda r: True)
        _wait(dec, dec.url + "/health", lambda r: True)
        # The gateway as slime's _start_router starts it (slime/ray/rollout.py): PD mode, no workers, circuit
        # breaker and health checks off; each engine then registers itself (slime's _register_to_router: POST
        # /workers, a prefill worker with its bootstrap port).
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gw.spawn([sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host", "127.0.0.1",
                  "--port", str(port), "--policy", "round_robin", "--prometheus-port", str(free_port()),
                  "--disable-circuit-breaker", "--disable-health-check"], "sglang-router-pd-")
        _wait(gw, url + "/workers", lambda r: True, timeout=120)
        for body in ({"url": pre.url, "worker_type": "prefill", "bootstrap_port": bootstrap},
                     {"url": dec.url, "worker_type": "decode"}):
            httpx.post(url + "/workers", json=body, timeout=60).raise_for_status()
        _wait(gw, url + "/workers", lambda r: r.json()["stats"]["prefill_count"] == r.json()["stats"]["decode_count"] == 1,
              timeout=120)
        yield Pair(pre, dec, bootstrap, url)
    finally:
        gw.stop()
        dec.stop()
        pre.stop()


def _plain(url: str, ids, new: int = NEW) -> dict:
    r = httpx.post(url + "/generate", json={"input_ids": ids, "return_routed_experts": True,
                                            "sampling_params": {"max_new_tokens": new, "temperature": 0}},
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def test_concurrent_requests_through_the_pd_gateway_carry_the_unified_servers_rows(pd, plain_server):
    want = [_plain(plain_server, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = list(ex.map(pd.by_gateway, PROMPTS))
    for i, (g, w, p) in enumerate(zip(got, want, PROMPTS)):
        assert "routed_experts" in g["meta_info"], sorted(g["meta_info"])  # what slime's Sample reads
        # Upstream's field from the decode engine: every row, the prompt's (computed on the prefill engine)
        # included, byte for byte plain SGLang's.
        assert_main_rows_equal_plain_sglang(g, w, len(p), what=f"prompt {i} through the PD gateway")
    # The prefill engine prefilled in chunks (SGLang's log line for each prefill batch).
    chunks = re.findall(r"Prefill batch, .*#new-token: (\d+),", pd.pre.log_path.read_text())
    assert str(CHUNK) in chunks, f"no chunk of {CHUNK} tokens on the prefill engine: {chunks}"


def test_requests_the_decode_engine_retracts_and_resumes_keep_their_rows(pd, plain_server):
    """Longer completions, all at once: the decode engine's batch holds several requests when SGLang's switch
    retracts (it never retracts the last one of a batch), and each resumed request's KV comes back from its backup
    into new slots."""
    prompts = [p + list(f" #{k}".encode()) for k in range(2) for p in PROMPTS]
    want = [_plain(plain_server, p, LONG) for p in prompts]
    before = _retracted(pd.dec)
    with ThreadPoolExecutor(len(prompts)) as ex:
        got = list(ex.map(lambda p: pd.by_gateway(p, LONG), prompts))
    assert _retracted(pd.dec) > before, f"the decode engine retracted nothing:\n{pd.dec.log_tail()}"
    for i, (g, w, p) in enumerate(zip(got, want, prompts)):
        assert_main_rows_equal_plain_sglang(g, w, len(p), what=f"prompt {i}, retractions on the decode engine")


def _retracted(proc: ServerProcess) -> int:
    """Requests SGLang's decode engine has retracted so far (its log's line for each forced retraction)."""
    return sum(int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)", proc.log_path.read_text()))


def test_the_decode_engines_upstream_field_and_a_second_turn_from_routing_start(pd, plain_server):
    first = PROMPTS[2]
    pre, dec = pd.by_hand(first, return_routed_experts=True)
    want = _plain(plain_server, first)
    assert_main_rows_equal_plain_sglang(dec, want, len(first), what="first turn on the decode engine")
    assert dec["meta_info"]["routed_experts"] == want["meta_info"]["routed_experts"]
    # A body with no routing field (what the gateway forwards): upstream's field all the same.
    _, bare = pd.by_hand(first)
    assert bare["meta_info"].get("routed_experts") == want["meta_info"]["routed_experts"], sorted(bare["meta_info"])
    # The second turn: the first turn's prompt and completion plus new text (its prefix is in the prefill engine's
    # cache), rows from the new turn's first token on.
    second = first + dec["output_ids"] + list(b" and then")
    start = len(first) + len(dec["output_ids"])
    _, dec2 = pd.by_hand(second, return_routing=True, routing_start=start)
    want2 = plain_rows(_plain(plain_server, second)["meta_info"]["routed_experts"])
    assert "routing_error" not in dec2["meta_info"], dec2["meta_info"].get("routing_error")
    rec = RoutingRecord.from_wire(dec2["meta_info"]["routing"])
    assert rec.start == start and rec.num_tokens == want2.shape[0] - start, (rec.start, rec.num_tokens)
    np.testing.assert_array_equal(np.sort(rec.experts.astype(np.int32), axis=-1),
                                  np.sort(want2[start:, list(rec.layers)], axis=-1))


def _mtp_section(out: dict):
    assert "routing_error" not in out["meta_info"], out["meta_info"].get("routing_error")
    return RoutingRecord.from_wire(out["meta_info"]["routing"])


def _assert_mtp_sections_equal(got, want, what: str) -> None:
    """Entry for entry: position, depth, step, accepted, token and experts. Not ``rounds``, a server-wide counter."""
    assert got.mtp is not None and want.mtp is not None, what
    for col in ("positions", "depth", "step", "accepted", "tokens", "experts"):
        np.testing.assert_array_equal(getattr(got.mtp, col), getattr(want.mtp, col), err_msg=f"{what}: mtp.{col}")


def test_the_mtp_section_on_the_decode_engine_equals_a_unified_servers(pd, plain_server, routing_server):
    """The prompt's draft-extend ran on the prefill engine (in chunks): its entries travel with the KV and the
    decode engine answers the whole section, equal to our unified server's (EAGLE MTP, the same flags) on the same
    greedy prompt; main rows stay plain SGLang's. Prompts no earlier request shares a prefix with: where a server
    holds a prefix in its cache, its section starts after it (SGLang's warm-up request, "The capital city of France
    is", leaves its prefix in a unified server's cache; the tests above leave theirs on the prefill engine)."""
    for i, ids in enumerate((list(b"Sections of drafts are prefilled in chunks of sixteen tokens"),
                             list(b"Drafts travel with the KV, page by page"))):
        _, dec = pd.by_hand(ids, return_routing={"mtp": True})
        r = httpx.post(routing_server + "/generate", json={"input_ids": ids, "return_routing": {"mtp": True},
                                                          "sampling_params": {"max_new_tokens": NEW, "temperature": 0}},
                       timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        got, want = _mtp_section(dec), _mtp_section(r.json())
        assert dec["output_ids"] == r.json()["output_ids"]
        # The prompt's entries (step 0 at every prompt position) came from the prefill engine.
        assert set(range(len(ids))) <= set(got.mtp.positions[got.mtp.step == 0].tolist()), got.mtp.positions
        _assert_mtp_sections_equal(got, want, f"prompt {i}: PD decode engine vs unified server")
        assert_main_rows_equal_plain_sglang(dec, _plain(plain_server, ids), len(ids), what=f"prompt {i}, MTP on")


def test_requests_the_decode_engine_retracts_and_resumes_keep_their_mtp_sections(pd, routing_server):
    """As the retraction test above, by hand with the MTP section asked: a retracted request's draft entries leave
    its freed row with its KV backup and come back with it. Against the unified server on the same prompt: the
    prompt's entries (from the prefill engine) equal, and a draft-extend entry at every verified position, as
    there (a request whose entries were dropped at its retraction would lack every one before it). The drafts of
    a resumed request's next round are SGLang's to choose again (its draft input is rebuilt at resume), so the
    rounds after a retraction may accept otherwise: every accepted entry routed the sequence's own token."""
    # No two share a first token: the prefill engine's cache and the unified server's hold no common prefix.
    prompts = [list(f"{w} drafts travel on".encode()) for w in ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Fox")]
    before = _retracted(pd.dec)
    with ThreadPoolExecutor(len(prompts)) as ex:
        got = list(ex.map(lambda p: pd.by_hand(p, return_routing={"mtp": True},
                                               sampling_params={"max_new_tokens": LONG, "temperature": 0})[1],
                          prompts))
    assert _retracted(pd.dec) > before, f"the decode engine retracted nothing:\n{pd.dec.log_tail()}"
    for i, (g, p) in enumerate(zip(got, prompts)):
        r = httpx.post(routing_server + "/generate", json={"input_ids": p, "return_routing": {"mtp": True},
                                                          "sampling_params": {"max_new_tokens": LONG, "temperature": 0}},
                       timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert g["output_ids"] == r.json()["output_ids"], i
        got, want = _mtp_section(g).mtp, _mtp_section(r.json()).mtp
        prompt_got, prompt_want = ((m.step == 0) & (m.positions < len(p)) for m in (got, want))
        for col in ("positions", "depth", "accepted", "tokens", "experts"):
            np.testing.assert_array_equal(getattr(got, col)[prompt_got], getattr(want, col)[prompt_want],
                                          err_msg=f"prompt {i}: the prompt's entries, mtp.{col}")
        seq = np.asarray(p + g["output_ids"])
        # Draft-extend entries of tokens in the sequence (a last verify may accept past the stop: never accepted).
        verified = [{int(x) for x in m.positions[(m.step == 0) & (m.positions + 1 < len(seq))]} for m in (got, want)]
        assert verified[0] == verified[1] == set(range(len(seq) - 1)), i
        ok = got.accepted
        np.testing.assert_array_equal(got.tokens[ok], seq[got.positions[ok] + 1], err_msg=f"prompt {i}: accepted")


def test_an_mtp_section_whose_prompt_drafts_did_not_travel_is_refused_by_name(pd, plain_server):
    """The prefill engine's body did not ask for the MTP section, so its draft-extend filed nothing to send: the
    decode engine refuses the section by name (never a short one), and main rows stay exact."""
    ids = PROMPTS[0]
    _, dec = pd.by_hand(ids, prefill_body={"return_routing": True}, return_routing={"mtp": True})
    err = dec["meta_info"].get("routing_error")
    assert "routing" not in dec["meta_info"] and err and err["code"] == "mtp_drafted_on_prefill", dec["meta_info"]
    assert f"for {len(ids)} of the prompt's {len(ids)} positions" in err["message"], err
    _, dec = pd.by_hand(ids, return_routing=True)
    assert_main_rows_equal_plain_sglang(dec, _plain(plain_server, ids), len(ids), what="main rows, MTP on")


def _set_weight_version(url: str, version: str) -> None:
    r = httpx.post(url + "/update_weight_version", json={"new_version": version, "abort_all_requests": False},
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text


def test_the_record_names_the_prefill_engines_weight_version_where_it_is_not_the_decode_engines(pd):
    """The prompt's rows and the first output token come from the prefill engine's weights: where it serves another
    weight version than the decode engine (SGLang's /update_weight_version on one engine), the output's
    weight_versions spans name both and the record says ``mixed:`` (the trainer refuses it); where both serve one
    version, that version. On 0.5.15.post1, whose scheduler holds only the start-up --weight-version, each engine's
    TokenizerManager stamps the version it serves into the request (release.served_weight_version)."""
    ids = list(b"Weights of two engines")
    try:
        _set_weight_version(pd.pre.url, "v-prefill")
        _, dec = pd.by_hand(ids, return_routing=True)
        spans = [s["version"] if isinstance(s, dict) else s[0] for s in dec["meta_info"]["weight_versions"]]
        assert spans == ["v-prefill", "default"], dec["meta_info"]["weight_versions"]
        assert RoutingRecord.from_wire(dec["meta_info"]["routing"]).weight_version == "mixed:v-prefill,default"
        _set_weight_version(pd.dec.url, "v-prefill")
        _, dec = pd.by_hand(ids, return_routing=True)
        assert RoutingRecord.from_wire(dec["meta_info"]["routing"]).weight_version == "v-prefill", dec["meta_info"]
    finally:
        _set_weight_version(pd.pre.url, "default")
        _set_weight_version(pd.dec.url, "default")


def test_a_prefill_engine_that_sends_no_rows_leaves_missing_rows_never_old_ones(plain_server):
    """SGLang 0.5.15.post1 pairs a decode engine with any prefill engine whose KV layout matches (0.5.23's KV layout
    digest refuses a peer without our rows). Plain SGLang prefilling for our decode engine sends KV and no rows: the
    decode engine's prompt slots stay unmarked (pd_rows.unmark_preallocated_slots), so the record is missing_rows
    for every prompt row, even where a slot last held a row our decode engine wrote for an earlier request."""
    if _release() != "0.5.15.post1":
        pytest.skip("SGLang 0.5.23 refuses this pair itself: a peer without our rows has another KV layout digest")
    _require_mooncake()
    bootstrap = free_port()
    common = ["--disaggregation-transfer-backend", "mooncake"]
    from benchmarks.run import PlainServer  # SGLang without R3, flags resolved as our launcher does

    pre = PlainServer([*common, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap)],
                      env={**MOONCAKE_ENV, "SGLANG_PLUGINS": "none"})
    # A KV pool this small hands a request the slots an earlier one freed (the allocator sorts freed pages back in
    # once its free list runs short): slots the decode engine itself marked for the earlier request's completion.
    dec = ServerProcess(["--host", "127.0.0.1", *common, "--disaggregation-mode", "decode", "--max-total-tokens",
                         str(SMALL_POOL), "--num-reserved-decode-tokens", "16"], env=MOONCAKE_ENV)
    try:
        pre.start()
        dec.start()
        _wait(pre, pre.url + "/health", lambda r: True)
        _wait(dec, dec.url + "/health", lambda r: True)
        pair = Pair(pre, dec, bootstrap, gateway="")
        # Short prompts, long completions: the decode engine marks the slots of the tokens it computes, then frees
        # them; the longer prompts after take some of those slots.
        for ids in [PROMPTS[1]] * 3 + [PROMPTS[0], PROMPTS[2]]:
            _, dec_out = pair.by_hand(ids, return_routing=True,
                                      sampling_params={"max_new_tokens": LONG, "temperature": 0})
            err = dec_out["meta_info"].get("routing_error")
            assert err and err["code"] == "missing_rows" and err["missing_rows"] == len(ids), dec_out["meta_info"]
            assert dec_out["output_ids"] == _plain(plain_server, ids, LONG)["output_ids"]
    finally:
        dec.stop()
        pre.stop()
