"""In-process ``sglang.Engine`` (verl's path: TokenizerManager.generate_request) keeps upstream's contract: its main rows
are plain SGLang's own capturer's, and its record and field our server's."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_r3.core.record import RoutingRecord
from tests.support.routing_http import greedy, record_of
from tests.support.servers import assert_main_rows_equal_plain_sglang

pytestmark = pytest.mark.release  # also run on SGLang 0.5.15.post1 (.ci/release-env)

PROMPT = list(b"in-process engine")


@pytest.fixture(scope="module")
def engine_out() -> dict:
    root = Path(__file__).resolve().parents[1]
    script = root / "tests" / "scripts" / "engine_check.py"
    run = subprocess.run([sys.executable, str(script), json.dumps(PROMPT)], capture_output=True, text=True,
                         timeout=900, cwd=root)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_engine_main_rows_equal_plain_sglangs_own_capturer(engine_out, plain_server):
    """The oracle: plain SGLang's own capturer (no sglang-r3, spec off) on the same greedy request, against the
    Engine's record and its ``routed_experts`` field."""
    assert engine_out["routing_error"] is None, engine_out["routing_error"]
    plain = greedy(plain_server, 6, input_ids=PROMPT, return_routed_experts=True)  # the Engine's 6 tokens
    ours = {"output_ids": engine_out["output_ids"],
            "meta_info": {k: engine_out[k] for k in ("routing", "routed_experts") if engine_out[k] is not None}}
    assert_main_rows_equal_plain_sglang(ours, plain, len(PROMPT), "sglang_r3.serving.engine.Engine")


def test_engine_returns_a_routed_experts_field_and_record_equal_to_our_servers(engine_out, nospec_server):
    """Our ``routed_experts`` field (our capture re-encoded) and record on both sides: the in-process contract is the
    server's; plain SGLang's own capturer is the oracle in the test above."""
    got = engine_out
    ref = greedy(nospec_server, 6, input_ids=PROMPT, return_routing=True, return_routed_experts=True)
    assert got["output_ids"] == ref["output_ids"]
    assert got["routing_error"] is None
    engine_rows = np.frombuffer(base64.b64decode(got["routed_experts"]), dtype=np.int32)
    server_rows = np.frombuffer(base64.b64decode(ref["meta_info"]["routed_experts"]), dtype=np.int32)
    np.testing.assert_array_equal(engine_rows, server_rows)
    # The role-tagged record rides along in meta_info["routing"].
    np.testing.assert_array_equal(RoutingRecord.from_wire(got["routing"]).experts, record_of(ref).experts)
