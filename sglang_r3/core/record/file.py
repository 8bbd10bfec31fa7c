"""Routing records on disk: the ``.r3`` form (a msgpack stream: a header with the layout, then one wire record
each, so a file may be larger than memory), and JSON read too (wire records or ``/generate`` bodies as a
server answered them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Optional, Tuple, Union

import msgpack

from sglang_r3.core.layout import ModelLayout
from sglang_r3.core.record import RecordError, RoutingRecord, bits_for

FORMAT = "sglang_r3.records"
VERSION = 1

PathLike = Union[str, Path]


def save_records(path: PathLike, records: Iterable[RoutingRecord], layout: Optional[ModelLayout] = None) -> int:
    """Write records (and their layout, if given) to ``path``; returns how many were written."""
    bits = bits_for(layout.num_experts) if layout is not None and layout.num_experts else None
    n = 0
    with open(path, "wb") as f:
        f.write(msgpack.packb({"format": FORMAT, "version": VERSION,
                               "layout": layout.to_dict() if layout is not None else None}, use_bin_type=True))
        for r in records:
            if layout is not None and r.layout != layout.fingerprint:
                raise RecordError(f"record {n} belongs to layout {r.layout}, not {layout.fingerprint}")
            f.write(msgpack.packb(r.to_wire(binary=True, pack_bits=bits), use_bin_type=True))
            n += 1
    return n


def open_records(path: PathLike) -> Tuple[Optional[ModelLayout], Iterator[RoutingRecord]]:
    """(layout or None, records one at a time) of a file in either form above."""
    path = Path(path)
    with open(path, "rb") as f:
        first = f.read(1)
    if first in (b"{", b"[") or path.suffix == ".json":
        return _from_json(json.loads(path.read_text()), path)
    return _from_msgpack(path)


def load_records(path: PathLike) -> Tuple[Optional[ModelLayout], List[RoutingRecord]]:
    layout, it = open_records(path)
    return layout, list(it)


def _from_msgpack(path: Path) -> Tuple[Optional[ModelLayout], Iterator[RoutingRecord]]:
    f = open(path, "rb")
    unpacker = msgpack.Unpacker(f, raw=False)
    try:
        header = next(unpacker)
    except StopIteration:
        f.close()
        raise RecordError(f"{path}: empty file") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        f.close()
        raise RecordError(f"{path}: not a {FORMAT} file (no header)")
    if header.get("version") != VERSION:
        f.close()
        raise RecordError(f"{path}: {FORMAT} version {header.get('version')!r}, this reader knows {VERSION}")
    layout = ModelLayout.from_dict(header["layout"]) if header.get("layout") else None

    def records() -> Iterator[RoutingRecord]:
        with f:
            yield from _decoded(unpacker, path)

    return layout, records()


def _decoded(wires: Iterable[Any], path: Path) -> Iterator[RoutingRecord]:
    """Wire records to records, a bad one named by the file and its place in it."""
    for i, d in enumerate(wires):
        try:
            yield RoutingRecord.from_wire(d)
        except RecordError as e:
            raise RecordError(f"{path}: record {i}: {e}") from None


def _from_json(doc: Any, path: Path) -> Tuple[Optional[ModelLayout], Iterator[RoutingRecord]]:
    layout = None
    if isinstance(doc, dict) and "records" in doc:
        layout = ModelLayout.from_dict(doc["layout"]) if doc.get("layout") else None
        items = doc["records"]
    else:
        items = doc if isinstance(doc, list) else [doc]
    wires = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("meta_info"), dict):
            if "routing" not in item["meta_info"]:
                raise RecordError(f"{path}: output {i} carries no meta_info.routing "
                                  f"({item['meta_info'].get('routing_error') or 'was return_routing sent?'})")
            item = item["meta_info"]["routing"]
        wires.append(item)

    return layout, _decoded(wires, path)
