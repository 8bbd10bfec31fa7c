"""``python -m sglang_r3.serving.fleet --engines 2 [--address ray://...] [-- launcher flags ...]``

Starts the engines and the gateway, prints the gateway URL, and serves until interrupted.
Engines run with ``--r3-default-routing ref`` unless the launcher flags say otherwise, so every
/generate through the gateway answers with a handle in ``meta_info.routing_ref``.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from sglang_r3.serving.fleet.fleet import Fleet, FleetConfig
from sglang_r3.serving.fleet.store import StoreBounds


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m sglang_r3.serving.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--address", default=None, help="Ray cluster address; default: start a local one")
    p.add_argument("--port", type=int, default=0, help="gateway port (default: a free one)")
    p.add_argument("--num-gpus", type=float, default=None, help="GPUs per engine (default: 1 if the cluster has GPUs)")
    p.add_argument("--num-cpus", type=float, default=1, help="CPUs per engine in Ray's accounting")
    p.add_argument("--store-max-records", type=int, default=StoreBounds.max_records)
    p.add_argument("--store-max-bytes", type=int, default=StoreBounds.max_bytes)
    p.add_argument("--store-ttl", type=float, default=StoreBounds.ttl_s, help="seconds an unfetched record is kept")
    p.add_argument("engine_flags", nargs=argparse.REMAINDER, help="after --: flags for every engine's launcher")
    return p.parse_args(argv)


def main(argv=None) -> None:
    import ray

    a = parse(argv)
    flags = [f for f in a.engine_flags if f != "--"]
    if not any(f.startswith("--r3-default-routing") for f in flags):
        flags += ["--r3-default-routing", "ref"]  # the gateway drops per-request routing options
    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(num_cpus=max(os.cpu_count() or 1, a.engines * int(a.num_cpus) + 1), include_dashboard=False)
    gpus = a.num_gpus if a.num_gpus is not None else (1 if ray.cluster_resources().get("GPU", 0) else 0)
    cfg = FleetConfig(engines=a.engines, engine_flags=flags, num_gpus=gpus, num_cpus=a.num_cpus, gateway_port=a.port,
                      bounds=StoreBounds(a.store_max_records, a.store_max_bytes, a.store_ttl))
    fleet = Fleet(cfg).start()
    print(f"gateway: {fleet.url}", flush=True)
    for e in fleet.info():
        print(f"engine {e['engine']}: {e['url']} (log {e['log']})", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()
        ray.shutdown()


if __name__ == "__main__":
    main()
