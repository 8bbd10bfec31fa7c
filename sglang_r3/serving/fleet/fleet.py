"""``Fleet``: N engines on a Ray cluster, each with its record store, and SGLang's gateway in front.

The driver (this object) creates, per engine, a named record store and an engine actor on the same
node (the store is placed by node affinity right after the engine actor is placed), starts the
engines in parallel, then starts ``sglang-router`` on the driver's node with every engine URL. The
driver holds the actors, so they live exactly as long as the fleet: ``stop()`` (or the driver's exit)
ends engines, stores and gateway. An engine is one actor on one node holding ``num_gpus`` GPUs (its
tensor-parallel size); SGLang's own multi-node placement (``--use-ray``, RayEngine) is refused by our
launcher, because its scheduler actors would not get the capture patches (refusals/startup.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


from sglang_r3.serving.fleet.engine import EngineActor, EngineSpec
from sglang_r3.serving.fleet.gateway import Gateway
from sglang_r3.serving.fleet.handle import NAMESPACE
from sglang_r3.serving.fleet.fetch_records import fetch as _fetch
from sglang_r3.serving.fleet.store import RecordStore, StoreBounds


@dataclass
class FleetConfig:
    engines: int = 2
    engine_flags: List[str] = field(default_factory=list)  # launcher flags for every engine
    num_gpus: float = 0  # per engine (its tensor-parallel size on a GPU cluster)
    num_cpus: float = 1  # per engine, in Ray's accounting
    bounds: StoreBounds = field(default_factory=StoreBounds)
    name: str = ""  # unique fleet name (actor names); random when empty
    namespace: str = NAMESPACE
    gateway_port: int = 0  # 0: a free port
    gateway_policy: str = "round_robin"
    startup_timeout_s: float = 600.0
    health_interval_s: float = 2.0
    max_restarts: int = 5


class Fleet:
    def __init__(self, config: FleetConfig):
        self.config = config
        self.name = config.name or uuid.uuid4().hex[:8]
        self.stores: List[Any] = []
        self.engines: List[Any] = []
        self.engine_ids: List[str] = []
        self.urls: List[str] = []
        self.gateway: Optional[Gateway] = None

    def start(self) -> "Fleet":
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            raise RuntimeError("call ray.init() (or ray.init(address=...)) before Fleet.start()")
        c = self.config
        node_for = ray.remote(_node_id)  # a task with the engine's resources: which node has room for it
        here = ray.get_runtime_context().get_node_id()  # the gateway runs beside this driver
        try:
            for i in range(c.engines):
                eid = f"{self.name}-e{i}"
                store_name = f"r3-store-{eid}"
                # Store and engine pinned to the node Ray picks for the engine's resources; the store first
                # (the engine actor looks it up by name).
                node = ray.get(node_for.options(num_cpus=c.num_cpus, num_gpus=c.num_gpus).remote())
                store = ray.remote(RecordStore).options(
                    name=store_name, namespace=c.namespace, num_cpus=0, max_concurrency=1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
                ).remote(store_name, eid, c.bounds)
                ray.get(store.ping.remote())
                spec = EngineSpec(eid, store_name, c.namespace, list(c.engine_flags), c.startup_timeout_s,
                                  c.health_interval_s, max_restarts=c.max_restarts, gateway_node=here)
                engine = ray.remote(EngineActor).options(
                    name=f"r3-engine-{eid}", namespace=c.namespace, num_cpus=c.num_cpus, num_gpus=c.num_gpus,
                    max_concurrency=64, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
                ).remote(spec)
                self.stores.append(store)
                self.engines.append(engine)
                self.engine_ids.append(eid)
            self.urls = ray.get([e.start.remote() for e in self.engines])
            self.gateway = Gateway(self.urls, c.gateway_port, c.gateway_policy).start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def url(self) -> str:
        return self.gateway.url

    def engine_index(self, engine_id: str) -> int:
        return self.engine_ids.index(engine_id)

    def fetch(self, handles, release: bool = True):
        """Resolve handles here (the driver); trainer ranks call ``sglang_r3.serving.fleet.fetch`` themselves."""
        return _fetch(handles, release)

    def update_weights(self, model_path: str, weight_version: str, **options) -> List[Dict[str, Any]]:
        """SGLang's ``/update_weights_from_disk`` on every engine, with ``weight_version``.

        options: further UpdateWeightFromDiskReqInput fields (``abort_all_requests``, ``flush_cache``, ...).
        Records of requests that spanned the update carry ``mixed:old,new`` and the trainer refuses them.
        """
        import ray

        body = {"model_path": str(model_path), "weight_version": str(weight_version), **options}
        return ray.get([e.update_weights.remote(body) for e in self.engines])

    def info(self) -> List[Dict[str, Any]]:
        import ray

        return ray.get([e.info.remote() for e in self.engines])

    def store_stats(self) -> List[Dict[str, Any]]:
        import ray

        return ray.get([s.get_stats.remote() for s in self.stores])

    def kill_engine(self, i: int) -> int:
        """Crash engine ``i`` (SIGKILL its process group); the fleet restarts it. Returns the dead incarnation."""
        import ray

        return ray.get(self.engines[i].kill_engine.remote())

    def wait_engine(self, i: int, incarnation: int, timeout_s: float = 600) -> Dict[str, Any]:
        import ray

        return ray.get(self.engines[i].wait_incarnation.remote(incarnation, timeout_s))

    def stop(self) -> None:
        import ray

        if self.gateway is not None:
            self.gateway.stop()
        try:
            ray.get([e.stop.remote() for e in self.engines], timeout=120)
        except Exception:  # noqa: BLE001 -- kill below either way
            pass
        for a in self.engines + self.stores:
            ray.kill(a)
        self.engines, self.stores = [], []

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
