"""SGLang's gateway, ``sglang-router`` (a Rust binary from PyPI), as a subprocess.

Used by the fleet's driver and by the tests that put our server behind the real gateway.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import httpx

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# Server ports are chosen below the kernel's ephemeral range (where every outgoing connection takes its local
# port, so a port found free there can be taken before the server binds it) and below the range SGLang picks its
# own NCCL/gloo ports from (``get_free_port_below_ephemeral``: 22000-29999). That also keeps them under 55535:
# SGLang 0.5.15 derives a gRPC port as port + 10000 and refuses one above 65535.
_PORT_LOW, _PORT_HIGH = 10000, 21999
# With DP attention SGLang binds ports derived from the server's port (server_args.PortArgs.init_new, both
# releases): dist-init at port + 233 (ZMQ_TCP_PORT_DELTA), then 5-6 consecutive ports, plus one per DP rank on its
# Rust path. They must be free as well, or start-up waits 30 s and stops ("port_base ... is not available").
_DERIVED = range(233, 233 + 24)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # fails if any address holds the port (SGLang's TCP stores bind 0.0.0.0)
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free local port to serve on, with the ports SGLang derives from it free too."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    high = min(_PORT_HIGH, ephemeral_low - 1) - _DERIVED[-1]
    if high < _PORT_LOW:
        raise OSError(f"the kernel's ephemeral ports start at {ephemeral_low} (net.ipv4.ip_local_port_range): no room "
                      f"below them for a server port in {_PORT_LOW}-{_PORT_HIGH} and the ports SGLang derives from it")
    for port in random.sample(range(_PORT_LOW, high + 1), min(512, high + 1 - _PORT_LOW)):
        if _bindable(port) and all(_bindable(port + d) for d in _DERIVED):
            return port
    raise OSError(f"no free local port in {_PORT_LOW}-{high} with ports +{_DERIVED[0]}..+{_DERIVED[-1]} free")


class Gateway:
    """``sglang-router`` (SGLang's gateway) as a subprocess of the driver.

    Retries are off: a request whose engine died fails at the client instead of being silently run
    again elsewhere (the rollout driver decides whether to resend, and a resent request is a new
    sample with a new handle). Health checks every 2 s take a restarted engine back.
    """

    def __init__(self, worker_urls: Sequence[str], port: int = 0, policy: str = "round_robin"):
        self.worker_urls = list(worker_urls)
        self.port = port or free_port()
        self.prometheus_port = free_port()  # the router always opens one; the default 29000 collides
        self.policy = policy
        self.proc: Optional[subprocess.Popen] = None
        self.log_path: Optional[str] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120) -> "Gateway":
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(self.port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus_port),
               "--policy", self.policy, "--disable-retries",
               "--health-check-interval-secs", "2", "--health-failure-threshold", "1",
               "--health-success-threshold", "1", "--health-check-endpoint", "/health",
               "--worker-urls", *self.worker_urls]
        fd, self.log_path = tempfile.mkstemp(prefix=f"r3-gateway-{self.port}-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline, last = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/readiness", timeout=10)
                last = f"{r.status_code} {r.text[:200]}"
                if r.status_code == 200 and r.json().get("healthy_workers") == len(self.worker_urls):
                    return self
            except (httpx.HTTPError, ValueError) as e:
                last = repr(e)
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"sglang-router not ready after {timeout_s:.0f}s (last /readiness: {last}):\n{self.log_tail()}")

    def stop(self) -> None:
        stop_process_group(self.proc)

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)


def stop_process_group(proc: Optional[subprocess.Popen], timeout_s: float = 30) -> None:
    """SIGTERM the process's own session (it was started with start_new_session), SIGKILL if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def log_tail(path, n: int = 40) -> str:
    """The last n lines of a child's log file, colour codes removed (for error messages)."""
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        lines = _ANSI.sub("", f.read()).splitlines()
    return "\n".join(l[:400] for l in lines[-n:])
