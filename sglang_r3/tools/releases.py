"""``python -m sglang_r3.tools.releases [--releases A,B] [--write docs/compatibility.md] [--source DIR]``: the
manifest checked against each SGLang release of the window, read from the release's published wheel (downloaded,
never installed or imported).

Start-up refuses a release outside ``SERVED`` by checking the manifest against the installed SGLang; this does the
same check for every release in between without installing one, so the table says what each would be refused for
and what it pins. Each target is resolved in the release's own sources with ``ast`` as ``seam.resolve`` would
import it (submodules, re-exports, module aliases, classes and their sglang bases, class bodies, dataclass fields,
``self.<attr> =``), its signature built as ``manifest.signature_of`` prints one, and each difference worded as
``manifest.check`` words it (tests/test_releases.py holds the two to the same answers on the installed SGLang).
What a module does to a class at import with names no line spells (``setattr(C, name, ...)``) cannot be read so: it
is listed apart, as not read, never as a difference. Neither can a default that is an expression or a value from
outside sglang, nor anything inherited from outside sglang but NamedTuple's API. Results go to
docs/compatibility.json; ``--render`` rebuilds docs/compatibility.md from it with no network.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from sglang_r3.serving.seam.manifest import Touch, entries
from sglang_r3.serving.seam.versions import SERVED, V0_5_15, V0_5_23, nearest

ROOT = Path(__file__).resolve().parents[2]  # the checkout: pyproject.toml and docs/
FIRST, LAST = V0_5_15, V0_5_23  # the window: the served releases and every release published between them
# slime is not on PyPI: the project reads THUDM/slime at this commit (its Dockerfile's SGLang 0.5.15.post1;
# tests/trainer/slime_reference.py's stand-ins are written from it).
SLIME_COMMIT = "624b824"
PINNED = ("torch", "transformers", "sglang-kernel")
COMMAND = "python -m sglang_r3.tools.releases --write docs/compatibility.md"

Diff = Tuple[str, str]  # (target, why), in the words of manifest.check


# -- a release's sources, read with ast only ------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Mod:
    name: str


@dataclass(frozen=True, eq=False)
class Cls:
    mod: str
    node: ast.ClassDef
    scope: Optional["Cls"] = None  # the class it is written in: its body's names come before the module's


@dataclass(frozen=True, eq=False)
class Fn:
    mod: str
    node: Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, None]  # None: a dataclass's generated __init__
    bound: str = "function"  # "function" (as written), "class" (a classmethod: cls dropped), "property"
    owner: Optional["Cls"] = None  # the dataclass whose __init__ it is


@dataclass(frozen=True, eq=False)
class Val:
    mod: str
    node: Optional[ast.expr]  # what was assigned (None: a field without a value, e.g. a NamedTuple's)


@dataclass(frozen=True, eq=False)
class Ext:
    name: str  # outside sglang (torch, typing, ...), or set at import: exists, shape unknown


Obj = Union[Mod, Cls, Fn, Val, Ext]
_HOPS = 12  # re-exports and aliases followed before giving up (a cycle)
_NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_field_defaults", "_make", "count", "index"}
_ENUM_BASES = ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag")


class Unresolved(Exception):
    """What resolve() raises at runtime, in describe_error's words."""


class Source:
    """An unpacked ``sglang`` package: dotted names to module files, parsed once each."""

    def __init__(self, package_dir: Path):
        self.root = Path(package_dir).parent
        self._trees: Dict[str, Optional[ast.Module]] = {}
        self._bindings: Dict[str, dict] = {}
        self._extended: Dict[str, Tuple[Dict[str, set], set]] = {}

    # modules
    def _path(self, mod: str) -> Path:
        return self.root.joinpath(*mod.split("."))

    def is_package(self, mod: str) -> bool:
        return self._path(mod).is_dir()  # with or without __init__.py (a namespace package imports too)

    def exists(self, mod: str) -> bool:
        return mod.split(".")[0] == "sglang" and (self.is_package(mod) or self._path(mod).with_suffix(".py").is_file())

    def tree(self, mod: str) -> Optional[ast.Module]:
        if mod not in self._trees:
            p = self._path(mod)
            p = p / "__init__.py" if p.is_dir() else p.with_suffix(".py")
            self._trees[mod] = ast.parse(p.read_text(encoding="utf-8"), str(p)) if p.is_file() else None
        return self._trees[mod]

    def bindings(self, mod: str) -> dict:
        """name -> the statement that binds it at module level. An unconditional binding replaces an earlier
        one; a conditional one (if / try / with) only fills a name not yet bound (the first branch: the import
        that works, not its fallback). A name bound unconditionally and then again under an ``if`` is the
        host's to pick (``if is_cpu(): f = f_cpu``): it is not read statically."""
        if mod in self._bindings:
            return self._bindings[mod]
        out: dict = {}
        stars: List[str] = []

        unconditional: set = set()

        def bind(name, what, conditional):
            if not conditional:
                out[name] = what
                unconditional.add(name)
            elif conditional == "if" and name in unconditional:
                out[name] = (_PER_HOST,)
            elif name not in out:
                out[name] = what

        def walk(body, conditional):
            for s in body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    bind(s.name, s, conditional)
                elif isinstance(s, ast.Assign):
                    for t in s.targets:
                        for name in _names(t):
                            if isinstance(out.get(name), ast.ClassDef) and _mentions(s.value, name):
                                continue  # X = rebuild(X) (msgspec.defstruct(..., vars(X))): still X's body
                            bind(name, s.value if isinstance(t, ast.Name) else ("unpack", s.value), conditional)
                elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None:
                    bind(s.target.id, s.value, conditional)
                elif isinstance(s, ast.ImportFrom):
                    base = _absolute(mod, s, self.is_package(mod))
                    for a in s.names:
                        if a.name == "*":
                            stars.append(base)
                        else:
                            bind(a.asname or a.name, ("from", base, a.name), conditional)
                elif isinstance(s, ast.Import):
                    for a in s.names:  # "import a.b" binds a; "import a.b as c" binds c to a.b
                        bind(a.asname or a.name.split(".")[0], ("import", a.name if a.asname else a.name.split(".")[0]),
                             conditional)
                elif isinstance(s, ast.If):
                    walk(s.body, "if")
                    walk(s.orelse, "if")
                elif isinstance(s, ast.Try):
                    walk(s.body, True)
                    walk(s.orelse, True)
                    for h in s.handlers:
                        walk(h.body, True)
                    walk(s.finalbody, True)
                elif isinstance(s, ast.With):
                    walk(s.body, True)

        tree = self.tree(mod)
        walk(tree.body if tree else [], False)
        out["*"] = stars
        self._bindings[mod] = out
        return out

    def extended(self, mod: str) -> Tuple[Dict[str, set], set]:
        """What the module does to its classes after defining them: ({class: names assigned as X.name = ... or
        setattr(X, "name", ...)}, {classes given names that cannot be read: setattr(X, variable, ...),
        X.__annotations__ = ...}). Anywhere in the module, functions it runs at import included."""
        if mod in self._extended:
            return self._extended[mod]
        classes = {n for n, b in self.bindings(mod).items() if isinstance(b, ast.ClassDef)}
        added: Dict[str, set] = {}
        unknown: set = set()
        for n in ast.walk(self.tree(mod) or ast.Module(body=[], type_ignores=[])):
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "setattr" and len(n.args) == 3:
                owner, name = n.args[0], n.args[1]
                if isinstance(owner, ast.Name) and owner.id in classes:
                    if isinstance(name, ast.Constant) and isinstance(name.value, str):
                        added.setdefault(owner.id, set()).add(name.value)
                    else:
                        unknown.add(owner.id)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in classes):
                        continue
                    if t.attr == "__annotations__" and n.value is not None:
                        # Fields composed from other classes (0.5.20's ServerArgs from its namespaces): the
                        # annotations of every class the expression reaches through module-level names.
                        fields = self._annotations_reached(mod, n.value)
                        if fields:
                            added.setdefault(t.value.id, set()).update(fields)
                        else:
                            unknown.add(t.value.id)
                    elif t.attr == "__dict__":
                        unknown.add(t.value.id)
                    else:
                        added.setdefault(t.value.id, set()).add(t.attr)
        self._extended[mod] = (added, unknown)
        return added, unknown

    def _annotations_reached(self, mod: str, node: ast.expr, depth: int = 4) -> set:
        out: set = set()
        for n in ast.walk(node):
            if not isinstance(n, ast.Name) or depth <= 0:
                continue
            what = self.bindings(mod).get(n.id)
            if isinstance(what, ast.ClassDef) or (isinstance(what, tuple) and what[0] == "from"):
                cls = self._bound(mod, what, _HOPS)
                if isinstance(cls, Cls):
                    out |= {s.target.id for c in self.mro(cls) if isinstance(c, Cls) for s in _class_body(c.node)
                            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            elif isinstance(what, ast.expr):
                out |= self._annotations_reached(mod, what, depth - 1)
            elif isinstance(what, tuple) and what[0] == "unpack":
                out |= self._annotations_reached(mod, what[1], depth - 1)
        return out

    # names
    def lookup(self, mod: str, name: str, hops: int = _HOPS) -> Optional[Obj]:
        """getattr(module, name), or None where it would raise AttributeError."""
        if hops <= 0:
            return None
        b = self.bindings(mod)
        what = b.get(name)
        if what is not None or name in b:
            return self._bound(mod, what, hops - 1)
        for star in b["*"]:
            if not star.startswith("sglang"):
                return Ext(f"{star}.{name}")  # cannot tell what a star import from outside brings
            found = self.lookup(star, name, hops - 1)
            if found is not None:
                return found
        if "__getattr__" in b:  # a lazy re-export (PEP 562): the name -> module table it reads
            target = _lazy_table(self.tree(mod)).get(name)
            if target is not None:
                return self.lookup(target, name, hops - 1) if target.startswith("sglang") else Ext(f"{target}.{name}")
        if self.is_package(mod) and self.exists(f"{mod}.{name}"):  # a submodule imported elsewhere
            return Mod(f"{mod}.{name}")
        return None

    def _bound(self, mod: str, what, hops: int) -> Optional[Obj]:
        if isinstance(what, ast.ClassDef):
            return Cls(mod, what)
        if isinstance(what, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Fn(mod, what)
        if isinstance(what, tuple) and what[0] == "from":
            _, base, name = what
            if not base.startswith("sglang"):
                return Ext(f"{base}.{name}")
            if not self.exists(base):
                return None
            found = self.lookup(base, name, hops)
            if found is None and self.exists(f"{base}.{name}"):
                return Mod(f"{base}.{name}")
            return found
        if isinstance(what, tuple) and what[0] == _PER_HOST:
            return Ext(_PER_HOST)
        if isinstance(what, tuple) and what[0] == "import":
            return Mod(what[1]) if what[1].startswith("sglang") else Ext(what[1])
        if isinstance(what, tuple):  # one name of a, b = ...: its value is not spelled out
            return Val(mod, None)
        return self.value(mod, what, hops)

    def value(self, mod: str, node: Optional[ast.expr], hops: int = _HOPS) -> Optional[Obj]:
        """What a module-level expression is: an alias is what it names, a lambda a function."""
        if isinstance(node, (ast.Name, ast.Attribute)) and hops > 0:
            return self.expr(mod, node, hops - 1) or Val(mod, node)
        if isinstance(node, ast.Lambda):
            return Fn(mod, node)
        return Val(mod, node)

    def expr(self, mod: str, node: ast.expr, hops: int = _HOPS) -> Optional[Obj]:
        """A name, dotted name or subscript (Generic[T]) in module scope."""
        if isinstance(node, ast.Name):
            found = self.lookup(mod, node.id, hops)
            return found if found is not None else (Ext(node.id) if node.id in _BUILTINS else None)
        if isinstance(node, ast.Attribute):
            owner = self.expr(mod, node.value, hops)
            return None if owner is None else self.getattr(owner, node.attr, hops)
        if isinstance(node, ast.Subscript):
            return self.expr(mod, node.value, hops)
        if isinstance(node, ast.Call):
            return self.expr(mod, node.func, hops)  # a base made by a call (with_metaclass): its class
        return None

    def getattr(self, obj: Obj, name: str, hops: int = _HOPS) -> Optional[Obj]:
        if isinstance(obj, Mod):
            return self.lookup(obj.name, name, hops)
        if isinstance(obj, Cls):
            return self.member(obj, name, hops)
        if isinstance(obj, Val):
            cls = self.class_of(obj)
            return Ext(name) if cls is None else self.member(cls, name, hops)
        if isinstance(obj, Ext):
            return Ext(f"{obj.name}.{name}")
        return None  # a function's attributes: none we read

    def class_of(self, val: Val) -> Optional[Cls]:
        """The class of a module-level instance (``envs = Envs()``)."""
        if isinstance(val.node, ast.Call):
            cls = self.expr(val.mod, val.node.func)
            return cls if isinstance(cls, Cls) else None
        return None

    # classes
    def bases(self, cls: Cls) -> List[Obj]:
        return [b for b in (self._base(cls, e) for e in cls.node.bases) if b is not None]

    def _base(self, cls: Cls, node: ast.expr) -> Optional[Obj]:
        # A nested class's base written as a name of the class around it (``class S(State)`` in MambaPool's
        # body) is that class's; any other name is the module's.
        if isinstance(node, ast.Name) and cls.scope is not None:
            own = self._own(cls.scope, node.id, _HOPS)
            if own is not None:
                return own
        return self.expr(cls.mod, node)

    def mro(self, cls: Cls) -> List[Obj]:
        """The class and its bases, depth first, each kept at its last place (as C3 orders simple hierarchies);
        a base outside sglang ends its branch."""
        order: List[Obj] = []

        def visit(c: Obj, depth: int):
            order.append(c)
            if isinstance(c, Cls) and depth < 30:
                for b in self.bases(c):
                    visit(b, depth + 1)

        visit(cls, 0)
        seen: List[Obj] = []
        for c in reversed(order):
            if not any(_same(c, s) for s in seen):
                seen.append(c)
        return list(reversed(seen))

    def is_kind(self, cls: Cls, names: Sequence[str]) -> bool:
        """Whether a base outside sglang (typing.NamedTuple, enum.Enum, msgspec.Struct...) is one of ``names``."""
        return any(isinstance(b, Ext) and b.name.rsplit(".", 1)[-1] in names for b in self.mro(cls))

    def member(self, cls: Cls, name: str, hops: int = _HOPS) -> Optional[Obj]:
        """getattr(cls, name): the class body, then its bases; None where it would raise AttributeError (an
        Ext where the module gives the class names that cannot be read)."""
        for c in self.mro(cls):
            if isinstance(c, Ext):
                if c.name.rsplit(".", 1)[-1] == "NamedTuple" and name in _NAMEDTUPLE_API:
                    return Ext(f"{c.name}.{name}")
                continue
            found = self._own(c, name, hops)
            if found is not None:
                return found
        return Ext(_SET_AT_IMPORT) if self.is_open(cls) else None

    def is_open(self, cls: Cls) -> bool:
        """Whether the module of a class of the MRO gives it names no source line spells (setattr with a
        variable name, a rebuilt __annotations__): what it lacks cannot be told statically."""
        return any(isinstance(c, Cls) and c.node.name in self.extended(c.mod)[1] for c in self.mro(cls))

    def _own(self, cls: Cls, name: str, hops: int) -> Optional[Obj]:
        found: Optional[Obj] = None
        if name in self.extended(cls.mod)[0].get(cls.node.name, ()):
            found = Val(cls.mod, None)  # X.name = ... after the class
        opts = _dataclass_options(cls.node)
        if name == "__init__" and opts is not None and opts.get("init", True) is not False:
            found = Fn(cls.mod, None, owner=cls)  # replaced below if the class writes its own
        struct_like = self.is_kind(cls, ("NamedTuple", "Struct"))  # a field is a descriptor on the class
        for s in _class_body(cls.node):
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name:
                decos = [ast.unparse(d) for d in s.decorator_list]
                if any(d.endswith((".setter", ".deleter")) or d.endswith("overload") for d in decos):
                    continue
                bound = ("class" if "classmethod" in decos else
                         "property" if any(d.endswith("property") for d in decos) else "function")
                found = Fn(cls.mod, s, bound)
            elif isinstance(s, ast.ClassDef) and s.name == name:
                found = Cls(cls.mod, s, scope=cls)
            elif isinstance(s, ast.Assign) and any(name in _names(t) for t in s.targets):
                found = self._class_value(cls, s.value, hops)
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == name:
                if s.value is None:
                    found = Val(cls.mod, None) if struct_like else found
                elif opts is not None and _is_field_call(s.value) and _kwarg(s.value, "default") is None:
                    found = None  # dataclass deletes a field() without default from the class
                else:
                    found = self._class_value(cls, s.value, hops)
        return found

    def _class_value(self, cls: Cls, node: ast.expr, hops: int) -> Obj:
        # An alias inside the class body (``__call__ = forward``) or a wrapped function (staticmethod(f)).
        if isinstance(node, ast.Name):
            own = self._own(cls, node.id, hops - 1) if hops > 0 else None
            return own or self.value(cls.mod, node, hops)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("staticmethod", "classmethod") and node.args:
            inner = self._class_value(cls, node.args[0], hops)
            if isinstance(inner, Fn) and ast.unparse(node.func) == "classmethod":
                return Fn(inner.mod, inner.node, "class")
            return inner
        return self.value(cls.mod, node, hops)

    def attrs_of(self, cls: Cls) -> set:
        """What an instance may have beyond getattr(cls, a): fields and annotations of each class of the MRO,
        and every ``self.<a> = ...`` / ``self.<a>: T = ...`` in their bodies (as ``manifest.missing_attrs``)."""
        out = set()
        for c in self.mro(cls):
            if not isinstance(c, Cls):
                continue
            for s in _class_body(c.node):
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                    out.add(s.target.id)
            for n in ast.walk(c.node):
                targets = (n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign)
                           else [])
                for t in targets:
                    for a in ast.walk(t):
                        if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self":
                            out.add(a.attr)
        return out

    # signatures
    def signature(self, obj: Obj) -> Optional[str]:
        """``manifest.signature_of`` of what ``obj`` is at runtime; None where it cannot be told statically."""
        if isinstance(obj, Fn):
            if obj.node is None:
                return "(" + ", ".join(["self", *self._fields(obj.owner)]) + ")"
            if obj.bound == "property":
                return None
            params = self._params(obj.mod, obj.node.args)
            return "(" + ", ".join(params[1:] if obj.bound == "class" else params) + ")"
        if isinstance(obj, Cls):
            params = self.init_params(obj)
            return None if params is None else "(" + ", ".join(params[1:]) + ")"
        return None

    def init_params(self, cls: Cls) -> Optional[List[str]]:
        """The parameters calling the class takes, self first: the nearest __init__ / __new__ written in sglang,
        else a dataclass's or NamedTuple's generated one."""
        for c in self.mro(cls):
            if isinstance(c, Ext):
                continue
            own = {s.name: s for s in _class_body(c.node) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for special in ("__new__", "__init__"):
                if special in own:
                    return self._params(c.mod, own[special].args)
            if _dataclass_options(c.node) is not None or self.is_kind(c, ("NamedTuple",)):
                return ["self", *self._fields(c)]
        return None

    def _fields(self, cls: Cls) -> List[str]:
        """A dataclass's (or NamedTuple's) generated __init__ parameters: fields of its dataclass bases first,
        ClassVar and init=False left out, kw_only ones last."""
        fields: Dict[str, Tuple[bool, Optional[str]]] = {}  # name -> (kw_only, default repr)
        for c in reversed(self.mro(cls)):
            if not isinstance(c, Cls):
                continue
            opts = _dataclass_options(c.node)
            if opts is None and not (c is cls and self.is_kind(c, ("NamedTuple",))):
                continue
            kw_only = bool(opts and opts.get("kw_only"))
            for s in _class_body(c.node):
                if not (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)):
                    continue
                ann = ast.unparse(s.annotation)
                if ann.endswith("KW_ONLY"):
                    kw_only = True
                    continue
                if re.match(r"(typing\.)?ClassVar\b", ann):
                    continue
                default, kw = None, kw_only
                if s.value is not None and _is_field_call(s.value):
                    if _literal(_kwarg(s.value, "init")) is False:
                        fields.pop(s.target.id, None)
                        continue
                    kw = bool(_literal(_kwarg(s.value, "kw_only"))) or kw_only
                    if _kwarg(s.value, "default") is not None:
                        default = self.default_repr(c.mod, _kwarg(s.value, "default"))
                    elif _kwarg(s.value, "default_factory") is not None:
                        default = "<factory>"
                elif s.value is not None:
                    default = self.default_repr(c.mod, s.value)
                fields[s.target.id] = (kw, default)
        ordered = [n for n, (kw, _) in fields.items() if not kw] + [n for n, (kw, _) in fields.items() if kw]
        return [("kw:" if fields[n][0] else "") + n + ("" if fields[n][1] is None else "=" + fields[n][1])
                for n in ordered]

    def _params(self, mod: str, a: ast.arguments) -> List[str]:
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        out = [p.arg + ("" if d is None else "=" + self.default_repr(mod, d)) for p, d in zip(positional, defaults)]
        if a.vararg:
            out.append("*" + a.vararg.arg)
        out += ["kw:" + p.arg + ("" if d is None else "=" + self.default_repr(mod, d))
                for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        if a.kwarg:
            out.append("**" + a.kwarg.arg)
        return out

    def default_repr(self, mod: str, node: ast.expr) -> str:
        """repr() of a default as inspect shows it: a literal, a module constant, an enum member."""
        value = _literal(node, missing=_MISSING)
        if value is not _MISSING:
            return repr(value)
        if isinstance(node, ast.Attribute):
            owner = self.expr(mod, node.value)
            if isinstance(owner, Cls) and self.is_kind(owner, _ENUM_BASES):
                member = _enum_value(owner.node, node.attr)
                if member is not _MISSING:
                    return f"<{owner.node.name}.{node.attr}: {member!r}>"
        if isinstance(node, (ast.Name, ast.Attribute)):
            obj = self.expr(mod, node)
            if isinstance(obj, Cls):
                return f"<class '{obj.mod}.{obj.node.name}'>"
            if isinstance(obj, Val) and obj.node is not None:
                value = _literal(obj.node, missing=_MISSING)
                if value is not _MISSING:
                    return repr(value)
        return ast.unparse(node)  # a call or an expression: as written (inspect would show its value)


_MISSING = object()
_SET_AT_IMPORT = "<set at import>"
_PER_HOST = "<picked at import by the host>"
_BUILTINS = set(dir(builtins))


def _names(target: ast.expr) -> List[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    return []


def _mentions(node: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _same(a: Obj, b: Obj) -> bool:
    if isinstance(a, Ext) and isinstance(b, Ext):
        return a.name == b.name
    return isinstance(a, Cls) and isinstance(b, Cls) and a.node is b.node


def _absolute(mod: str, s: ast.ImportFrom, is_package: bool) -> str:
    if not s.level:
        return s.module or ""
    parts = mod.split(".") if is_package else mod.split(".")[:-1]
    parts = parts[: len(parts) - (s.level - 1)]
    return ".".join(parts + ([s.module] if s.module else []))


def _class_body(node: ast.ClassDef) -> List[ast.stmt]:
    """The class body's statements, an ``if`` / ``try`` inside it flattened (first branch first)."""
    out: List[ast.stmt] = []
    for s in node.body:
        if isinstance(s, ast.If):
            out += s.body + s.orelse
        elif isinstance(s, ast.Try):
            out += s.body + [x for h in s.handlers for x in h.body] + s.orelse + s.finalbody
        else:
            out.append(s)
    return out


def _literal(node: Optional[ast.expr], missing=None):
    if node is None:
        return missing
    try:
        return ast.literal_eval(_float_calls(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return missing


class _FloatCalls(ast.NodeTransformer):
    """``float("inf")`` / ``float("-inf")`` / ``float("nan")`` as constants (inspect shows ``inf``)."""

    def visit_Call(self, node: ast.Call):
        if (isinstance(node.func, ast.Name) and node.func.id == "float" and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            try:
                return ast.copy_location(ast.Constant(float(node.args[0].value)), node)
            except ValueError:
                return node
        return self.generic_visit(node)


def _float_calls(node: ast.expr) -> ast.expr:
    return _FloatCalls().visit(copy.deepcopy(node))


def _kwarg(call: ast.Call, name: str) -> Optional[ast.expr]:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_field_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) in ("field", "dataclasses.field")


def _dataclass_options(node: ast.ClassDef) -> Optional[dict]:
    """The options of a ``@dataclass(...)`` class (dataclasses' or pydantic's), None for another class."""
    for d in node.decorator_list:
        func = d.func if isinstance(d, ast.Call) else d
        if ast.unparse(func).split(".")[-1] == "dataclass":
            return {k.arg: _literal(k.value) for k in d.keywords} if isinstance(d, ast.Call) else {}
    return None


def _enum_value(node: ast.ClassDef, member: str):
    """An enum member's value: its literal, or what ``auto()`` counts to (1, 2, ... for Enum and IntEnum)."""
    last = 0
    for s in _class_body(node):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            if isinstance(s.value, ast.Call) and ast.unparse(s.value.func).endswith("auto"):
                value = last + 1
            else:
                value = _literal(s.value, missing=_MISSING)
            if isinstance(value, int):
                last = value
            if s.targets[0].id == member:
                return value
    return _MISSING


def _lazy_table(tree: Optional[ast.Module]) -> Dict[str, str]:
    """A module-level ``{name: "module"}`` dict a PEP 562 ``__getattr__`` imports from."""
    out: Dict[str, str] = {}
    for s in tree.body if tree else []:
        value = s.value if isinstance(s, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict):
            table = _literal(value)
            if isinstance(table, dict) and all(isinstance(v, str) for v in table.values()):
                out.update({k: v for k, v in table.items() if isinstance(k, str)})
    return out


# -- the manifest against a source tree ---------------------------------------------------------------


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


# -- releases: the window, their wheels, their pins -----------------------------------------------------


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


def window() -> List[str]:
    """The releases of sglang on the package index from FIRST to LAST inclusive, oldest first."""
    from packaging.version import Version

    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang"], capture_output=True, text=True,
                       check=True)
    line = next(x for x in r.stdout.splitlines() if x.startswith("Available versions:"))
    found = [Version(v.strip()) for v in line.split(":", 1)[1].split(",")]
    return [str(v) for v in sorted(found) if Version(FIRST) <= v <= Version(LAST)]


def fetch(version: str, cache: Path) -> Path:
    """The ``sglang`` package directory of the release's wheel, downloaded once and unpacked (sources and
    metadata only) under ``cache``; nothing is installed."""
    where = cache / version
    pkg = where / "src" / "sglang"
    if (where / "src" / ".complete").exists():
        return pkg
    wheels = list(where.glob("sglang-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        f"sglang=={version}", "-d", str(where)], check=True)
        wheels = list(where.glob("sglang-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(where / "src", [n for n in z.namelist() if n.endswith(".py") or n.endswith(".dist-info/METADATA")])
    (where / "src" / ".complete").touch()
    return pkg


def metadata(package_dir: Path, version: str) -> Tuple[str, Dict[str, str]]:
    """(Requires-Python, pins of torch / transformers / sglang-kernel) from the dist-info beside the package."""
    meta = package_dir.parent / f"sglang-{version}.dist-info" / "METADATA"
    if not meta.is_file():
        return "?", {p: "?" for p in PINNED}
    msg = Parser().parsestr(meta.read_text(encoding="utf-8"))
    pins = {}
    for req in msg.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue  # an optional extra's pins are not what the release runs on
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?", spec)
        name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        name = "sglang-kernel" if name == "sgl-kernel" else name  # the kernel package's earlier name
        if name in PINNED:
            pins[name] = m.group(2).strip() or "any"
    return msg.get("Requires-Python", "any"), {p: pins.get(p, "none") for p in PINNED}


def release_of(package_dir: Path) -> str:
    """The release an unpacked sglang package is: its dist-info's (installed or unpacked from a wheel), else its
    version.py's (read, not imported)."""
    infos = list(package_dir.parent.glob("sglang-*.dist-info"))
    if len(infos) == 1:
        return infos[0].name[len("sglang-"):-len(".dist-info")]
    text = (package_dir / "version.py").read_text()
    return re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text).group(1)


def check_release(version: str, package_dir: Path) -> Release:
    near = version if version in SERVED else nearest(version)
    src = Source(package_dir)
    python, pins = metadata(package_dir, version)
    diffs, unread = check_source(src, near)
    checked = sum(1 for e in entries(near) if e.kind not in ("route", "op"))
    return Release(version, near, version in SERVED, python, pins, checked, diffs, unread)


# -- the table --------------------------------------------------------------------------------------------


def stack() -> Dict[str, str]:
    """What the rest of the project is tested with, read from the checkout."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    megatron = next((r.split("==", 1)[1].split(";")[0].strip() for r in project["optional-dependencies"]["test"]
                     if re.match(r"megatron-core\s*==", r)), "?")
    return {"megatron-core": megatron, "slime": SLIME_COMMIT, "python": project["requires-python"]}


def _short(target: str) -> str:
    return target.removeprefix("sglang.srt.")


def render(releases: Sequence[Release], other: Optional[Dict[str, str]] = None) -> str:
    other = stack() if other is None else other
    lines = [
        "# SGLang compatibility",
        "",
        f"<!-- Generated by `{COMMAND}` (from docs/compatibility.json: `python -m sglang_r3.tools.releases "
        "--render docs/compatibility.json --write docs/compatibility.md`). Do not edit by hand. -->",
        "",
        f"sglang-r3 serves SGLang {' and '.join(SERVED)}; start-up refuses every other release, naming the "
        "manifest targets (`sglang_r3/serving/seam/manifest.py`) that differ from the nearest served release's. "
        "For every release published from the first to the last, the wheel on PyPI was downloaded (not installed), "
        "its pins read from its metadata and the manifest entries of the nearest served release checked against its "
        "sources statically, in the words `python -m sglang_r3.serving.seam.manifest` uses.",
        "",
        "| SGLang | verdict | Python | torch | transformers | sglang-kernel | differences vs nearest |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in releases:
        names = list(dict.fromkeys(_short(t) for t, _ in r.differences))  # a target may differ twice
        diff = "none" if not names else f"{len(names)}: " + ", ".join(f"`{n}`" for n in names[:3]) + (
            f", +{len(names) - 3} more" if len(names) > 3 else "")
        lines.append(f"| {r.version} | {r.verdict} | {r.requires_python} | {r.pins['torch']} | "
                     f"{r.pins['transformers']} | {r.pins['sglang-kernel']} | {diff} |")
    lines += [
        "",
        f"The rest of the stack the project is tested with: megatron-core {other['megatron-core']} (`pyproject.toml`, "
        f"the `test` extra), slime at commit {other['slime']} (THUDM/slime, whose image runs SGLang {V0_5_15}), "
        f"Python {other['python']} (`requires-python`; serving also needs what its SGLang release requires, "
        "the Python column).",
        "",
        "## Differences by release",
    ]
    for r in releases:
        lines += ["", f"### SGLang {r.version} (against {r.nearest}'s {r.checked} targets)", ""]
        lines += [f"- `{t}`: {why}" for t, why in r.differences] or ["- none"]
        if r.unread:
            lines += ["", "Not read statically (only a runtime check, on an installed release, reads them):", ""]
            lines += [f"- `{t}`: {why}" for t, why in r.unread]
    return "\n".join(lines) + "\n"


def to_json(releases: Sequence[Release]) -> str:
    return json.dumps({"generated_by": COMMAND, "releases": [asdict(r) for r in releases]}, indent=1) + "\n"


def from_json(text: str) -> List[Release]:
    rows = json.loads(text)["releases"]
    return [Release(**{**r, "differences": [tuple(d) for d in r["differences"]],
                        "unread": [tuple(d) for d in r["unread"]]}) for r in rows]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_r3.tools.releases", description=__doc__.splitlines()[0])
    ap.add_argument("--releases", help="comma-separated SGLang releases (default: every one from "
                                       f"{FIRST} to {LAST} on the package index)")
    ap.add_argument("--source", type=Path, help="check this sglang package directory (e.g. the installed one) "
                                                "instead of downloading; --releases names its release (one)")
    ap.add_argument("--render", type=Path, metavar="JSON", help="render the table from these saved results")
    ap.add_argument("--write", type=Path, help="write the markdown here (and, unless --render, the results to "
                                               "the same path with .json)")
    args = ap.parse_args(argv)

    if args.render:
        releases = from_json(args.render.read_text())
    elif args.source:
        version = args.releases or release_of(args.source)
        if "," in version:
            ap.error("--source checks one release")
        releases = [check_release(version, args.source)]
    else:
        from sglang_r3.core.paths import cache_root

        versions = args.releases.split(",") if args.releases else window()
        cache = cache_root() / "releases"
        releases = []
        for v in versions:
            print(f"SGLang {v} ...", file=sys.stderr)
            releases.append(check_release(v, fetch(v, cache)))
    text = render(releases)
    if args.write:
        args.write.write_text(text)
        if not args.render:
            args.write.with_suffix(".json").write_text(to_json(releases))
    else:
        print(text, end="")
    return 1 if any(r.served and r.differences for r in releases) else 0


if __name__ == "__main__":
    raise SystemExit(main())
