"""``fetch(handles)``: the RoutingRecords that handles point to, from any process connected to the fleet's Ray cluster.

A trainer rank (a Ray actor or task, or any driver that called ``ray.init(address=...)``) asks each
handle's record store directly, one call per store, all stores at once. The records come back
through Ray's object store -- the gateway and the fleet driver never see them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from sglang_r3.serving.fleet.handle import RecordHandle, RecordUnavailableError
from sglang_r3.core.record import RoutingRecord

_actors: Dict[Tuple[str, str], Any] = {}  # (namespace, store name) -> actor handle, per process


def store_actor(namespace: str, name: str):
    import ray

    key = (namespace, name)
    if key not in _actors:
        try:
            _actors[key] = ray.get_actor(name, namespace=namespace)
        except ValueError:
            raise RecordUnavailableError(
                "store_gone", f"record store {name!r} (namespace {namespace!r}) does not exist: its fleet stopped"
            ) from None
    return _actors[key]


def fetch(handles: Iterable[Any], release: bool = True) -> List[RoutingRecord]:
    """The records of ``handles`` (RecordHandle, handle dicts, meta_infos or whole outputs), in order.

    release: the stores free each record once it is returned (the default; a record is fetched once).
    Raises RecordUnavailableError naming every handle that cannot be resolved -- its engine
    incarnation died, it was already fetched or expired, or its store is gone -- and then releases
    nothing of that store.
    """
    import ray

    hs: Sequence[RecordHandle] = [RecordHandle.from_wire(h) for h in handles]
    by_store: Dict[Tuple[str, str], List[int]] = defaultdict(list)
    for i, h in enumerate(hs):
        by_store[(h.namespace, h.store)].append(i)
    calls = {key: store_actor(*key).take.remote([hs[i].to_wire() for i in idx], release)
             for key, idx in by_store.items()}
    out: List[Any] = [None] * len(hs)
    problems: List[str] = []
    codes = set()
    for key, ref in calls.items():
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            _actors.pop(key, None)
            problems.append(f"record store {key[1]!r} died: {e.__class__.__name__}")
            codes.add("store_gone")
            continue
        if "errors" in answer:
            for j, code, msg in answer["errors"]:
                problems.append(msg)
                codes.add(code)
            continue
        for j, rec in zip(by_store[key], answer["records"]):
            out[j] = rec
    if problems:
        code = codes.pop() if len(codes) == 1 else "several"
        shown = "; ".join(problems[:5]) + (f"; ... {len(problems) - 5} more" if len(problems) > 5 else "")
        raise RecordUnavailableError(code, f"{len(problems)} of {len(hs)} routing handles cannot be resolved: {shown}")
    return out
