"""Start and stop real sglang-r3 servers for tests (one process tree per server); plain SGLang's rows as the oracle."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import httpx
import numpy as np

from sglang_r3.serving.fleet.gateway import free_port, log_tail, stop_process_group
from tests.support import children

STARTUP_TIMEOUT_S = float(os.environ.get("SGLANG_R3_TEST_STARTUP_TIMEOUT", "600"))


class ChildProcess:
    """A process tree of its own (its own session, so stop() takes its children too), logging to a file."""

    proc: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    def spawn(self, cmd: List[str], log_prefix: str, env: Optional[Dict[str, str]] = None) -> None:
        fd, path = tempfile.mkstemp(prefix=log_prefix, suffix=".log")
        self.log_path = Path(path)
        log = os.fdopen(fd, "w")
        # Own session, reaped if the run is stopped, killed with this process (tests/support/children.py).
        self.proc = children.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        log.close()  # the child holds its own copy

    def stop(self) -> None:
        stop_process_group(self.proc)

    def log_tail(self, n: int = 60) -> str:
        return log_tail(self.log_path, n)


@dataclass
class ServerProcess(ChildProcess):
    args: List[str]
    env: Dict[str, str] = field(default_factory=dict)  # added to this process's environment
    port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        cmd = [sys.executable, "-m", "sglang_r3.launch_server", "--port", str(self.port), *self.args]
        self.spawn(cmd, f"sglang-r3-{self.port}-", self.env)
        return self

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # a refused connection costs nothing; a start-up waited on costs every test behind it
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout:.0f}s:\n{self.log_tail()}")


# -- plain SGLang's own capturer, the oracle of main rows (tests/conftest.py's plain_server) ---------------


def plain_rows(b64: str) -> np.ndarray:
    """SGLang's ``meta_info["routed_experts"]`` of the embedded model: base64 int32 ``[T-1, num_hidden_layers, topk]``."""
    from sglang_r3.dev.embedded import EMBEDDED_CONFIG

    flat = np.frombuffer(base64.b64decode(b64), dtype=np.int32)
    return flat.reshape(-1, EMBEDDED_CONFIG["num_hidden_layers"], EMBEDDED_CONFIG["num_experts_per_tok"])


def assert_main_rows_equal_plain_sglang(ours: dict, plain: dict, prompt_len: int, what: str = "") -> None:
    """``ours`` (a response of any launch path: ``output_ids`` and a ``meta_info`` with our record and / or our
    ``routed_experts``) against ``plain``, plain SGLang's response to the same greedy request: the same tokens; plain's
    rows at the MoE layers equal our record's main rows (each row's top-k sorted), zeros at the dense layers; and our
    ``routed_experts`` field is plain's, byte for byte."""
    from sglang_r3.core.record import RoutingRecord

    meta = ours["meta_info"]
    assert ours["output_ids"] == plain["output_ids"], what
    assert "routing_error" not in meta, (what, meta.get("routing_error"))
    assert "routing" in meta or "routed_experts" in meta, f"{what}: neither our record nor our field to compare"
    want = plain_rows(plain["meta_info"]["routed_experts"])
    assert want.shape[0] == prompt_len + len(plain["output_ids"]) - 1, (what, want.shape)
    if "routing" in meta:
        rec = RoutingRecord.from_wire(meta["routing"])
        assert rec.start == 0 and rec.num_tokens == want.shape[0], (what, rec.start, rec.num_tokens)
        moe = list(rec.layers)
        np.testing.assert_array_equal(np.sort(rec.experts.astype(np.int32), axis=-1), np.sort(want[:, moe], axis=-1),
                                      err_msg=f"{what}: our record's main rows against plain SGLang's capturer")
        dense = [i for i in range(want.shape[1]) if i not in moe]
        assert not want[:, dense].any(), f"{what}: plain SGLang's dense layers are not zeros"
    if "routed_experts" in meta:
        assert meta["routed_experts"] == plain["meta_info"]["routed_experts"], (
            f"{what}: our routed_experts field against plain SGLang's capturer")
