"""The manifest against a source tree: each entry of a release resolved in a ``Source`` and checked as
``manifest.check`` checks it with real imports, each difference in its words; and a release's verdict. Part of
``python -m sglang_r3.tools.releases``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from sglang_r3.seam.manifest import Touch, entries
from sglang_r3.seam.versions import SERVED, nearest
from sglang_r3.tools.releases.source import (
    _HOPS, _PER_HOST, _SET_AT_IMPORT, Cls, Ext, Fn, Mod, Obj, Source, Unresolved, Val,
)
from sglang_r3.tools.releases.wheels import metadata

Diff = Tuple[str, str]  # (target, why), in the words of manifest.check


def _resolve(src: Source, target: str) -> Obj:
    """As ``seam.resolve.resolve``: packages descended while the next part is a submodule, then attributes;
    an unresolvable name raises Unresolved with the error the import would raise."""
    parts = target.split(".")
    if not src.exists(parts[0]):
        raise Unresolved(f"ModuleNotFoundError: No module named '{parts[0]}'")
    obj: Obj = Mod(parts[0])
    i = 1
    while i < len(parts) and isinstance(obj, Mod) and src.is_package(obj.name) and src.exists(f"{obj.name}.{parts[i]}"):
        obj, i = Mod(f"{obj.name}.{parts[i]}"), i + 1
    for p in parts[i:]:
        nxt = src.getattr(obj, p)
        if nxt is None:
            raise Unresolved(f"AttributeError: {_owner_words(src, obj)} has no attribute '{p}'")
        obj = nxt
    return obj


def _owner_words(src: Source, obj: Obj) -> str:
    if isinstance(obj, Mod):
        return f"module '{obj.name}'"
    if isinstance(obj, Cls):
        return f"type object '{obj.node.name}'"
    if isinstance(obj, Val):
        cls = src.class_of(obj)
        return f"'{cls.node.name if cls else 'object'}' object"
    return "'function' object"


def missing_attrs(src: Source, obj: Obj, attrs: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(attributes an instance of ``obj`` would lack, attributes that cannot be told statically)."""
    if isinstance(obj, Mod):
        return [a for a in attrs if src.lookup(obj.name, a) is None], []
    if isinstance(obj, Val):
        obj = src.class_of(obj) or obj
    if not isinstance(obj, Cls):
        return [], list(attrs)  # a value of a type the sources do not spell, or a name outside sglang
    have = src.attrs_of(obj)
    found = {a: src.member(obj, a) for a in attrs if a not in have}
    return [a for a, m in found.items() if m is None], [a for a, m in found.items() if _set_at_import(m)]


def check_source(src: Source, release: str, entries_: Optional[Sequence[Touch]] = None
                 ) -> Tuple[List[Diff], List[Diff]]:
    """``manifest.check(release=release)`` done on a source tree: (differences, what could not be read
    statically), each a list of (target, why). ``entries_``: these entries instead of the release's."""
    diffs: List[Diff] = []
    unread: List[Diff] = []
    for e in entries(release) if entries_ is None else entries_:
        if e.kind not in ("route", "op"):
            _check_entry(src, e, release, diffs, unread)
    return diffs, unread


def _check_entry(src: Source, e: Touch, release: str, diffs: List[Diff], unread: List[Diff]) -> None:
    if e.kind in ("adds", "overrides"):
        owner, _, name = e.target.rpartition(".")
        try:
            cls = _resolve(src, owner)
        except Unresolved as exc:
            diffs.append((e.target, str(exc)))
            return
        if not isinstance(cls, Cls):
            unread.append((e.target, "its class is not written in SGLang's sources"))
            return
        inherited = src.member(cls, name)
        if e.kind == "adds" and _set_at_import(inherited):
            unread.append((e.target, f"not read statically ({_what(cls)})"))
        elif (inherited if e.kind == "adds" else src._own(cls, name, _HOPS)) is not None:
            diffs.append((e.target, "SGLang now defines it: sglang-r3's CPU stand-in would replace it"))
        elif e.kind == "overrides" and inherited is None:
            diffs.append((e.target, "no base class defines it any more: nothing calls what we would override"))
        return
    try:
        obj = _resolve(src, e.target)
    except Unresolved as exc:
        diffs.append((e.target, str(exc)))
        return
    if e.kind == "replaces":  # launched as kernel[grid]: a function under @triton.jit (or autotune)
        decos = [ast.unparse(d) for d in getattr(getattr(obj, "node", None), "decorator_list", [])]
        if not any("jit" in d or "autotune" in d for d in decos):
            diffs.append((e.target, "no longer a Triton kernel (we replace it where it is launched as kernel[grid])"))
            return
    want = e.signature_on(release)
    if want is not None:
        have = src.signature(obj)
        if have is None and not isinstance(obj, Fn):
            unread.append((e.target, f"signature not read statically ({_what(obj)})"))
        elif have != want:
            diffs.append((e.target, f"signature changed: written against {want}, installed {have}"))
    if e.attrs:
        gone, not_read = missing_attrs(src, obj, e.attrs)
        if gone:
            diffs.append((e.target, f"no attribute {', '.join(gone)} (read by sglang-r3)"))
        if not_read:
            unread.append((e.target, f"attributes {', '.join(not_read)} not read statically ({_what(obj)})"))


def _set_at_import(obj: Optional[Obj]) -> bool:
    return isinstance(obj, Ext) and obj.name == _SET_AT_IMPORT


def _what(obj: Obj) -> str:
    if isinstance(obj, Ext):
        if obj.name == _PER_HOST:
            return "bound again under an if at import: the host picks which"
        return "set at import" if obj.name == _SET_AT_IMPORT else f"from {obj.name}"
    if isinstance(obj, Cls):
        return "the class gains names at import"
    return "a value whose type the sources do not spell"


# -- a release: its pins and its verdict ----------------------------------------------------------------


@dataclass
class Release:
    version: str
    nearest: str  # the served release whose manifest entries were checked (itself when served)
    served: bool
    requires_python: str
    pins: Dict[str, str]  # torch / transformers / sglang-kernel as the wheel's Requires-Dist pins them
    checked: int  # manifest entries checked
    differences: List[Diff] = field(default_factory=list)
    unread: List[Diff] = field(default_factory=list)  # targets (or parts) the sources cannot tell

    @property
    def verdict(self) -> str:
        n = len({t for t, _ in self.differences})
        if self.served:
            return "served (proven by served runs)" if not n else f"refused: {n} differ"
        head = f"refused at start-up: SGLang {self.version} is not a served release; "
        if n:
            return head + f"against {self.nearest}: {n} targets differ"
        return head + f"matches {self.nearest}'s targets but no served run proved it"


def check_release(version: str, package_dir: Path) -> Release:
    near = version if version in SERVED else nearest(version)
    src = Source(package_dir)
    python, pins = metadata(package_dir, version)
    diffs, unread = check_source(src, near)
    checked = sum(1 for e in entries(near) if e.kind not in ("route", "op"))
    return Release(version, near, version in SERVED, python, pins, checked, diffs, unread)
