"""One fleet engine: a Ray actor that owns a ``python -m sglang_r3.launch_server`` subprocess.

It holds the engine's resources in Ray's accounting, starts the launcher with its record store's settings
(``settings.StoreSettings``), and restarts it as a new incarnation (old handles then fail) when it exits or
stops answering ``/health``; the launcher's process group dies with the actor.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import httpx

from sglang_r3.core import settings
from sglang_r3.serving.fleet.gateway import free_port

logger = logging.getLogger(__name__)

PROBE = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0},
         "return_routing": {"ref": True}}


@dataclass(frozen=True)
class EngineSpec:
    engine_id: str
    store_name: str
    namespace: str
    flags: List[str] = field(default_factory=list)  # launcher flags (everything but --port / --host)
    startup_timeout_s: float = 600.0
    health_interval_s: float = 2.0
    health_failures: int = 3  # consecutive failed /health checks that count as dead
    max_restarts: int = 5
    # Ray node id of the gateway's host: an engine on that node is reached over loopback.
    gateway_node: Optional[str] = None


def _die_with_parent() -> None:
    # Runs in the child before exec: own session (stop() kills the group), SIGKILL if the actor dies.
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _engine_host(gateway_node: Optional[str]) -> str:
    """Where the gateway (and the driver beside it) reaches this engine: loopback on its own node,
    else the address Ray registered for this node."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    if node_id == gateway_node:
        return "127.0.0.1"
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


class EngineActor:
    """Run as an async Ray actor (``ray.remote(EngineActor)``)."""

    def __init__(self, spec: EngineSpec):
        import ray

        self.spec = spec
        self.host = _engine_host(spec.gateway_node)
        self.port = free_port()
        self.gcs_address = ray.get_runtime_context().gcs_address
        self.store = ray.get_actor(spec.store_name, namespace=spec.namespace)
        self.proc: Optional[subprocess.Popen] = None
        self.incarnation = 0
        self.restarts = 0
        self.state = "new"
        self.last_exit: Optional[str] = None
        self.weights: Optional[Dict[str, Any]] = None  # last successful update_weights, re-applied on restart
        self.log_path: Optional[str] = None
        self._supervisor: Optional[asyncio.Task] = None
        self._stopping = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> str:
        await self._launch()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        return self.url

    async def _launch(self) -> None:
        self.incarnation = await self.store.new_incarnation.remote(self.last_exit or "restarted")
        flags = list(self.spec.flags)
        if self.weights and self.weights.get("weight_version"):
            # A restarted engine must not claim the launch version: it serves the last update's weights
            # (same path) under the last update's version, or records would carry a wrong version.
            flags = _set_flag(flags, "--weight-version", self.weights["weight_version"])
            if any(f == "--model-path" or f.startswith("--model-path=") for f in flags):
                flags = _set_flag(flags, "--model-path", self.weights["model_path"])
        # For the launcher's HTTP process (server/refs.py): this actor's process exists for this engine only.
        settings.publish(settings.StoreSettings(
            store=self.spec.store_name, namespace=self.spec.namespace, engine=self.spec.engine_id,
            incarnation=self.incarnation, ray_address=self.gcs_address).environ())
        env = dict(os.environ)
        fd, self.log_path = tempfile.mkstemp(prefix=f"r3-{self.spec.engine_id}-i{self.incarnation}-", suffix=".log")
        cmd = [sys.executable, "-m", "sglang_r3.launch_server", "--host", "0.0.0.0", "--port", str(self.port), *flags]
        with os.fdopen(fd, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        self.state = "starting"
        await self._wait_ready()
        if self.weights and not any(f == "--model-path" or f.startswith("--model-path=") for f in flags):
            await self._post_weights(self.weights)  # embedded model: the update path is re-applied
        self.state = "ready"

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        async with httpx.AsyncClient(timeout=30) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine {self.spec.engine_id} exited with {self.proc.returncode} during "
                                       f"start-up:\n{self.log_tail()}")
                try:
                    r = await c.post(self.url + "/generate", json=PROBE, timeout=120)
                    if r.status_code == 200:
                        ref = r.json()["meta_info"].get("routing_ref")
                        if ref is None:
                            raise RuntimeError(f"engine {self.spec.engine_id} answered the probe without a handle: "
                                               f"{r.text[:500]}")
                        answer = await self.store.take.remote([ref], True)  # the store path works end to end
                        if "errors" in answer:
                            raise RuntimeError(f"engine {self.spec.engine_id}: its probe's handle does not resolve: "
                                               f"{answer['errors']}")
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(1)
        self._kill()
        raise TimeoutError(f"engine {self.spec.engine_id} not ready after {self.spec.startup_timeout_s:.0f}s:\n"
                           f"{self.log_tail()}")

    async def _supervise(self) -> None:
        failures = 0
        async with httpx.AsyncClient(timeout=10) as c:
            while not self._stopping:
                await asyncio.sleep(self.spec.health_interval_s)
                if self._stopping or self.state != "ready":
                    continue
                if self.proc.poll() is not None:
                    why = f"process exited with {self.proc.returncode}"
                else:
                    try:
                        ok = (await c.get(self.url + "/health")).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    failures = 0 if ok else failures + 1
                    if failures < self.spec.health_failures:
                        continue
                    why = f"/health failed {failures} times"
                failures = 0
                await self._restart(why)

    async def _restart(self, why: str) -> None:
        logger.warning("engine %s incarnation %d died (%s); restarting", self.spec.engine_id, self.incarnation, why)
        self.last_exit = why
        self.state = "restarting"
        await self.store.end_incarnation.remote(self.incarnation, why)  # its handles fail from now on
        self._kill()
        if self.restarts >= self.spec.max_restarts:
            self.state = f"failed: {why} (after {self.restarts} restarts)"
            return
        self.restarts += 1
        try:
            await self._launch()
        except Exception as e:  # noqa: BLE001 -- the next supervision round sees it not ready
            self.state = f"failed: restart {self.restarts}: {e}"[:2000]

    def _kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    async def stop(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                for _ in range(100):
                    if self.proc.poll() is not None:
                        break
                    await asyncio.sleep(0.1)
            except ProcessLookupError:
                pass
        self._kill()
        self.state = "stopped"

    # -- operations ------------------------------------------------------------------------------

    async def kill_engine(self) -> int:
        """SIGKILL the engine's whole process group (a crash, for tests); returns the dead incarnation."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        return self.incarnation

    async def wait_incarnation(self, at_least: int, timeout_s: float) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.incarnation >= at_least and self.state == "ready":
                return self.info()
            if self.state.startswith("failed"):
                break
            await asyncio.sleep(0.5)
        raise TimeoutError(f"engine {self.spec.engine_id} not ready in incarnation >= {at_least}: {self.info()}")

    async def update_weights(self, body: Dict[str, Any]) -> Dict[str, Any]:
        out = await self._post_weights(body)
        self.weights = dict(body)
        return out

    async def _post_weights(self, body: Dict[str, Any]) -> Dict[str, Any]:
        async with httpx.AsyncClient(timeout=600) as c:
            r = await c.post(self.url + "/update_weights_from_disk", json=body)
        out = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"message": r.text}
        if r.status_code != 200 or not out.get("success"):
            raise RuntimeError(f"engine {self.spec.engine_id}: update_weights_from_disk failed "
                               f"({r.status_code}): {out.get('message', r.text)[:1000]}")
        return out

    def info(self) -> Dict[str, Any]:
        return {"engine": self.spec.engine_id, "url": self.url, "incarnation": self.incarnation, "state": self.state,
                "restarts": self.restarts, "pid": None if self.proc is None else self.proc.pid,
                "last_exit": self.last_exit, "log": self.log_path}

    def log_tail(self, n: int = 60) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])


def _set_flag(flags: List[str], flag: str, value: str) -> List[str]:
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        if f == flag:
            skip = True
            continue
        if f.startswith(flag + "="):
            continue
        out.append(f)
    return out + [flag, value]
