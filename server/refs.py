"""Records by reference: hand a finished record to this engine's record store, answer with a handle.

The engine's HTTP process (started by a fleet engine actor, ``sglang_r3.fleet``) learns from its
environment which store is its own, which engine and incarnation it is, and how to reach the Ray
cluster. On the first request that wants a reference it connects to Ray (once, in a thread, so the
event loop keeps serving) and finds the store by name. ``attach_routing`` leaves a ``PendingRef`` in
``meta_info.routing_ref``; ``settle`` (awaited before the response is sent) stores the record and puts
the handle in its place -- so a client never holds a handle whose record is not in the store yet. When
the store refuses (full, or this incarnation is no longer live) or cannot be reached, the output gets
``routing_error`` instead and no handle: fail closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional

from sglang_r3.codes import STORE_ERROR_CODES
from sglang_r3.record import RoutingRecord
from sglang_r3.response import count_served, meta_of, outputs, refuse, unavailable

logger = logging.getLogger(__name__)

from sglang_r3.fleet.handle import (  # set by the fleet's engine actor on the launcher's environment
    ENGINE_ENV,
    INCARNATION_ENV,
    NAMESPACE_ENV,
    RAY_ADDRESS_ENV,
    STORE_ENV,
    RecordHandle,
)


@dataclass(frozen=True)
class RefConfig:
    store: str
    namespace: str
    engine: str
    incarnation: int
    ray_address: str


def config() -> Optional[RefConfig]:
    store = os.environ.get(STORE_ENV)
    if not store:
        return None
    return RefConfig(store=store, namespace=os.environ.get(NAMESPACE_ENV, "sglang_r3"),
                     engine=os.environ.get(ENGINE_ENV, store), incarnation=int(os.environ.get(INCARNATION_ENV, "0")),
                     ray_address=os.environ.get(RAY_ADDRESS_ENV, "auto"))


def configured() -> bool:
    return config() is not None


@dataclass
class PendingRef:
    """A finished record waiting to be stored; replaced by its handle (or a routing_error) in settle()."""

    record: RoutingRecord


_store = None
_lock = threading.Lock()


def _connect(cfg: RefConfig):
    """The store actor, connecting to Ray first (once per process)."""
    global _store
    with _lock:
        if _store is None:
            import ray

            if not ray.is_initialized():
                # log_to_driver off: this process is a server, not a job whose workers' logs we want.
                ray.init(address=cfg.ray_address, namespace=cfg.namespace, log_to_driver=False,
                         configure_logging=False)
            _store = ray.get_actor(cfg.store, namespace=cfg.namespace)
        return _store


async def _put(cfg: RefConfig, rid: str, record: RoutingRecord) -> Dict[str, Any]:
    from sglang_r3.fleet.store import encode_record

    store = _store or await asyncio.to_thread(_connect, cfg)
    return await store.put.remote(cfg.incarnation, rid, encode_record(record))


def _error(meta: Dict[str, Any], code: str, message: str, rows: int) -> None:
    refuse(meta, unavailable(code, message, rows))


async def settle_one(out: Any) -> None:
    meta = meta_of(out)
    pending = meta.get("routing_ref") if meta is not None else None
    if not isinstance(pending, PendingRef):
        return
    del meta["routing_ref"]
    rec, cfg = pending.record, config()
    if cfg is None:  # parse_routing_options refuses ref on such an engine; kept for safety
        _error(meta, "store_unavailable", "this engine has no record store", rec.num_tokens)
        return
    rid = str(meta.get("id"))
    try:
        answer = await _put(cfg, rid, rec)
    except Exception as e:  # noqa: BLE001 -- any failure to store means: no handle
        logger.warning("record store %s unreachable: %r", cfg.store, e)
        _error(meta, "store_unavailable", f"record store {cfg.store} of engine {cfg.engine} is unreachable: "
               f"{type(e).__name__}: {e}"[:500], rec.num_tokens)
        return
    if not answer.get("ok"):
        code = answer.get("code")
        if code not in STORE_ERROR_CODES:  # a store of another version: still no handle, said plainly
            code, answer = "store_unavailable", {"message": f"record store {cfg.store} refused the record: {answer!r}"[:500]}
        _error(meta, code, answer.get("message", ""), rec.num_tokens)
        return
    meta["routing_ref"] = RecordHandle(
        store=cfg.store, namespace=cfg.namespace, engine=cfg.engine, incarnation=cfg.incarnation,
        rid=rid, start=rec.start, num_tokens=rec.num_tokens,
        weight_version=rec.weight_version, tokens_digest=rec.tokens_digest,
    ).to_wire()
    count_served("ref", rec.experts.nbytes)


async def settle(ret: Any) -> Any:
    """Store every pending record of a /generate output (or list of outputs); returns ``ret``."""
    items = [item for item in outputs(ret) if _pending(item)]
    if items:  # a task per output costs more than the rest of a short response's routing work
        await asyncio.gather(*(settle_one(item) for item in items))
    return ret


def _pending(out: Any) -> bool:
    meta = meta_of(out)
    return meta is not None and isinstance(meta.get("routing_ref"), PendingRef)
