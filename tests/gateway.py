"""Start and stop SGLang's real gateway (``sglang-router``, a Rust binary) in front of test servers."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import httpx

from tests.servers import ChildProcess, free_port

READY_TIMEOUT_S = 120.0


@dataclass
class GatewayProcess(ChildProcess):
    worker_urls: List[str]
    port: int = field(default_factory=free_port)
    # The router always opens a Prometheus listener (default port 29000): two gateways, or a second
    # test session, would collide on it and the router panics at start.
    prometheus_port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "GatewayProcess":
        cmd = [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus_port),
            "--worker-urls", *self.worker_urls,
        ]
        self.spawn(cmd, f"sglang-router-{self.port}-")
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> "GatewayProcess":
        """Until the router reports every worker healthy (its /health answers before that)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/readiness", timeout=10)
                last = f"{r.status_code} {r.text[:200]}"
                if r.status_code == 200 and r.json().get("healthy_workers") == len(self.worker_urls):
                    return self
            except (httpx.HTTPError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"sglang-router not ready after {timeout:.0f}s (last /readiness: {last}):\n{self.log_tail()}")
