"""Records by reference: a finished record goes to this engine's record store before its response
leaves, and the response carries a handle -- or ``routing_error`` when the store refuses or cannot be
reached (fail closed). Ray is joined once, in a thread, on the first request that wants a handle.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Dict, Optional, Sequence, Tuple

from sglang_r3.core import settings
from sglang_r3.core.codes import STORE_ERROR_CODES
from sglang_r3.serving.fleet.handle import RecordHandle
from sglang_r3.core.record import RoutingRecord
from sglang_r3.serving.response import count_served, refuse, unavailable
from sglang_r3.core.settings import StoreSettings

logger = logging.getLogger(__name__)


def config() -> Optional[StoreSettings]:
    """This engine's store (set by its fleet engine actor), or None outside a fleet."""
    return settings.current().store


_store = None
_lock = threading.Lock()


def _connect(cfg: StoreSettings):
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


async def _put(cfg: StoreSettings, rid: str, record: RoutingRecord) -> Dict[str, Any]:
    from sglang_r3.serving.fleet.store import encode_record

    store = _store or await asyncio.to_thread(_connect, cfg)
    return await store.put.remote(cfg.incarnation, rid, encode_record(record))


def _error(meta: Dict[str, Any], code: str, message: str, rows: int) -> None:
    refuse(meta, unavailable(code, message, rows))


async def _store_one(meta: Dict[str, Any], rec: RoutingRecord) -> None:
    cfg = config()
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


async def store(kept: Sequence[Tuple[Dict[str, Any], RoutingRecord]]) -> None:
    """Store each ``(meta_info, record)`` that ``response.build`` kept; each ``meta_info`` gets its
    ``routing_ref`` or ``routing_error``."""
    if kept:  # a task per output costs more than the rest of a short response's routing work
        await asyncio.gather(*(_store_one(meta, rec) for meta, rec in kept))
