"""In-process ``sglang.Engine`` (verl's path: TokenizerManager.generate_request) keeps upstream's contract."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_r3.core.record import RoutingRecord
from tests.routing_http import greedy, record_of

pytestmark = pytest.mark.release  # also run on SGLang 0.5.15.post1 (.ci/release-env)

PROMPT = list(b"in-process engine")


def test_engine_returns_upstream_int32_rows_equal_to_the_servers(nospec_server):
    script = Path(__file__).with_name("engine_check.py")
    run = subprocess.run([sys.executable, str(script), json.dumps(PROMPT)], capture_output=True, text=True,
                         timeout=900, cwd=script.parent.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    ref = greedy(nospec_server, 6, input_ids=PROMPT, return_routing=True, return_routed_experts=True)
    assert got["output_ids"] == ref["output_ids"]
    assert got["routing_error"] is None
    engine_rows = np.frombuffer(base64.b64decode(got["routed_experts"]), dtype=np.int32)
    server_rows = np.frombuffer(base64.b64decode(ref["meta_info"]["routed_experts"]), dtype=np.int32)
    np.testing.assert_array_equal(engine_rows, server_rows)
    # The role-tagged record rides along in meta_info["routing"].
    np.testing.assert_array_equal(RoutingRecord.from_wire(got["routing"]).experts, record_of(ref).experts)
