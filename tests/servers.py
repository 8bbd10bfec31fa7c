"""Start and stop real sglang-r3 servers for tests (one process tree per server)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import httpx

from sglang_r3.serving.fleet.gateway import free_port, log_tail, stop_process_group
from tests import children

STARTUP_TIMEOUT_S = float(os.environ.get("SGLANG_R3_TEST_STARTUP_TIMEOUT", "600"))


class ChildProcess:
    """A process tree of its own (its own session, so stop() takes its children too), logging to a file."""

    proc: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    def spawn(self, cmd: List[str], log_prefix: str, env: Optional[Dict[str, str]] = None) -> None:
        fd, path = tempfile.mkstemp(prefix=log_prefix, suffix=".log")
        self.log_path = Path(path)
        log = os.fdopen(fd, "w")
        # Own session, reaped if the run is stopped, killed with this process (tests/children.py).
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
            time.sleep(2)
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout:.0f}s:\n{self.log_tail()}")
